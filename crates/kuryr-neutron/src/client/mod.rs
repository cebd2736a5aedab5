//! The Neutron client: transport (auth, retries, concurrency cap, logging, metrics) here, typed resource calls in
//! [`resources`].

mod coalesce;
mod pace;
mod resources;

use std::sync::Arc;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use resources::Page;

use crate::auth::ClientOptions;
use crate::error::{ApiError, Error, ErrorKind, Result};
use crate::filter::ListFilter;
use crate::metrics::Metrics;
use crate::quota_gate::{Held, Pass, QuotaGate, project_of};
pub(crate) use crate::transport::Call;
use crate::transport::{Service, StatusFailure, Transport};

/// Neutron on the shared transport: catalog type `network`, API under `/v2.0`, `NeutronError` bodies.
pub(crate) struct Neutron;

impl Service for Neutron {
    type Error = Error;
    const NAME: &'static str = "neutron";
    const SERVICE_TYPE: &'static str = "network";
    const VERSION: &'static str = "v2.0";

    fn api_error(f: StatusFailure) -> Error {
        api_error(f.operation, f.status, f.request_id, f.retry_after, &f.body)
    }
    fn error_label(e: &Error) -> Option<&str> {
        e.api().map(|a| a.kind.as_str())
    }
    fn status(e: &Error) -> Option<u16> {
        e.status()
    }
    fn request_id(e: &Error) -> Option<&str> {
        e.request_id()
    }
}

/// Typed Neutron API client. Cheap to clone (one `Arc`); clones share the token cache and the concurrency cap.
#[derive(Clone)]
pub struct NeutronClient {
    transport: Transport<Neutron>,
    gate: Arc<QuotaGate>,
    creates: Arc<coalesce::PortCreates>,
}

impl std::fmt::Debug for NeutronClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeutronClient")
            .field("transport", &self.transport)
            .finish()
    }
}

/// A successful (2xx) answer, decoded into Neutron's error type.
pub(crate) struct Reply(crate::transport::Reply);

impl Reply {
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(self.0.json()?)
    }

    /// The object under `key`, e.g. `{"port": {...}}`.
    pub(crate) fn unwrap<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        Ok(self.0.unwrap(key)?)
    }

    /// How long the server took to answer (the answered attempt's round trip).
    pub(crate) fn took(&self) -> std::time::Duration {
        self.0.took
    }
}

#[derive(serde::Deserialize)]
struct NeutronErrorBody {
    #[serde(rename = "NeutronError")]
    error: NeutronErrorInner,
}

#[derive(serde::Deserialize)]
struct NeutronErrorInner {
    #[serde(rename = "type", default)]
    error_type: String,
    #[serde(default)]
    message: String,
}

fn api_error(
    op: &'static str,
    status: u16,
    request_id: Option<String>,
    retry_after: Option<std::time::Duration>,
    body: &[u8],
) -> Error {
    let (error_type, message) = match serde_json::from_slice::<NeutronErrorBody>(body) {
        Ok(b) => (b.error.error_type, b.error.message),
        Err(_) => (
            String::new(),
            String::from_utf8_lossy(body).chars().take(300).collect(),
        ),
    };
    Error::Api(Box::new(ApiError {
        kind: ErrorKind::from_type(&error_type, status),
        status,
        message,
        request_id,
        retry_after,
        operation: op,
    }))
}

/// What a create's answer says of the quota (see [`QuotaGate::observe`]).
fn over_quota<T>(answer: &Result<T>) -> Option<bool> {
    match answer {
        Ok(_) => Some(false),
        Err(e) if e.kind() == Some(&ErrorKind::OverQuota) => Some(true),
        Err(_) => None,
    }
}

/// The answer to a create the quota gate held back: Neutron's own OverQuota, without a call.
fn held_error(op: &'static str, held: &Held) -> Error {
    Error::Api(Box::new(ApiError {
        kind: ErrorKind::OverQuota,
        status: 409,
        message: held.message(),
        request_id: None,
        retry_after: None,
        operation: op,
    }))
}

impl NeutronClient {
    /// Build a client. Authentication happens lazily on the first call.
    pub fn new(opts: &ClientOptions) -> Result<Self> {
        Self::build(opts, None)
    }

    /// Like [`NeutronClient::new`], reporting every operation to `metrics`.
    pub fn with_metrics(opts: &ClientOptions, metrics: Arc<dyn Metrics>) -> Result<Self> {
        Self::build(opts, Some(metrics))
    }

    fn build(opts: &ClientOptions, metrics: Option<Arc<dyn Metrics>>) -> Result<Self> {
        Ok(Self {
            transport: Transport::new(opts, metrics)?,
            gate: Arc::default(),
            creates: Arc::default(),
        })
    }

