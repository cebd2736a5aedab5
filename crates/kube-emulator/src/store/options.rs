//! Request options and results of the store's operations.

use std::sync::Arc;

use serde_json::Value;

use crate::selector::{FieldSelector, LabelSelector};

/// `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// Options shared by create/update/patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    /// `force=true` on an apply: take over fields other managers own instead of a 409.
    pub force: bool,
    pub field_validation: FieldValidation,
}

/// DELETE options (query parameters and the DeleteOptions body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub dry_run: bool,
    pub propagation: Propagation,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// `propagationPolicy` of a DELETE: what happens to the object's dependents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Propagation {
    /// The object goes now, the garbage collector deletes dependents afterwards.
    #[default]
    Background,
    /// The object waits (finalizer `foregroundDeletion`) until its blocking dependents are gone.
    Foreground,
    /// Dependents stay; their ownerReferences to the object are removed.
    Orphan,
}

/// List parameters.
#[derive(Debug, Clone, Default)]
pub struct ListOpts {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_: Option<String>,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct WriteOutcome {
    /// The object as stored (shared with the store: a write's answer copies nothing).
    pub object: Arc<Value>,
    pub created: bool,
    pub warnings: Vec<String>,
}

/// A list page.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_: Option<String>,
    pub remaining: Option<u64>,
}
