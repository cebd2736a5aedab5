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