    /// Send `call` with auth, retries and the concurrency cap; 4xx/5xx become [`Error::Api`].
    pub(crate) async fn execute(&self, call: Call) -> Result<Reply> {
        self.transport.execute(call).await.map(Reply)
    }

    // Generic helpers used by the typed calls.

    pub(crate) async fn get_one<T: DeserializeOwned>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
    ) -> Result<T> {
        self.execute(Call::new(op, Method::GET, seg)).await?.unwrap(key)
    }

    /// A create's body, its project and the quota gate's pass for it (none when the body names no
    /// project); a create the gate holds back is answered here. Neutron's quota resource is the
    /// body's key (`port`, `network`, `security_group`, ...).
    pub(crate) fn admit<B: Serialize>(
        &self,
        op: &'static str,
        key: &str,
        body: &B,
    ) -> Result<(serde_json::Value, String, Option<Pass>)> {
        let body = serde_json::to_value(body)
            .map_err(|e| Error::Config(format!("{op}: cannot serialize request body: {e}")))?;
        let project = project_of(&body);
        let pass = match self.gate.admit(key, &project) {
            _ if project.is_empty() => None,
            Ok(pass) => Some(pass),
            Err(held) => return Err(held_error(op, &held)),
        };
        Ok((body, project, pass))
    }

    pub(crate) async fn create_one<T: DeserializeOwned, B: Serialize>(
        &self,
        op: &'static str,
        collection: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let (body, project, pass) = self.admit(op, key, body)?;
        let wrapped = serde_json::json!({ key: body });
        let answer = self
            .execute(Call::new(op, Method::POST, &[collection]).json(&wrapped)?)
            .await;
        if let Some(pass) = pass {
            self.gate.observe(key, &project, pass, over_quota(&answer));
        }
        answer?.unwrap(key)
    }

    /// A create made outside the gate that succeeded: the quota has room.
    pub(crate) fn quota_has_room(&self, resource: &str, project: &str) {
        if !project.is_empty() {
            let pass = crate::quota_gate::Pass { probe: false };
            self.gate.observe(resource, project, pass, Some(false));
        }
    }

    /// Whether creates of `resource` (Neutron's quota name) for `project` are held back after an
    /// OverQuota (see [`crate::quota_gate`]).
    pub fn quota_held(&self, resource: &str, project: &str) -> bool {
        self.gate.is_closed(resource, project)
    }

    pub(crate) async fn delete_at(&self, op: &'static str, seg: &[&str]) -> Result<()> {
        self.execute(Call::new(op, Method::DELETE, seg)).await.map(|_| ())
    }

    pub(crate) async fn list_page_of<T: DeserializeOwned>(
        &self,
        op: &'static str,
        collection: &str,
        filter: &ListFilter,
        marker: Option<&str>,
    ) -> Result<Page<T>> {
        let mut q = filter.to_pairs();
        if let Some(m) = marker {
            q.push(("marker".into(), m.to_owned()));
        }
        let reply = self
            .execute(Call::new(op, Method::GET, &[collection]).query(q))
            .await?;
        let key = collection.replace('-', "_");
        let (items, next_marker) = reply.0.page(&key)?;
        Ok(Page { items, next_marker })
    }

    /// All items, following `next` links page by page (a full last page still has a `next` link; an empty page ends).
    pub(crate) async fn list_all_of<T: DeserializeOwned>(
        &self,
        op: &'static str,
        collection: &str,
        filter: &ListFilter,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .list_page_of::<T>(op, collection, filter, marker.as_deref())
                .await?;
            let empty = page.items.is_empty();
            out.extend(page.items);
            match page.next_marker {
                Some(m) if !empty && marker.as_deref() != Some(m.as_str()) => marker = Some(m),
                _ => break,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn error_body_parsing() {
        let e = api_error(
            "delete_port",
            404,
            Some("req-x".into()),
            None,
            br#"{"NeutronError": {"type": "PortNotFound", "message": "Port p could not be found.", "detail": ""}}"#,
        );
        assert_eq!(e.kind(), Some(&ErrorKind::PortNotFound));
        assert_eq!(e.request_id(), Some("req-x"));
        let e = api_error(
            "list_ports",
            503,
            None,
            Some(Duration::from_secs(7)),
            b"<html>busy</html>",
        );
        assert_eq!(e.kind(), Some(&ErrorKind::ServiceUnavailable));
        assert!(e.is_transient());
        assert_eq!(
            e.retry_after(),
            Some(Duration::from_secs(7)),
            "the server's Retry-After is kept"
        );
    }
}
