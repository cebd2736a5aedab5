//! The Neutron client: transport (auth, retries, concurrency cap, logging, metrics) here, typed resource calls in
//! [`resources`].

mod resources;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, IF_MATCH};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Semaphore;
use url::Url;

pub use resources::Page;

use crate::auth::{Authenticator, ClientOptions};
use crate::error::{ApiError, Error, ErrorKind, Result};
use crate::filter::ListFilter;
use crate::metrics::{CallRecord, Metrics, Outcome};

/// Typed Neutron API client. Cheap to clone (one `Arc`); clones share the token cache and the concurrency cap.
#[derive(Clone)]
pub struct NeutronClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NeutronClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeutronClient")
            .field("max_attempts", &self.inner.max_attempts)
            .field("available_slots", &self.inner.limiter.available_permits())
            .finish_non_exhaustive()
    }
}

struct Inner {
    http: reqwest::Client,
    auth: Authenticator,
    limiter: Semaphore,
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    metrics: Option<Arc<dyn Metrics>>,
}

/// One API call as the transport sees it.
pub(crate) struct Call {
    op: &'static str,
    method: Method,
    segments: Vec<String>,
    query: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    if_match: Option<u64>,
    /// Retry after a failure that may have reached the server. False for POST and for action PUTs
    /// (add_subports, add_router_interface): replaying them after a lost answer fails with a misleading conflict.
    idempotent: bool,
}

impl Call {
    pub(crate) fn new(op: &'static str, method: Method, segments: &[&str]) -> Self {
        let idempotent = method != Method::POST;
        Self {
            op,
            method,
            segments: segments.iter().map(|s| (*s).to_owned()).collect(),
            query: Vec::new(),
            body: None,
            if_match: None,
            idempotent,
        }
    }

    pub(crate) fn json<B: Serialize + ?Sized>(mut self, body: &B) -> Result<Self> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| Error::Config(format!("{}: cannot serialize request body: {e}", self.op)))?;
        self.body = Some(bytes);
        Ok(self)
    }

    pub(crate) fn query(mut self, q: Vec<(String, String)>) -> Self {
        self.query = q;
        self
    }

    pub(crate) fn if_match(mut self, revision: Option<u64>) -> Self {
        self.if_match = revision;
        self
    }

    pub(crate) fn not_idempotent(mut self) -> Self {
        self.idempotent = false;
        self
    }
}

/// A successful (2xx) answer.
pub(crate) struct Reply {
    op: &'static str,
    status: u16,
    request_id: Option<String>,
    body: Vec<u8>,
}

impl Reply {
    fn decode_err(&self, message: String) -> Error {
        Error::Decode {
            operation: self.op,
            status: self.status,
            request_id: self.request_id.clone(),
            message,
        }
    }

    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| self.decode_err(e.to_string()))
    }

    /// The object under `key`, e.g. `{"port": {...}}`.
    pub(crate) fn unwrap<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        let mut v: Value = self.json()?;
        let inner = v
            .get_mut(key)
            .map(Value::take)
            .ok_or_else(|| self.decode_err(format!("missing top-level key `{key}`")))?;
        serde_json::from_value(inner).map_err(|e| self.decode_err(format!("`{key}`: {e}")))
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
    retry_after: Option<Duration>,
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

/// The final failure of a call, at warn level with Neutron's request id so that it can be found in neutron-server's
/// log. A 404 is only debug: callers use it as an answer ("already gone"), not as a failure. The token never
/// reaches a log line: it lives in the request headers only.
fn log_failure(call: &Call, attempts: u32, e: &Error) {
    let request_id = e.request_id().unwrap_or("");
    if e.is_not_found() {
        tracing::debug!(op = call.op, method = %call.method, request_id, attempts, error = %e, "neutron call failed");
    } else {
        tracing::warn!(op = call.op, method = %call.method, status = e.status(), request_id, attempts, error = %e,
            "neutron call failed");
    }
}

