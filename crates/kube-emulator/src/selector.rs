//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and field selectors.

use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::resources::ResourceDef;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Req>,
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn parse_set(rest: &str, raw: &str) -> ApiResult<Vec<String>> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{rest}', expected: '(' in \"{raw}\""
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let bad = || {
                ApiError::bad_request(format!(
                    "unable to parse requirement: invalid label selector \"{p}\""
                ))
            };
            let req = if let Some(k) = p.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(idx) = p.find(" notin ") {
                Req::NotIn(p[..idx].trim().into(), parse_set(&p[idx + 7..], p)?)
            } else if let Some(idx) = p.find(" in ") {
                Req::In(p[..idx].trim().into(), parse_set(&p[idx + 4..], p)?)
            } else if valid_key(p) {
                Req::Exists(p.to_string())
            } else {
                return Err(bad());
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::NotEq(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// What the API server's field set holds for a field the object leaves out: a bool field is
/// "false" (a Pod's `spec.hostNetwork`, formatted from the Go bool), every other one "" (e.g.
/// `spec.nodeName=` selects unscheduled pods).
fn absent_value(path: &[String]) -> &'static str {
    match path {
        [spec, field] if spec == "spec" && field == "hostNetwork" => "false",
        _ => "",
    }
}

/// A parsed field selector, checked against the fields the resource supports (400 otherwise).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    /// (path segments, value, negated)
    reqs: Vec<(Vec<String>, String, bool)>,
}

impl FieldSelector {
    pub fn parse(s: &str, def: &ResourceDef) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (field, value, neg) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{p}'; can't understand '{p}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" && !def.extra_fields.contains(&field)
            {
                return Err(ApiError::bad_request(format!(
                    "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )));
            }
            reqs.push((
                field.split('.').map(String::from).collect(),
                value.trim().to_string(),
                neg,
            ));
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, want, neg)| {
            let mut cur = Some(obj);
            for seg in path {
                cur = cur.and_then(|c| c.get(seg));
            }
            let got = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => absent_value(path).to_string(),
            };
            (got == *want) != *neg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_operators() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let m = |s: &str| LabelSelector::parse(s).map(|sel| sel.matches(&obj));
        assert_eq!(m("app=web"), Ok(true));
        assert_eq!(m("app==web,tier=back"), Ok(false));
        assert_eq!(m("app!=web"), Ok(false));
        assert_eq!(m("app in (db, web)"), Ok(true));
        assert_eq!(m("app notin (db,web)"), Ok(false));
        assert_eq!(m("missing notin (x)"), Ok(true));
        assert_eq!(m("tier"), Ok(true));
        assert_eq!(m("!tier"), Ok(false));
        assert_eq!(m("!gone,app in (web)"), Ok(true));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn an_unset_bool_field_selects_as_false_and_an_unset_string_as_empty() {
        let pods = crate::resources::Registry::new()
            .find("", "v1", "pods")
            .expect("pods are built in");
        let sel = |s: &str| FieldSelector::parse(s, &pods).expect("a pod field");
        let plain = json!({"spec": {"containers": []}});
        let host = json!({"spec": {"hostNetwork": true, "nodeName": "n1"}});
        assert!(sel("spec.hostNetwork=false").matches(&plain));
        assert!(!sel("spec.hostNetwork=true").matches(&plain));
        assert!(sel("spec.hostNetwork!=true").matches(&plain));
        assert!(sel("spec.hostNetwork=true").matches(&host));
        assert!(!sel("spec.hostNetwork=false").matches(&host));
        assert!(sel("spec.nodeName=").matches(&plain));
        assert!(!sel("spec.nodeName=").matches(&host));
    }
}
