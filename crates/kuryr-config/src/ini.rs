//! Raw oslo.config-style INI layer: parse one file, merge several, look values up.
//!
//! Semantics follow `oslo_config.iniparser`:
//! - `[section]` headers; section names are kept as written (`DEFAULT` is special only
//!   for the fallback lookup, see [`Ini::lookup`]).
//! - `key = value` or `key: value`; surrounding whitespace and one pair of matching
//!   quotes (`"…"` / `'…'`) are stripped from the value. `-` in keys is normalised to `_`
//!   like oslo's option destination names.
//! - Lines starting with `#` or `;` are comments. There are no inline comments: a `#`
//!   after a value is part of the value, exactly as upstream.
//! - An indented line continues the previous value; the parts are joined with `\n`
//!   (list and dict values are split on `,` afterwards, so multi-line lists work).
//! - Repeating a key inside one file or across files: the last one wins.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The section every other section falls back to.
pub const DEFAULT_SECTION: &str = "DEFAULT";

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A line in a config file (or in a string given to [`Ini::parse`]).
    File { source: Arc<str>, line: usize },
    /// An environment variable override.
    Env { var: String },
    /// Set programmatically through [`Ini::set`].
    Api,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { source, line } => write!(f, "{source}:{line}"),
            Origin::Env { var } => write!(f, "environment variable {var}"),
            Origin::Api => f.write_str("set by the program"),
        }
    }
}

/// One raw value with its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IniValue {
    pub value: String,
    pub origin: Origin,
}

/// A syntax error in an INI text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}:{line}: {message}")]
pub struct IniSyntaxError {
    pub source_name: String,
    pub line: usize,
    pub message: String,
}

/// Parsed sections, each a map of option name to raw value. Sections keep the order in
/// which they were first seen (deployments are ranked by declaration order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ini {
    sections: Vec<(String, BTreeMap<String, IniValue>)>,
}

impl Ini {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `text`; `source_name` (usually the file path) is used in origins and errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, IniSyntaxError> {
        let source: Arc<str> = Arc::from(source_name);
        let err = |line: usize, message: String| IniSyntaxError {
            source_name: source_name.to_owned(),
            line,
            message,
        };
        let mut ini = Ini::new();
        let mut section: Option<String> = None;
        // (section, key) of the value an indented line would continue.
        let mut last: Option<(String, String)> = None;

        for (idx, raw_line) in text.lines().enumerate() {
            let lineno = idx + 1;
            // A UTF-8 BOM at the start of the file is not part of the first line.
            let raw_line = if idx == 0 {
                raw_line.trim_start_matches('\u{feff}')
            } else {
                raw_line
            };
            let trimmed = raw_line.trim();
            if trimmed.is_empty() {
                // Like oslo's iniparser, a blank line ends a multi-line value.
                last = None;
                continue;
            }
            if trimmed.starts_with('#') || trimmed.starts_with(';') {
                continue;
            }
            if raw_line.starts_with([' ', '\t']) {
                if let Some((sec, key)) = &last
                    && let Some(v) = ini.section_mut(sec).get_mut(key)
                {
                    v.value.push('\n');
                    v.value.push_str(strip_quotes(trimmed));
                    continue;
                }
                return Err(err(lineno, "indented line with no value to continue".into()));
            }
            if let Some(rest) = trimmed.strip_prefix('[') {
                let Some(name) = rest.strip_suffix(']') else {
                    return Err(err(lineno, format!("unterminated section header {trimmed:?}")));
                };
                let name = name.trim();
                if name.is_empty() {
                    return Err(err(lineno, "empty section name".into()));
                }
                ini.section_mut(name);
                section = Some(name.to_owned());
                last = None;
                continue;
            }
            let Some(pos) = trimmed.find(['=', ':']) else {
                return Err(err(lineno, format!("expected \"key = value\", got {trimmed:?}")));
            };
            let key = normalize_key(&trimmed[..pos]);
            if key.is_empty() {
                return Err(err(lineno, "empty option name".into()));
            }
            let Some(sec) = section.clone() else {
                return Err(err(
                    lineno,
                    format!("option {key:?} appears before any [section] header"),
                ));
            };
            let value = strip_quotes(trimmed[pos + 1..].trim()).to_owned();
            let origin = Origin::File {
                source: source.clone(),
                line: lineno,
            };
            ini.section_mut(&sec)
                .insert(key.clone(), IniValue { value, origin });
            last = Some((sec, key));
        }
        Ok(ini)
    }

    /// Overlays `other` onto `self`: every value in `other` replaces the one in `self`.
    /// This is how several `--config-file`s combine (later files win).
    pub fn merge(&mut self, other: Ini) {
        for (name, values) in other.sections {
            self.section_mut(&name).extend(values);
        }
    }

