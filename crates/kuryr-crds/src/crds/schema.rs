//! Schema fragments for the free-form parts of upstream's CRDs.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `type: object` whose content the API server keeps as-is (upstream's
/// `x-kubernetes-preserve-unknown-fields: true`).
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// `usageThreshold`: a fraction in (0, 1]; 0 would move every project off at once.
pub fn usage_threshold(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "number",
        "format": "double",
        "minimum": 0,
        "exclusiveMinimum": true,
        "maximum": 1,
        "nullable": true,
        "description": "Fraction (0 < t <= 1) at which existing bindings leave; absent = `[pod_binding] usage_threshold`.",
    })
}

/// `headroom`: a fraction in [0, 1); 1 would admit no new binding ever.
pub fn headroom(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "number",
        "format": "double",
        "minimum": 0,
        "maximum": 1,
        "exclusiveMaximum": true,
        "nullable": true,
        "description": "New bindings need usage below threshold - headroom (0 <= h < 1); absent = `[pod_binding] usage_hysteresis`.",
    })
}

/// `resourceAffinity`: at most 16 `key: value` tags whose values read back from the
/// `key=value,...` namespace annotation (no `,` or `=`, no blanks around). Keys cannot be
/// constrained by an OpenAPI v3.0 schema; the controller parses them.
pub fn affinity_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": {
            "type": "string",
            "minLength": 1,
            "maxLength": 255,
            "pattern": r"^[^,=\s]([^,=]*[^,=\s])?$",
        },
        "description": "key=value tags matched by the `resource_affinity` filter.",
    })
}

/// `projectIds`: cluster project id -> this deployment's project id, each a Keystone id (1..255
/// characters, no blanks).
pub fn project_id_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": {
            "type": "string",
            "minLength": 1,
            "maxLength": 255,
            "pattern": r"^\S+$",
        },
        "description": "Cluster project id -> this deployment's project id (separate Keystones have separate ids).",
    })
}

/// A condition's `status`, as metav1.Condition has it.
pub fn condition_status(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": ["True", "False", "Unknown"],
    })
}
