//! Typed reading of request bodies with WSME's error messages (unknown attribute, invalid input, mandatory field).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// One JSON object of a request body (`loadbalancer`, a nested `listeners` item, ...).
pub struct Fields<'a> {
    /// WSME reports unknown attributes against the argument's name.
    pub argument: &'a str,
    pub map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// Takes `body[key]` as an object and rejects attributes outside `allowed`.
    pub fn root(body: &'a Value, key: &'a str, allowed: &[&str]) -> Result<Self, ApiError> {
        let inner = body
            .get(key)
            .ok_or_else(|| ApiError::invalid_input(key, "None", "Mandatory field missing."))?;
        Self::object(inner, key, allowed)
    }

    pub fn object(v: &'a Value, argument: &'a str, allowed: &[&str]) -> Result<Self, ApiError> {
        let map = v
            .as_object()
            .ok_or_else(|| ApiError::invalid_input(argument, v, "Invalid data type"))?;
        let unknown: Vec<String> = map
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(ApiError::unknown_attribute(argument, &unknown));
        }
        Ok(Self { argument, map })
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Present and not JSON null.
    pub fn present(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn string(&self, key: &str, max_len: usize) -> Result<Option<String>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.chars().count() <= max_len => Ok(Some(s.clone())),
            Some(Value::String(s)) => Err(ApiError::invalid_input(
                key,
                s,
                &format!("Value should have a maximum character requirement of {max_len}"),
            )),
            Some(other) => Err(ApiError::invalid_input(key, other, "Wrong type. Expected 'str'")),
        }
    }

    pub fn required_string(&self, key: &str, max_len: usize) -> Result<String, ApiError> {
        self.string(key, max_len)?
            .ok_or_else(|| ApiError::invalid_input(key, "None", "Mandatory field missing."))
    }

    pub fn uuid(&self, key: &str) -> Result<Option<String>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) if uuid::Uuid::parse_str(s).is_ok() => Ok(Some(s.clone())),
            Some(other) => Err(ApiError::invalid_input(
                key,
                other
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| other.to_string()),
                "Value should be UUID format",
            )),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ApiError::invalid_input(key, other, "Wrong type. Expected 'bool'")),
        }
    }

    pub fn int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| ApiError::invalid_input(key, v, "Wrong type. Expected 'int'"))?;
                if n < min {
                    return Err(ApiError::invalid_input(
                        key,
                        n,
                        &format!("Value should be greater or equal to {min}"),
                    ));
                }
                if n > max {
                    return Err(ApiError::invalid_input(
                        key,
                        n,
                        &format!("Value should be lower or equal to {max}"),
                    ));
                }
                Ok(Some(n))
            }
        }
    }

    pub fn required_int(&self, key: &str, min: i64, max: i64) -> Result<i64, ApiError> {
        self.int(key, min, max)?
            .ok_or_else(|| ApiError::invalid_input(key, "None", "Mandatory field missing."))
    }

    /// A WSME `Enum` attribute.
    pub fn one_of(&self, key: &str, values: &[&str]) -> Result<Option<String>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) if values.contains(&s.as_str()) => Ok(Some(s.clone())),
            Some(other) => Err(ApiError::invalid_input(
                key,
                other
                    .as_str()
                    .map(String::from)
                    .unwrap_or_else(|| other.to_string()),
                &format!("Value should be one of: {}", values.join(", ")),
            )),
        }
    }

    pub fn required_one_of(&self, key: &str, values: &[&str]) -> Result<String, ApiError> {
        self.one_of(key, values)?
            .ok_or_else(|| ApiError::invalid_input(key, "None", "Mandatory field missing."))
    }

    pub fn string_list(&self, key: &str, max_len: usize) -> Result<Option<Vec<String>>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| match i {
                    Value::String(s) if s.chars().count() <= max_len => Ok(s.clone()),
                    other => Err(ApiError::invalid_input(key, other, "Invalid data type")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(ApiError::invalid_input(
                key,
                other,
                "Wrong type. Expected '[str]'",
            )),
        }
    }

    pub fn ip(&self, key: &str) -> Result<Option<std::net::IpAddr>, ApiError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|_| ApiError::invalid_input(key, s, "Value should be IPv4 or IPv6 format")),
            Some(other) => Err(ApiError::invalid_input(
                key,
                other,
                "Value should be IPv4 or IPv6 format",
            )),
        }
    }

    pub fn list(&self, key: &str) -> Result<&'a [Value], ApiError> {
        match self.present(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(ApiError::invalid_input(key, other, "Invalid data type")),
        }
    }
}