/// `Retry-After` in seconds (the HTTP-date form is not used by OpenStack services).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
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
        if opts.max_concurrent_requests == 0 {
            return Err(Error::Config("max_concurrent_requests must be at least 1".into()));
        }
        if opts.max_attempts == 0 {
            return Err(Error::Config("max_attempts must be at least 1".into()));
        }
        // reqwest is built without a default crypto provider; ring is the one this project uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("kuryr-rs/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10));
        if let Some(t) = opts.timeout {
            b = b.timeout(t);
        }
        if !opts.connection_reuse {
            b = b.pool_max_idle_per_host(0);
        }
        if let Some(ca) = &opts.cafile {
            let pem =
                std::fs::read(ca).map_err(|e| Error::Config(format!("cafile {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| Error::Config(format!("cafile {}: {e}", ca.display())))?;
            b = b.tls_certs_merge(certs);
        }
        if opts.insecure {
            b = b.tls_danger_accept_invalid_certs(true);
        }
        let http = b
            .build()
            .map_err(|e| Error::Config(format!("cannot build HTTP client: {e}")))?;
        let auth = Authenticator::new(opts, http.clone())?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                auth,
                limiter: Semaphore::new(opts.max_concurrent_requests),
                max_attempts: opts.max_attempts,
                base_delay: opts.retry_base_delay,
                max_delay: opts.retry_max_delay,
                metrics,
            }),
        })
    }

    /// Exponential backoff with full jitter: uniform in [0, min(max, base * 2^(attempt-1))].
    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .inner
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.inner.max_delay);
        let ms = cap.as_millis().min(u128::from(u64::MAX)) as u64;
        Duration::from_millis(rand::rng().random_range(0..=ms))
    }

    fn url<S: AsRef<str>>(endpoint: &Url, segments: &[S]) -> Result<Url> {
        let mut url = endpoint.clone();
        let has_version = endpoint.path().trim_end_matches('/').ends_with("/v2.0");
        {
            let mut p = url
                .path_segments_mut()
                .map_err(|()| Error::Config(format!("endpoint {endpoint} cannot be a base URL")))?;
            p.pop_if_empty();
            if !has_version {
                p.push("v2.0");
            }
            // push() percent-encodes, so ids and tags cannot escape their path segment.
            p.extend(segments.iter().map(AsRef::as_ref));
        }
        Ok(url)
    }

    /// Send `call` with auth, retries and the concurrency cap; 4xx/5xx become [`Error::Api`].
    pub(crate) async fn execute(&self, call: Call) -> Result<Reply> {
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut reauthed = false;
        let mut last_status = None;
        let result: Result<Reply> = loop {
            attempts += 1;
            let can_retry = attempts < self.inner.max_attempts;
            let auth = match self.inner.auth.current().await {
                Ok(a) => a,
                Err(e) if e.is_transient() && can_retry => {
                    tracing::debug!(op = call.op, error = %e, "keystone unavailable, retrying");
                    tokio::time::sleep(self.backoff(attempts)).await;
                    continue;
                }
                Err(e) => break Err(e.into()),
            };
            let url = match Self::url(&auth.endpoint, &call.segments) {
                Ok(u) => u,
                Err(e) => break Err(e),
            };
            let path = url.path().to_owned();
            let mut rb = self
                .inner
                .http
                .request(call.method.clone(), url)
                .header(ACCEPT, "application/json");
            if let Some(token) = &auth.token {
                match HeaderValue::from_str(token.expose()) {
                    Ok(mut hv) => {
                        hv.set_sensitive(true);
                        rb = rb.header("X-Auth-Token", hv);
                    }
                    Err(_) => break Err(Error::Config("Keystone token is not a valid header value".into())),
                }
            }
            if let Some(rev) = call.if_match {
                rb = rb.header(IF_MATCH, format!("revision_number={rev}"));
            }
            if let Some(body) = &call.body {
                rb = rb.header(CONTENT_TYPE, "application/json").body(body.clone());
            }
            if !call.query.is_empty() {
                rb = rb.query(&call.query);
            }
            let permit = match self.inner.limiter.acquire().await {
                Ok(p) => p,
                Err(_) => break Err(Error::Config("concurrency limiter closed".into())),
            };
            let t0 = Instant::now();
            let sent = rb.send().await;
            let outcome = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let rid = request_id(resp.headers());
                    let wait = retry_after(resp.headers());
                    resp.bytes().await.map(|b| (status, rid, wait, b.to_vec()))
                }
                Err(e) => Err(e),
            };
            drop(permit);
            let latency_ms = t0.elapsed().as_millis() as u64;
            match outcome {
                Err(e) => {
                    // A refused connection never reached the server, so even a POST is safe to resend.
                    let retry = can_retry && (call.idempotent || e.is_connect());
                    if retry {
                        tracing::info!(op = call.op, method = %call.method, path, latency_ms, attempt = attempts,
                            error = %crate::error::describe_transport(&e), "neutron call failed without answer, retrying");
                        tokio::time::sleep(self.backoff(attempts)).await;
                        continue;
                    }
                    break Err(Error::Connection {
                        operation: call.op,
                        timed_out: e.is_timeout(),
                        // Idempotent calls are safe to repeat whatever happened; a refused connection sent nothing.
                        outcome_unknown: !call.idempotent && !e.is_connect(),
                        source: e,
                    });
                }
                Ok((status, rid, wait, body)) => {
                    last_status = Some(status);
                    tracing::debug!(op = call.op, method = %call.method, path, status, latency_ms,
                        request_id = rid.as_deref().unwrap_or(""), attempt = attempts, "neutron call");
                    if status == 401
                        && !reauthed
                        && let Some(token) = &auth.token
                    {
                        // Token revoked or expired early: get a new one and resend once. The server did not act.
                        reauthed = true;
                        self.inner.auth.invalidate(token).await;
                        attempts -= 1;
                        continue;
                    }
                    let retryable_status = status >= 500 || status == 429;
                    if retryable_status && call.idempotent && can_retry {
                        let delay =
                            wait.map_or_else(|| self.backoff(attempts), |w| w.min(self.inner.max_delay));
                        tracing::info!(op = call.op, method = %call.method, path, status,
                            request_id = rid.as_deref().unwrap_or(""), attempt = attempts,
                            delay_ms = delay.as_millis() as u64, "neutron call failed, retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    if status >= 400 {
                        break Err(api_error(call.op, status, rid, wait, &body));
                    }
                    break Ok(Reply {
                        op: call.op,
                        status,
                        request_id: rid,
                        body,
                    });
                }
            }
        };
        if let Err(e) = &result {
            log_failure(&call, attempts, e);
        }
        if let Some(m) = &self.inner.metrics {
            let (outcome, error_type) = match &result {
                Ok(_) => (Outcome::Success, None),
                Err(Error::Api(e)) => (Outcome::ApiError, Some(e.kind.as_str())),
                Err(_) => (Outcome::TransportError, None),
            };
            m.observe(&CallRecord {
                operation: call.op,
                method: call.method.as_str(),
                outcome,
                status: last_status,
                error_type,
                latency: started.elapsed(),
                attempts,
            });
        }
        result
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

    pub(crate) async fn create_one<T: DeserializeOwned, B: Serialize>(
        &self,
        op: &'static str,
        collection: &str,
        key: &str,
        body: &B,
    ) -> Result<T> {
        let wrapped = serde_json::json!({ key: body });
        self.execute(Call::new(op, Method::POST, &[collection]).json(&wrapped)?)
            .await?
            .unwrap(key)
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
        let mut v: Value = reply.json()?;
        let items = v
            .get_mut(&key)
            .map(Value::take)
            .ok_or_else(|| reply.decode_err(format!("missing top-level key `{key}`")))?;
        let items: Vec<T> =
            serde_json::from_value(items).map_err(|e| reply.decode_err(format!("`{key}`: {e}")))?;
        let next_marker = v
            .get(format!("{key}_links"))
            .and_then(Value::as_array)
            .and_then(|links| {
                links
                    .iter()
                    .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))
            })
            .and_then(|l| l.get("href").and_then(Value::as_str))
            .and_then(|href| Url::parse(href).ok())
            .and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == "marker")
                    .map(|(_, v)| v.into_owned())
            });
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
    use super::*;

    #[test]
    fn url_building_encodes_and_versions() {
        let base = Url::parse("http://h:9696/").expect("url");
        let u = NeutronClient::url(&base, &["ports", "p1", "tags", "a/b c"]).expect("url");
        assert_eq!(u.as_str(), "http://h:9696/v2.0/ports/p1/tags/a%2Fb%20c");
        let base = Url::parse("http://h/networking/v2.0/").expect("url");
        let u = NeutronClient::url(&base, &["ports"]).expect("url");
        assert_eq!(u.as_str(), "http://h/networking/v2.0/ports");
    }

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

    #[test]
    fn retry_after_seconds() {
        let mut h = HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }
}
