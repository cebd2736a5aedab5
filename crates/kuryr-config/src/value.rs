//! Typed parsing of raw option strings with oslo.config's rules.
//!
//! Every option type implements [`OptionValue`]; the error side is the "expected …" part of
//! the message, the caller adds section, option and value.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;

/// A value type an option can have.
pub trait OptionValue: Sized {
    /// Parses a raw INI value; `Err` holds what was expected, e.g. `"expected an integer"`.
    fn parse_option(raw: &str) -> Result<Self, String>;
}

/// Types usable as list items and dict values.
pub trait ScalarValue: Sized {
    fn parse_scalar(raw: &str) -> Result<Self, String>;
}

impl ScalarValue for String {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        Ok(raw.to_owned())
    }
}

/// oslo.config's `Boolean` type: case-insensitive true/1/on/yes and false/0/off/no.
impl ScalarValue for bool {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "on" | "yes" => Ok(true),
            "false" | "0" | "off" | "no" => Ok(false),
            _ => Err("expected a boolean (true/false, yes/no, on/off, 1/0)".into()),
        }
    }
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl ScalarValue for $t {
            fn parse_scalar(raw: &str) -> Result<Self, String> {
                let n: i128 = raw.trim().parse().map_err(|_| "expected an integer".to_string())?;
                <$t>::try_from(n).map_err(|_| {
                    format!("expected an integer between {} and {}", <$t>::MIN, <$t>::MAX)
                })
            }
        }
    )*};
}
int_scalar!(u16, u32, u64, i32, i64);

impl ScalarValue for NonZeroU32 {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        let n = u32::parse_scalar(raw)?;
        NonZeroU32::new(n).ok_or_else(|| "expected an integer of at least 1".to_string())
    }
}

impl ScalarValue for f64 {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        match raw.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err("expected a number".into()),
        }
    }
}

impl ScalarValue for SocketAddr {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        // Upstream served `localhost:5036` as written (its host name resolving to loopback).
        if let Some(port) = raw.strip_prefix("localhost:")
            && let Ok(port) = port.parse::<u16>()
        {
            return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        raw.parse()
            .map_err(|_| "expected an address as ip:port or localhost:port (e.g. 127.0.0.1:5036)".to_string())
    }
}

/// A secret string (passwords, application credential secrets, tokens): never shown by
/// `Debug`, `Display` or serialization, so neither a config dump nor a log line can leak
/// it. The Neutron client uses the same type.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The secret itself, for the one place that sends it (the Keystone request).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Read in clear (from `clouds.yaml` or JSON options); only output is redacted.
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <String as serde::Deserialize>::deserialize(d).map(Secret)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

impl ScalarValue for Secret {
    fn parse_scalar(raw: &str) -> Result<Self, String> {
        Ok(Secret(raw.to_owned()))
    }
}

macro_rules! scalar_option {
    ($($t:ty),*) => {$(
        impl OptionValue for $t {
            fn parse_option(raw: &str) -> Result<Self, String> {
                <$t as ScalarValue>::parse_scalar(raw)
            }
        }
    )*};
}
scalar_option!(
    String, bool, u16, u32, u64, i32, i64, NonZeroU32, f64, SocketAddr, Secret
);

/// An unset optional value: an empty string means "not set" (e.g. `pod_router =`).
impl<T: ScalarValue> OptionValue for Option<T> {
    fn parse_option(raw: &str) -> Result<Self, String> {
        if raw.trim().is_empty() {
            Ok(None)
        } else {
            T::parse_scalar(raw).map(Some)
        }
    }
}

/// oslo `ListOpt`: comma separated, items trimmed, empty items dropped (so a trailing
/// comma or a line break inside the list does no harm).
impl<T: ScalarValue> OptionValue for Vec<T> {
    fn parse_option(raw: &str) -> Result<Self, String> {
        split_list(raw)
            .map(|item| T::parse_scalar(item).map_err(|e| format!("list item {item:?}: {e}")))
            .collect()
    }
}

/// oslo `DictOpt`: `key:value,key2:value2`; the value may itself contain `:`.
/// Keys are typed too, so e.g. driver-name keys are checked.
impl<K: ScalarValue + Ord, V: ScalarValue> OptionValue for BTreeMap<K, V> {
    fn parse_option(raw: &str) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for item in split_list(raw) {
            let Some((k, v)) = item.split_once(':') else {
                return Err(format!(
                    "expected key:value pairs separated by commas, got item {item:?}"
                ));
            };
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(format!(
                    "expected key:value pairs, item {item:?} has an empty key"
                ));
            }
            let key = K::parse_scalar(k).map_err(|e| format!("key {k:?}: {e}"))?;
            let value = V::parse_scalar(v).map_err(|e| format!("value of key {k:?}: {e}"))?;
            if map.insert(key, value).is_some() {
                return Err(format!("key {k:?} appears twice"));
            }
        }
        Ok(map)
    }
}

fn split_list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Declares an enum of the valid values of a string option (driver names and the like).
/// Parsing an unknown value fails with the list of valid ones.
macro_rules! choice_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $( $(#[$vmeta])* $variant ),+ }

        impl $name {
            /// Every valid spelling, in declaration order.
            pub const VALUES: &'static [&'static str] = &[$($text),+];

            /// The spelling used in `kuryr.conf`.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text ),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.trim() {
                    $( $text => Ok($name::$variant), )+
                    _ => Err(format!("expected one of: {}", Self::VALUES.join(", "))),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl $crate::value::ScalarValue for $name {
            fn parse_scalar(raw: &str) -> Result<Self, String> {
                raw.parse()
            }
        }

        impl $crate::value::OptionValue for $name {
            fn parse_option(raw: &str) -> Result<Self, String> {
                raw.parse()
            }
        }
    };
}
pub(crate) use choice_enum;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_follow_oslo() {
        for t in ["True", "true", "YES", "on", "1"] {
            assert_eq!(bool::parse_option(t), Ok(true), "{t}");
        }
        for f in ["False", "no", "OFF", "0"] {
            assert_eq!(bool::parse_option(f), Ok(false), "{f}");
        }
        assert!(bool::parse_option("maybe").is_err());
    }

    #[test]
    fn integers_check_range() {
        assert_eq!(u16::parse_option(" 8082 "), Ok(8082));
        assert_eq!(
            u16::parse_option("70000"),
            Err("expected an integer between 0 and 65535".into())
        );
        assert_eq!(u32::parse_option("abc"), Err("expected an integer".into()));
        assert_eq!(i64::parse_option("-1"), Ok(-1));
        assert!(NonZeroU32::parse_option("0").is_err());
    }

    #[test]
    fn lists_and_dicts() {
        assert_eq!(
            Vec::<String>::parse_option("a, b,\nc,"),
            Ok(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(Vec::<String>::parse_option(""), Ok(vec![]));
        let d = BTreeMap::<String, String>::parse_option("physnet1:subnet-a, x:y:z").expect("dict");
        assert_eq!(d.get("physnet1").map(String::as_str), Some("subnet-a"));
        assert_eq!(d.get("x").map(String::as_str), Some("y:z"));
        assert!(BTreeMap::<String, String>::parse_option("novalue").is_err());
        assert!(BTreeMap::<String, f64>::parse_option("a:x").is_err());
        assert!(BTreeMap::<String, String>::parse_option("a:1,a:2").is_err());
    }

    #[test]
    fn empty_optional_is_none() {
        assert_eq!(Option::<String>::parse_option(""), Ok(None));
        assert_eq!(Option::<u64>::parse_option("30"), Ok(Some(30)));
    }

    #[test]
    fn secret_is_not_printed() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(!format!("{s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }
}
