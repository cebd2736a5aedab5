//! Kubernetes `Status` errors. Every failure the API server returns is one of these, so clients
//! (kubectl, kube-rs, Python requests) can branch on `code`/`reason` exactly as against a real server.

use serde_json::{Value, json};

/// The cause of a create refused because its namespace is being deleted.
pub const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

/// One `details.causes` entry of an `Invalid` status: which field, why.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl Cause {
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            message: "Required value".into(),
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            message: message.into(),
        }
    }

    pub fn not_supported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueNotSupported",
            message: message.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            message: message.into(),
        }
    }

    pub fn type_invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueTypeInvalid",
            message: message.into(),
        }
    }

    fn render(&self) -> String {
        if self.reason == "FieldManagerConflict" || self.reason == NAMESPACE_TERMINATING {
            // Apply conflicts carry the field separately and only the manager in the message.
            return self.message.clone();
        }
        format!("{}: {}", self.field, self.message)
    }
}

/// An API error, rendered as a `metav1.Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// Boxed so `Result<_, ApiError>` stays small on the hot paths.
    pub details: Box<Details>,
}

/// `details.name`, `details.group`, `details.kind` (the resource, as the real server names it) and causes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    /// `metadata.continue` of the status: a list's expired continue token offers a new one.
    pub continue_: Option<String>,
}

/// `pods` or `kuryrports.openstack.org`, as the real server names resources in messages.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_details(mut self, group: &str, plural: &str, name: &str) -> Self {
        self.details.group = (!group.is_empty()).then(|| group.to_string());
        self.details.kind = Some(plural.to_string());
        self.details.name = Some(name.to_string());
        self
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422: `Kind.group "name" is invalid: field: message, ...`.
    pub fn invalid(group: &str, kind: &str, plural: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let rendered: Vec<String> = causes.iter().map(Cause::render).collect();
        let list = if rendered.len() == 1 {
            rendered.join("")
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {list}"),
        )
        .with_details(group, plural, name);
        err.details.kind = Some(kind.to_string());
        err.details.causes = causes;
        err
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 410 for a continue token whose snapshot was compacted away, with the token that goes on
    /// from the same place at the current version (the real server's words and offer).
    pub fn continue_expired(inconsistent: String) -> Self {
        let mut err = Self::gone(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list \
             without the continue parameter, or use the continue token in this response to retrieve the remainder of \
             the results. Continuing with the provided token results in an inconsistent list - objects that were \
             created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
        );
        err.details.continue_ = Some(inconsistent);
        err
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// A create in a namespace being deleted, as the NamespaceLifecycle admission plugin
    /// refuses it: 403 with the cause `NamespaceTerminating`, which clients branch on.
    pub fn namespace_terminating(group: &str, plural: &str, name: &str, ns: &str) -> Self {
        let mut err = Self::forbidden(format!(
            "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
            qualified(group, plural)
        ))
        .with_details(group, plural, name);
        err.details.causes = vec![Cause {
            field: "metadata.namespace".into(),
            reason: NAMESPACE_TERMINATING,
            message: format!("namespace {ns} is being terminated"),
        }];
        err
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml; got {content_type:?}"
            ),
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(name) = &self.details.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = &self.details.group {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = &self.details.kind {
            details.insert("kind".into(), json!(kind));
        }
        if !self.details.causes.is_empty() {
            let causes: Vec<Value> = self
                .details
                .causes
                .iter()
                // The real server's cause message is the error's body without its field
                // (kubectl prints `* field: message`).
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        if let Some(token) = &self.details.continue_ {
            status["metadata"] = json!({"continue": token});
        }
        status
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
