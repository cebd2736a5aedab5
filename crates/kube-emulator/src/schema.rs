//! Structural-schema handling for custom resources: pruning of unknown fields and
//! `openAPIV3Schema` validation producing field paths the way the real server reports them.

use serde_json::Value;

use crate::error::Cause;

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

/// Drops fields the schema does not declare; returns their paths (for `fieldValidation=Strict`).
pub fn prune(value: &mut Value, schema: &Value, path: &str, root: bool) -> Vec<String> {
    let mut unknown = Vec::new();
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keep_all = preserves_unknown(schema) && props.is_none();
            let mut drop = Vec::new();
            for (k, v) in map.iter_mut() {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    unknown.extend(prune(v, sub, &join(path, k), false));
                } else if let Some(sub) = additional.filter(|a| a.is_object()) {
                    unknown.extend(prune(v, sub, &join(path, k), false));
                } else if !(keep_all || preserves_unknown(schema) || additional == Some(&Value::Bool(true))) {
                    drop.push(k.clone());
                }
            }
            for k in drop {
                map.remove(&k);
                unknown.push(join(path, &k));
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    unknown.extend(prune(item, sub, &format!("{path}[{i}]"), false));
                }
            }
        }
        _ => {}
    }
    unknown
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// A float as Go's `%v` prints it (`strconv` 'g', shortest): the real server formats schema
/// bounds (always float64) and float values so, e.g. `1e+06` for 1000000 and `1e-05` for 0.00001.
fn go_float(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return format!("{f}");
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// A JSON number as the real server prints the value it refused: integers as they are, floats
/// like Go's `%v`.
fn go_number(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => go_float(n.as_f64().unwrap_or_default()),
        other => other.to_string(),
    }
}

/// Whole-number floats (`2.0`) where the schema says `integer` become integers, as the real
/// server's decoder keeps them: it accepts a float that is a JSON integer for an integer field
/// and stores it as one.
pub fn coerce_integers(value: &mut Value, schema: &Value) {
    match value {
        Value::Number(n) if n.is_f64() && schema.get("type").and_then(Value::as_str) == Some("integer") => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f.abs() < 9.007_199_254_740_992e15
            {
                *value = Value::from(f as i64);
            }
        }
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in map.iter_mut() {
                if let Some(sub) = props.and_then(|p| p.get(k)).or(additional) {
                    coerce_integers(v, sub);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for item in items {
                    coerce_integers(item, sub);
                }
            }
        }
        _ => {}
    }
}

/// The bound keywords OpenAPI v3.0 (and so `JSONSchemaProps`) types as booleans; a number there
/// (JSON Schema 2020-12's form) does not decode, so the real server refuses the CRD with 400.
pub fn non_boolean_exclusive_bound(schema: &Value, path: &str) -> Option<String> {
    match schema {
        Value::Object(map) => {
            for key in ["exclusiveMinimum", "exclusiveMaximum"] {
                if let Some(v) = map.get(key)
                    && !v.is_boolean()
                {
                    return Some(format!(
                        "json: cannot unmarshal {} into Go struct field JSONSchemaProps.{path}.{key} of type bool",
                        type_name(v)
                    ));
                }
            }
            map.iter()
                .find_map(|(k, v)| non_boolean_exclusive_bound(v, &join(path, k)))
        }
        Value::Array(items) => items.iter().find_map(|v| non_boolean_exclusive_bound(v, path)),
        _ => None,
    }
}

