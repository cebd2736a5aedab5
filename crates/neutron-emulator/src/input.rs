//! Request-body helpers producing neutron's validation errors, each naming the offending attribute.

use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

pub type Obj = Map<String, Value>;

/// Python-ish rendering of a JSON value inside error messages (`'abc'` shows as `abc`).
pub fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// `{"<member>": {...}}` -> the inner object.
/// The request body as an object (action bodies such as `add_subports` have no wrapper member).
pub fn body_obj(body: &Value) -> ApiResult<&Obj> {
    body.as_object()
        .ok_or_else(|| ApiError::bad_request("Body contains invalid data"))
}

pub fn member<'a>(body: &'a Value, member: &str) -> ApiResult<&'a Obj> {
    match body.get(member) {
        Some(Value::Object(o)) => Ok(o),
        Some(_) => Err(ApiError::bad_request(format!(
            "Invalid input for {member}. Reason: must be an object."
        ))),
        None => Err(ApiError::bad_request(format!(
            "Unable to find '{member}' in request body"
        ))),
    }
}

/// Rejects attributes the resource does not know and, on update, the read-only ones.
pub fn check_attrs(
    obj: &Obj,
    writable: &[&str],
    create_only: &[&str],
    readonly: &[&str],
    update: bool,
) -> ApiResult<()> {
    let mut unknown: Vec<&str> = Vec::new();
    for key in obj.keys() {
        let k = key.as_str();
        if writable.contains(&k) {
            continue;
        }
        if create_only.contains(&k) {
            if update {
                return Err(ApiError::bad_request(format!(
                    "Cannot update read-only attribute {k}"
                )));
            }
            continue;
        }
        if readonly.contains(&k) {
            if update {
                return Err(ApiError::bad_request(format!(
                    "Cannot update read-only attribute {k}"
                )));
            }
            return Err(ApiError::bad_request(format!(
                "Attribute '{k}' not allowed in POST"
            )));
        }
        unknown.push(k);
    }
    if !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Unrecognized attribute(s) '{}'",
            unknown.join(", ")
        )));
    }
    Ok(())
}

pub fn required<'a>(obj: &'a Obj, key: &str) -> ApiResult<&'a Value> {
    obj.get(key).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Failed to parse request. Required attribute '{key}' not specified"
        ))
    })
}

pub fn opt_str(obj: &Obj, key: &str) -> ApiResult<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not a valid string", show(v)),
        )),
    }
}

pub fn req_str(obj: &Obj, key: &str) -> ApiResult<String> {
    let v = required(obj, key)?;
    match v {
        Value::String(s) => Ok(s.clone()),
        v => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not a valid string", show(v)),
        )),
    }
}

pub fn opt_bool(obj: &Obj, key: &str) -> ApiResult<Option<bool>> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => to_bool(v).map(Some),
    }
}

pub fn to_bool(v: &Value) -> ApiResult<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
        Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" | "t" | "y" => Ok(true),
            "false" | "0" | "no" | "off" | "f" | "n" => Ok(false),
            _ => Err(ApiError::invalid_input(format!(
                "'{s}' cannot be converted to boolean"
            ))),
        },
        other => Err(ApiError::invalid_input(format!(
            "'{}' cannot be converted to boolean",
            show(other)
        ))),
    }
}

pub fn opt_int(obj: &Obj, key: &str) -> ApiResult<Option<i64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => to_int(key, v).map(Some),
    }
}

pub fn to_int(key: &str, v: &Value) -> ApiResult<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| ApiError::invalid_attr(key, format!("'{n}' is not an integer"))),
        Value::String(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| ApiError::invalid_attr(key, format!("'{s}' is not an integer"))),
        other => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not an integer", show(other)),
        )),
    }
}

pub fn opt_str_list(obj: &Obj, key: &str) -> ApiResult<Option<Vec<String>>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid_attr(
                    key,
                    format!("'{}' is not a valid string", show(other)),
                )),
            })
            .collect::<ApiResult<Vec<_>>>()
            .map(Some),
        Some(v) => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not a list", show(v)),
        )),
    }
}

pub fn opt_list(obj: &Obj, key: &str) -> ApiResult<Option<Vec<Value>>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items.clone())),
        Some(v) => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not a list", show(v)),
        )),
    }
}

pub fn opt_obj(obj: &Obj, key: &str) -> ApiResult<Option<Obj>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(v) => Err(ApiError::invalid_attr(
            key,
            format!("'{}' is not a dictionary", show(v)),
        )),
    }
}

/// Validates a tag list: strings of at most 255 characters, deduplicated keeping order.
pub fn tags(key: &str, items: Vec<String>) -> ApiResult<Vec<String>> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for t in items {
        if t.is_empty() || t.len() > 255 || t.contains(',') {
            return Err(ApiError::invalid_attr(key, format!("'{t}' is not a valid tag")));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}