    /// Sets (or replaces) one value.
    pub fn set(&mut self, section: &str, key: &str, value: impl Into<String>, origin: Origin) {
        self.section_mut(section).insert(
            normalize_key(key),
            IniValue {
                value: value.into(),
                origin,
            },
        );
    }

    /// The value written in exactly this section, without fallback.
    pub fn get(&self, section: &str, key: &str) -> Option<&IniValue> {
        self.section(section)?.get(key)
    }

    /// The value in `section`, falling back to `[DEFAULT]` when the section does not set it.
    pub fn lookup(&self, section: &str, key: &str) -> Option<&IniValue> {
        self.get(section, key).or_else(|| self.get(DEFAULT_SECTION, key))
    }

    /// Whether the section header (or any value in it) was seen.
    pub fn has_section(&self, section: &str) -> bool {
        self.section(section).is_some()
    }

    /// Section names in the order they were first seen.
    pub fn section_names(&self) -> impl Iterator<Item = &str> {
        self.sections.iter().map(|(name, _)| name.as_str())
    }

    /// The options of one section (without fallback), sorted by name.
    pub fn options(&self, section: &str) -> impl Iterator<Item = (&str, &IniValue)> {
        self.section(section)
            .into_iter()
            .flat_map(|s| s.iter().map(|(k, v)| (k.as_str(), v)))
    }

    fn section(&self, name: &str) -> Option<&BTreeMap<String, IniValue>> {
        self.sections.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    fn section_mut(&mut self, name: &str) -> &mut BTreeMap<String, IniValue> {
        let idx = match self.sections.iter().position(|(n, _)| n == name) {
            Some(idx) => idx,
            None => {
                self.sections.push((name.to_owned(), BTreeMap::new()));
                self.sections.len() - 1
            }
        };
        &mut self.sections[idx].1
    }
}

fn normalize_key(key: &str) -> String {
    key.trim().replace('-', "_")
}

/// oslo's iniparser drops one pair of matching surrounding quotes.
fn strip_quotes(value: &str) -> &str {
    for q in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
            return &value[1..value.len() - 1];
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sections_comments_quotes_and_continuations() {
        let text = "# comment\n[DEFAULT]\ndebug = True\n; other comment\n[kubernetes]\napi_root: \"http://k8s:6443\"\nenabled_handlers = vif,\n    kuryrport,\n\tnamespace\nport-debug = yes # not a comment\n";
        let ini = Ini::parse(text, "t.conf").expect("valid ini");
        assert_eq!(
            ini.get("DEFAULT", "debug").map(|v| v.value.as_str()),
            Some("True")
        );
        assert_eq!(
            ini.get("kubernetes", "api_root").map(|v| v.value.as_str()),
            Some("http://k8s:6443")
        );
        assert_eq!(
            ini.get("kubernetes", "enabled_handlers")
                .map(|v| v.value.as_str()),
            Some("vif,\nkuryrport,\nnamespace")
        );
        assert_eq!(
            ini.get("kubernetes", "port_debug").map(|v| v.value.as_str()),
            Some("yes # not a comment")
        );
        let origin = &ini.get("kubernetes", "api_root").expect("set").origin;
        assert_eq!(origin.to_string(), "t.conf:6");
    }

    #[test]
    fn lookup_falls_back_to_default_and_merge_overrides() {
        let mut a = Ini::parse("[DEFAULT]\nx = 1\n[s]\ny = 2\n", "a").expect("valid");
        assert_eq!(a.lookup("s", "x").map(|v| v.value.as_str()), Some("1"));
        assert_eq!(a.lookup("other", "x").map(|v| v.value.as_str()), Some("1"));
        assert!(a.get("s", "x").is_none());
        let b = Ini::parse("[s]\ny = 3\nz = 4\n", "b").expect("valid");
        a.merge(b);
        assert_eq!(a.get("s", "y").map(|v| v.value.as_str()), Some("3"));
        assert_eq!(a.get("s", "z").map(|v| v.value.as_str()), Some("4"));
        assert_eq!(a.get("DEFAULT", "x").map(|v| v.value.as_str()), Some("1"));
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let e = Ini::parse("[s]\nno equals sign here\n", "bad.conf").expect_err("invalid");
        assert_eq!(e.line, 2);
        assert!(e.to_string().starts_with("bad.conf:2:"), "{e}");
        let e = Ini::parse("key = v\n", "f").expect_err("option outside a section");
        assert!(e.message.contains("before any [section]"), "{e}");
        let e = Ini::parse("[s\n", "f").expect_err("bad header");
        assert!(e.message.contains("unterminated"), "{e}");
        let e = Ini::parse("  indented = 1\n", "f").expect_err("nothing to continue");
        assert_eq!(e.line, 1);
    }
}