/// Validates `value` against `schema`, appending causes with real-server style field paths.
pub fn validate(value: &Value, schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    let shown = if path.is_empty() { "<root>" } else { path };
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) == Some(true) {
            return;
        }
        if schema.get("type").is_some() {
            causes.push(Cause::type_invalid(
                shown,
                format!(
                    "Invalid value: \"null\": {shown} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let whole = value.as_f64().is_some_and(|f| f.fract() == 0.0);
        let ok = got == want
            || (want == "number" && got == "integer")
            || (want == "integer" && got == "number" && whole)
            || (int_or_string && (got == "integer" || got == "string"));
        if !ok {
            causes.push(Cause::type_invalid(
                shown,
                format!("Invalid value: \"{got}\": {shown} in body must be of type {want}: \"{got}\""),
            ));
            return;
        }
    } else if int_or_string && !matches!(type_name(value), "integer" | "string") {
        causes.push(Cause::type_invalid(
            shown,
            format!(
                "Invalid value: \"{}\": {shown} in body must be of type integer or string",
                type_name(value)
            ),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let supported: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        causes.push(Cause::not_supported(
            shown,
            format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        ));
    }
    match value {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                causes.push(Cause::invalid(
                    shown,
                    format!("Invalid value: \"{s}\": {shown} in body should be at least {min} chars long"),
                ));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                causes.push(Cause::new_too_long(shown, max));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(pattern) {
                    Ok(re) if !re.is_match(s) => causes.push(Cause::invalid(
                        shown,
                        format!("Invalid value: \"{s}\": {shown} in body should match '{pattern}'"),
                    )),
                    Ok(_) => {}
                    Err(_) => causes.push(Cause::invalid(
                        shown,
                        format!("schema pattern '{pattern}' does not compile"),
                    )),
                }
            }
        }
        Value::Number(_) => {
            let x = num(value).unwrap_or_default();
            let shown_value = go_number(value);
            if let Some(min) = schema.get("minimum").and_then(num) {
                let excl = schema.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
                if x < min || (excl && x == min) {
                    let rel = if excl {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    causes.push(Cause::invalid(
                        shown,
                        format!(
                            "Invalid value: {shown_value}: {shown} in body should be {rel} {}",
                            go_float(min)
                        ),
                    ));
                }
            }
            if let Some(step) = schema.get("multipleOf").and_then(num)
                && step > 0.0
                && ((x / step) - (x / step).round()).abs() > 1e-9
            {
                causes.push(Cause::invalid(
                    shown,
                    format!(
                        "Invalid value: {shown_value}: {shown} in body should be a multiple of {}",
                        go_float(step)
                    ),
                ));
            }
            if let Some(max) = schema.get("maximum").and_then(num) {
                let excl = schema.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
                if x > max || (excl && x == max) {
                    let rel = if excl {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    causes.push(Cause::invalid(
                        shown,
                        format!(
                            "Invalid value: {shown_value}: {shown} in body should be {rel} {}",
                            go_float(max)
                        ),
                    ));
                }
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                causes.push(Cause::invalid(
                    shown,
                    format!(
                        "Invalid value: {}: {shown} in body should have at least {min} items",
                        items.len()
                    ),
                ));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && (items.len() as u64) > max
            {
                causes.push(Cause::new_too_many(shown, items.len(), max));
            }
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item, sub, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::Object(map) => {
            if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
                && (map.len() as u64) < min
            {
                causes.push(Cause::invalid(
                    shown,
                    format!(
                        "Invalid value: {}: {shown} in body should have at least {min} properties",
                        map.len()
                    ),
                ));
            }
            if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
                && (map.len() as u64) > max
            {
                causes.push(Cause::new_too_many(shown, map.len(), max));
            }
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(r) = req.as_str()
                    && !map.contains_key(r)
                {
                    causes.push(Cause::required(join(path, r)));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            for (k, v) in map {
                if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    validate(v, sub, &join(path, k), causes);
                } else if let Some(sub) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    validate(v, sub, &join(path, k), causes);
                }
            }
        }
        _ => {}
    }
    for sub in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        validate(value, sub, path, causes);
    }
    for (key, exactly_one) in [("anyOf", false), ("oneOf", true)] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let passing = options
                .iter()
                .filter(|o| {
                    let mut c = Vec::new();
                    validate(value, o, path, &mut c);
                    c.is_empty()
                })
                .count();
            if passing == 0 || (exactly_one && passing > 1) {
                causes.push(Cause::invalid(
                    shown,
                    format!(
                        "Invalid value: {value}: {shown} in body must match {} schema in {key}",
                        if exactly_one {
                            "exactly one"
                        } else {
                            "at least one"
                        }
                    ),
                ));
            }
        }
    }
}

impl Cause {
    fn new_too_long(field: &str, max: u64) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }

    fn new_too_many(field: &str, got: usize, max: u64) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueTooMany",
            message: format!("Too many: {got}: must have at most {max} items"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_required_and_type_errors_with_paths_and_prunes() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["podUid", "podNodeName"], "properties": {
                "podUid": {"type": "string"}, "podNodeName": {"type": "string"},
                "ports": {"type": "array", "items": {"type": "integer", "minimum": 1}}}},
            "status": {"type": "object", "properties": {"vifs": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut obj = json!({"apiVersion": "openstack.org/v1", "kind": "KuryrPort", "metadata": {"name": "x"},
            "spec": {"podUid": 5, "ports": [1, 0], "bogus": true}, "status": {"vifs": {"eth0": {"any": 1}}}});
        let unknown = prune(&mut obj, &schema, "", true);
        assert_eq!(unknown, vec!["spec.bogus".to_string()]);
        assert_eq!(obj["status"]["vifs"]["eth0"]["any"], 1);
        let mut causes = Vec::new();
        validate(&obj, &schema, "", &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.podNodeName", "spec.podUid", "spec.ports[1]"]);
        assert_eq!(causes[0].reason, "FieldValueRequired");
    }

    #[test]
    fn numeric_bounds_multiples_properties_and_whole_floats_as_the_real_server() {
        let schema = json!({"type": "object", "properties": {
            "t": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 1},
            "w": {"type": "integer", "minimum": -10, "maximum": 10, "exclusiveMaximum": true},
            "step": {"type": "number", "multipleOf": 0.25},
            "tags": {"type": "object", "maxProperties": 2, "minProperties": 1,
                     "additionalProperties": {"type": "integer"}}}});
        let check = |obj: Value| {
            let mut obj = obj;
            coerce_integers(&mut obj, &schema);
            let mut causes = Vec::new();
            validate(&obj, &schema, "", &mut causes);
            (
                obj,
                causes
                    .into_iter()
                    .map(|c| (c.field, c.reason, c.message))
                    .collect::<Vec<_>>(),
            )
        };
        let (obj, causes) = check(json!({"t": 0.5, "w": 2.0, "step": 0.75, "tags": {"a": 1.0}}));
        assert!(causes.is_empty(), "{causes:?}");
        assert_eq!(
            obj["w"],
            json!(2),
            "a whole float in an integer field is stored as an integer"
        );
        assert!(obj["w"].is_i64() && obj["tags"]["a"].is_i64());
        let (_, causes) = check(json!({"t": 0, "w": 10, "step": 0.3, "tags": {}}));
        assert_eq!(
            causes,
            vec![
                (
                    "step".into(),
                    "FieldValueInvalid",
                    "Invalid value: 0.3: step in body should be a multiple of 0.25".into()
                ),
                (
                    "t".into(),
                    "FieldValueInvalid",
                    "Invalid value: 0: t in body should be greater than 0".into()
                ),
                (
                    "tags".into(),
                    "FieldValueInvalid",
                    "Invalid value: 0: tags in body should have at least 1 properties".into()
                ),
                (
                    "w".into(),
                    "FieldValueInvalid",
                    "Invalid value: 10: w in body should be less than 10".into()
                ),
            ]
        );
        let (_, causes) = check(json!({"t": 1.5, "w": 2.5, "tags": {"a": 1, "b": 2, "c": 3}}));
        assert_eq!(
            causes,
            vec![
                (
                    "t".into(),
                    "FieldValueInvalid",
                    "Invalid value: 1.5: t in body should be less than or equal to 1".into()
                ),
                (
                    "tags".into(),
                    "FieldValueTooMany",
                    "Too many: 3: must have at most 2 items".into()
                ),
                (
                    "w".into(),
                    "FieldValueTypeInvalid",
                    "Invalid value: \"number\": w in body must be of type integer: \"number\"".into()
                ),
            ]
        );
    }

    #[test]
    fn a_numeric_exclusive_bound_is_no_openapi_v3_schema() {
        let bad = json!({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0}}});
        let why = non_boolean_exclusive_bound(&bad, "root").expect("refused");
        assert!(
            why.contains("root.properties.x.exclusiveMinimum of type bool"),
            "{why}"
        );
        let good = json!({"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "exclusiveMinimum": true}}});
        assert_eq!(non_boolean_exclusive_bound(&good, "root"), None);
    }

    #[test]
    fn floats_print_as_go_prints_them() {
        for (f, want) in [
            (1_000_000.0, "1e+06"),
            (100_000.0, "100000"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5, "1.5"),
            (0.0, "0"),
            (-2.5e7, "-2.5e+07"),
            (1.0, "1"),
        ] {
            assert_eq!(go_float(f), want, "{f}");
        }
        assert_eq!(go_number(&json!(2_000_000)), "2000000", "integers as they are");
    }
}
