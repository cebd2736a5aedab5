//! The OpenStack transport shared by every service client (Neutron, Octavia): Keystone auth and catalog lookup by
//! service type (or `endpoint_override`), TLS options, one concurrency cap, retries of idempotent calls with
//! exponential backoff + jitter honouring `Retry-After`, one re-authentication on 401, `x-openstack-request-id` in
//! logs and errors, and the [`Metrics`] hook. A service only says where its API lives and how its error bodies read
//! ([`Service`]); everything else is here once.

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

use crate::auth::{AuthError, Authenticator, ClientOptions};
use crate::metrics::{CallRecord, Metrics, Outcome};

/// What differs between OpenStack services behind the one transport.
pub(crate) trait Service: Send + Sync + 'static {
    /// The client's error type; every transport-level failure converts into it.
    type Error: std::error::Error + From<TransportError> + Send + Sync + 'static;
    /// For log lines: `neutron`, `octavia`.
    const NAME: &'static str;
    /// Keystone catalog type: `network`, `load-balancer`.
    const SERVICE_TYPE: &'static str;
    /// The API version path segment appended to the endpoint unless it already ends with it (`v2.0`, `v2`).
    const VERSION: &'static str;

    /// An error status answer (4xx/5xx) into the service's typed error.
    fn api_error(failure: StatusFailure) -> Self::Error;
    /// The label of an API error for the metrics hook (`PortNotFound`, `Immutable`, ...); `None` for a
    /// transport-level failure.
    fn error_label(e: &Self::Error) -> Option<&str>;
    fn status(e: &Self::Error) -> Option<u16>;
    fn request_id(e: &Self::Error) -> Option<&str>;
}

/// An error status answer, before the service reads its body.
#[derive(Debug)]
pub(crate) struct StatusFailure {
    pub operation: &'static str,
    pub status: u16,
    pub request_id: Option<String>,
    pub retry_after: Option<Duration>,
    pub body: Vec<u8>,
}

/// Failures that do not depend on the service: converted into each client's error type.
#[derive(Debug)]
pub(crate) enum TransportError {
    Connection {
        operation: &'static str,
        timed_out: bool,
        outcome_unknown: bool,
        source: reqwest::Error,
    },
    Decode {
        operation: &'static str,
        status: u16,
        request_id: Option<String>,
        message: String,
    },
    Auth(AuthError),
    Config(String),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connection {
                operation, source, ..
            } => write!(f, "{operation}: {}", crate::error::describe_transport(source)),
            Self::Decode {
                operation, message, ..
            } => write!(f, "{operation}: {message}"),
            Self::Auth(e) => write!(f, "{e}"),
            Self::Config(m) => f.write_str(m),
        }
    }
}

/// One API call as the transport sees it.
#[derive(Clone)]
pub(crate) struct Call {
    pub(crate) op: &'static str,
    pub(crate) method: Method,
    segments: Vec<String>,
    query: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    if_match: Option<u64>,
    /// Retry after a failure that may have reached the server. False for POST and for action PUTs
    /// (add_subports, add_router_interface): replaying them after a lost answer fails with a misleading conflict.
    idempotent: bool,
}

impl Call {
    pub(crate) fn new<S: AsRef<str>>(op: &'static str, method: Method, segments: &[S]) -> Self {
        let idempotent = method != Method::POST;
        Self {
            op,
            method,
            segments: segments.iter().map(|s| s.as_ref().to_owned()).collect(),
            query: Vec::new(),
            body: None,
            if_match: None,
            idempotent,
        }
    }

    pub(crate) fn json<B: Serialize + ?Sized>(mut self, body: &B) -> Result<Self, TransportError> {
        let bytes = serde_json::to_vec(body).map_err(|e| {
            TransportError::Config(format!("{}: cannot serialize request body: {e}", self.op))
        })?;
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
    pub(crate) op: &'static str,
    pub(crate) status: u16,
    pub(crate) request_id: Option<String>,
    pub(crate) body: Vec<u8>,
    /// The answered attempt's round trip, from sending to the last byte of its body: the
    /// server's time (its queue included), not the client's own waits (a token fetch, the
    /// concurrency cap, earlier attempts and their backoff).
    pub(crate) took: Duration,
}

impl Reply {
    pub(crate) fn decode_err(&self, message: String) -> TransportError {
        TransportError::Decode {
            operation: self.op,
            status: self.status,
            request_id: self.request_id.clone(),
            message,
        }
    }

    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, TransportError> {
        serde_json::from_slice(&self.body).map_err(|e| self.decode_err(e.to_string()))
    }

    /// The object under `key`, e.g. `{"port": {...}}`, read straight from the body (through a
    /// JSON tree first, every answer was read twice).
    pub(crate) fn unwrap<T: DeserializeOwned>(&self, key: &str) -> Result<T, TransportError> {
        let (found, _) = self.read::<T, serde::de::IgnoredAny>(key, None)?;
        found.ok_or_else(|| self.decode_err(format!("missing top-level key `{key}`")))
    }

    /// The values under `key` and `also` of the body's top-level object, read in one pass.
    fn read<T: DeserializeOwned, A: DeserializeOwned>(
        &self,
        key: &str,
        also: Option<&str>,
    ) -> Result<(Option<T>, Option<A>), TransportError> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(&self.body);
        Under::<T, A>::new(key, also)
            .deserialize(&mut de)
            .and_then(|found| de.end().map(|()| found))
            .map_err(|e| self.decode_err(e.to_string()))
    }

    /// A list page: the items under `key` and the marker of the `next` link under `<key>_links`, the pagination
    /// shape Neutron and Octavia share.
    pub(crate) fn page<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<(Vec<T>, Option<String>), TransportError> {
        let (items, links) = self.read::<Vec<T>, Value>(key, Some(&format!("{key}_links")))?;
        let items = items.ok_or_else(|| self.decode_err(format!("missing top-level key `{key}`")))?;
        let next_marker = links
            .as_ref()
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
        Ok((items, next_marker))
    }
}

/// Reads the values under one key (as `T`) and optionally a second one (as `A`) of a JSON
/// object, skipping the others unread.
struct Under<'k, T, A> {
    key: &'k str,
    also: Option<&'k str>,
    _t: std::marker::PhantomData<fn() -> (T, A)>,
}

impl<'k, T, A> Under<'k, T, A> {
    fn new(key: &'k str, also: Option<&'k str>) -> Self {
        Self {
            key,
            also,
            _t: std::marker::PhantomData,
        }
    }
}

impl<'de, T: DeserializeOwned, A: DeserializeOwned> serde::de::DeserializeSeed<'de> for Under<'_, T, A> {
    type Value = (Option<T>, Option<A>);

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned, A: DeserializeOwned> serde::de::Visitor<'de> for Under<'_, T, A> {
    type Value = (Option<T>, Option<A>);

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "an object with `{}`", self.key)
    }

    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let (mut found, mut also) = (None, None);
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if k == self.key && found.is_none() {
                let v = map
                    .next_value::<T>()
                    .map_err(|e| serde::de::Error::custom(format!("`{}`: {e}", self.key)))?;
                found = Some(v);
            } else if Some(&*k) == self.also && also.is_none() {
                also = Some(map.next_value::<A>()?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok((found, also))
    }
}

/// The longest `Retry-After` taken as given: a broken or hostile server's
/// `u64::MAX` would overflow the callers' deadline arithmetic.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// `Retry-After` in seconds (the HTTP-date form is not used by OpenStack services),
/// at most [`MAX_RETRY_AFTER`].
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim()
        .parse::<u64>()
        .ok()
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-openstack-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Exponential backoff with full jitter: uniform in [0, min(max, base * 2^(attempt-1))].
pub(crate) fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let cap = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(max);
    let ms = cap.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(rand::rng().random_range(0..=ms))
}

/// `endpoint` + the version segment (unless the endpoint already ends with it) + `segments`, each percent-encoded.
pub(crate) fn url<S: AsRef<str>>(
    endpoint: &Url,
    version: &str,
    segments: &[S],
) -> Result<Url, TransportError> {
    let mut url = endpoint.clone();
    let has_version = endpoint
        .path()
        .trim_end_matches('/')
        .ends_with(&format!("/{version}"));
    {
        let mut p = url
            .path_segments_mut()
            .map_err(|()| TransportError::Config(format!("endpoint {endpoint} cannot be a base URL")))?;
        p.pop_if_empty();
        if !has_version {
            p.push(version);
        }
        // push() percent-encodes, so ids and tags cannot escape their path segment.
        p.extend(segments.iter().map(AsRef::as_ref));
    }
    Ok(url)
}

/// The transport of one client. Cheap to clone; clones share the token cache and the concurrency cap.
pub(crate) struct Transport<S: Service> {
    inner: Arc<Inner>,
    _service: std::marker::PhantomData<fn() -> S>,
}

impl<S: Service> Clone for Transport<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            _service: std::marker::PhantomData,
        }
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

impl<S: Service> std::fmt::Debug for Transport<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("service", &S::NAME)
            .field("max_attempts", &self.inner.max_attempts)
            .field("available_slots", &self.inner.limiter.available_permits())
            .finish_non_exhaustive()
    }
}

impl<S: Service> Transport<S> {
    pub(crate) fn new(
        opts: &ClientOptions,
        metrics: Option<Arc<dyn Metrics>>,
    ) -> Result<Self, TransportError> {
        if opts.max_concurrent_requests == 0 {
            return Err(TransportError::Config(
                "max_concurrent_requests must be at least 1".into(),
            ));
        }
        if opts.max_attempts == 0 {
            return Err(TransportError::Config("max_attempts must be at least 1".into()));
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
            let pem = std::fs::read(ca)
                .map_err(|e| TransportError::Config(format!("cafile {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| TransportError::Config(format!("cafile {}: {e}", ca.display())))?;
            b = b.tls_certs_merge(certs);
        }
        if let Some(cert) = &opts.certfile {
            b = b.identity(client_identity(cert, opts.keyfile.as_deref())?);
        }
        if opts.insecure {
            b = b.tls_danger_accept_invalid_certs(true);
        }
        let http = b
            .build()
            .map_err(|e| TransportError::Config(format!("cannot build HTTP client: {e}")))?;
        let auth = Authenticator::new(opts, http.clone(), S::SERVICE_TYPE).map_err(TransportError::Auth)?;
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
            _service: std::marker::PhantomData,
        })
    }

    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        backoff(self.inner.base_delay, self.inner.max_delay, attempt)
    }

    /// The final failure of a call, at warn level with the request id so that it can be found in the server's log.
    /// A 404 is only debug: callers use it as an answer ("already gone"), not as a failure. The token never
    /// reaches a log line: it lives in the request headers only.
    fn log_failure(call: &Call, attempts: u32, e: &S::Error) {
        let request_id = S::request_id(e).unwrap_or("");
        if S::status(e) == Some(404) {
            tracing::debug!(service = S::NAME, op = call.op, method = %call.method, request_id, attempts, error = %e,
                "openstack call failed");
        } else {
            tracing::warn!(service = S::NAME, op = call.op, method = %call.method, status = S::status(e), request_id,
                attempts, error = %e, "openstack call failed");
        }
    }

    /// Send `call` with auth, retries and the concurrency cap; 4xx/5xx become the service's API error.
    pub(crate) async fn execute(&self, call: Call) -> Result<Reply, S::Error> {
        let started = Instant::now();
        let mut attempts = 0u32;
        let mut reauthed = false;
        let mut last_status = None;
        let result: Result<Reply, S::Error> = loop {
            attempts += 1;
            let can_retry = attempts < self.inner.max_attempts;
            let auth = match self.inner.auth.current().await {
                Ok(a) => a,
                Err(e) if e.is_transient() && can_retry => {
                    tracing::debug!(service = S::NAME, op = call.op, error = %e, "keystone unavailable, retrying");
                    tokio::time::sleep(self.backoff(attempts)).await;
                    continue;
                }
                Err(e) => break Err(TransportError::Auth(e).into()),
            };
            let url = match url(&auth.endpoint, S::VERSION, &call.segments) {
                Ok(u) => u,
                Err(e) => break Err(e.into()),
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
                    Err(_) => {
                        break Err(TransportError::Config(
                            "Keystone token is not a valid header value".into(),
                        )
                        .into());
                    }
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
                Err(_) => break Err(TransportError::Config("concurrency limiter closed".into()).into()),
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
            let took = t0.elapsed();
            let latency_ms = took.as_millis() as u64;
            match outcome {
                Err(e) => {
                    // A refused connection never reached the server, so even a POST is safe to resend.
                    let retry = can_retry && (call.idempotent || e.is_connect());
                    if retry {
                        tracing::info!(service = S::NAME, op = call.op, method = %call.method, path, latency_ms,
                            attempt = attempts, error = %crate::error::describe_transport(&e),
                            "openstack call failed without answer, retrying");
                        tokio::time::sleep(self.backoff(attempts)).await;
                        continue;
                    }
                    break Err(TransportError::Connection {
                        operation: call.op,
                        timed_out: e.is_timeout(),
                        // Idempotent calls are safe to repeat whatever happened; a refused connection sent nothing.
                        outcome_unknown: !call.idempotent && !e.is_connect(),
                        source: e,
                    }
                    .into());
                }
                Ok((status, rid, wait, body)) => {
                    last_status = Some(status);
                    tracing::debug!(service = S::NAME, op = call.op, method = %call.method, path, status, latency_ms,
                        request_id = rid.as_deref().unwrap_or(""), attempt = attempts, "openstack call");
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
                        tracing::info!(service = S::NAME, op = call.op, method = %call.method, path, status,
                            request_id = rid.as_deref().unwrap_or(""), attempt = attempts,
                            delay_ms = delay.as_millis() as u64, "openstack call failed, retrying");
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    if status >= 400 {
                        break Err(S::api_error(StatusFailure {
                            operation: call.op,
                            status,
                            request_id: rid,
                            retry_after: wait,
                            body,
                        }));
                    }
                    break Ok(Reply {
                        op: call.op,
                        status,
                        request_id: rid,
                        body,
                        took,
                    });
                }
            }
        };
        if let Err(e) = &result {
            Self::log_failure(&call, attempts, e);
        }
        if let Some(m) = &self.inner.metrics {
            let (outcome, error_type) = match &result {
                Ok(_) => (Outcome::Success, None),
                Err(e) => match S::error_label(e) {
                    Some(label) => (Outcome::ApiError, Some(label)),
                    None => (Outcome::TransportError, None),
                },
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
}

/// The client certificate of `certfile` with its key from `keyfile`, or from `certfile` itself
/// when no `keyfile` is given (keystoneauth reads either layout).
fn client_identity(
    certfile: &std::path::Path,
    keyfile: Option<&std::path::Path>,
) -> Result<reqwest::Identity, TransportError> {
    let read = |option: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| TransportError::Config(format!("{option} {}: {e}", path.display())))
    };
    let mut pem = read("certfile", certfile)?;
    if let Some(key) = keyfile {
        pem.push(b'\n');
        pem.extend(read("keyfile", key)?);
    }
    reqwest::Identity::from_pem(&pem).map_err(|e| {
        TransportError::Config(format!(
            "certfile {} / keyfile: not a PEM certificate with its private key: {e}",
            certfile.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(body: &str) -> Reply {
        Reply {
            op: "port.create",
            status: 201,
            request_id: Some("req-1".into()),
            body: body.as_bytes().to_vec(),
            took: Duration::ZERO,
        }
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Port {
        id: String,
        #[serde(default)]
        tags: Vec<String>,
    }

    #[test]
    fn the_object_under_a_key_is_read_and_the_rest_skipped() {
        let r = reply(
            r#"{"other": {"deep": [1, {"x": null}]}, "port": {"id": "p1", "tags": ["a"], "extra": 5}, "z": 1}"#,
        );
        let p: Port = r.unwrap("port").expect("port");
        assert_eq!(
            p,
            Port {
                id: "p1".into(),
                tags: vec!["a".into()]
            }
        );
        // Escaped keys are matched as what they spell.
        let p: Port = reply(r#"{"p\u006frt": {"id": "p2"}}"#)
            .unwrap("port")
            .expect("escaped key");
        assert_eq!(p.id, "p2");
    }

    #[test]
    fn a_page_reads_its_items_and_the_next_marker_in_one_pass() {
        let r = reply(
            r#"{"ports_links": [{"rel": "previous", "href": "http://h/v2.0/ports?marker=a"},
                {"rel": "next", "href": "http://h/v2.0/ports?limit=2&marker=p2"}],
               "ports": [{"id": "p1"}, {"id": "p2", "tags": ["t"]}]}"#,
        );
        let (items, next): (Vec<Port>, _) = r.page("ports").expect("page");
        assert_eq!(
            items.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["p1", "p2"]
        );
        assert_eq!(next.as_deref(), Some("p2"));
        // The last page: no links, or links without a next one, or links of an odd shape.
        for body in [
            r#"{"ports": []}"#,
            r#"{"ports": [], "ports_links": [{"rel": "previous", "href": "x"}]}"#,
            r#"{"ports": [], "ports_links": {"next": 1}}"#,
        ] {
            let (items, next): (Vec<Port>, _) = reply(body).page("ports").expect("last page");
            assert!(items.is_empty() && next.is_none(), "{body}");
        }
        match reply(r#"{"networks": []}"#).page::<Port>("ports") {
            Err(TransportError::Decode { message, .. }) => {
                assert_eq!(message, "missing top-level key `ports`")
            }
            _ => panic!("a page without its key is a decode error"),
        }
        match reply(r#"{"ports": [{"id": 1}]}"#).page::<Port>("ports") {
            Err(TransportError::Decode { message, .. }) => {
                assert!(message.starts_with("`ports`: invalid type"), "{message}")
            }
            _ => panic!("a bad item is a decode error"),
        }
    }

    #[test]
    fn an_answer_without_the_key_or_with_a_bad_value_is_a_decode_error_naming_it() {
        let msg = |r: Result<Port, TransportError>| match r {
            Err(TransportError::Decode {
                message,
                operation,
                request_id,
                ..
            }) => {
                assert_eq!(operation, "port.create");
                assert_eq!(request_id.as_deref(), Some("req-1"));
                message
            }
            other => panic!("not a decode error: {other:?}"),
        };
        assert_eq!(
            msg(reply(r#"{"ports": []}"#).unwrap("port")),
            "missing top-level key `port`"
        );
        let m = msg(reply(r#"{"port": {"id": 5}}"#).unwrap("port"));
        assert!(m.starts_with("`port`: invalid type: integer `5`"), "{m}");
        let m = msg(reply(r#"{"port": null}"#).unwrap("port"));
        assert!(m.starts_with("`port`: invalid type: null"), "{m}");
        assert!(matches!(
            reply("[1]").unwrap::<Port>("port"),
            Err(TransportError::Decode { .. })
        ));
        assert!(matches!(
            reply(r#"{"port": {"id": "p"}} x"#).unwrap::<Port>("port"),
            Err(TransportError::Decode { .. })
        ));
    }

    #[test]
    fn url_building_encodes_and_versions() {
        let base = Url::parse("http://h:9696/").expect("url");
        let u = url(&base, "v2.0", &["ports", "p1", "tags", "a/b c"]).expect("url");
        assert_eq!(u.as_str(), "http://h:9696/v2.0/ports/p1/tags/a%2Fb%20c");
        let base = Url::parse("http://h/networking/v2.0/").expect("url");
        let u = url(&base, "v2.0", &["ports"]).expect("url");
        assert_eq!(u.as_str(), "http://h/networking/v2.0/ports");
        let base = Url::parse("http://h/load-balancer/").expect("url");
        let u = url(&base, "v2", &["lbaas", "loadbalancers"]).expect("url");
        assert_eq!(u.as_str(), "http://h/load-balancer/v2/lbaas/loadbalancers");
        let base = Url::parse("http://h:9876/v2/").expect("url");
        let u = url(&base, "v2", &["lbaas", "pools"]).expect("url");
        assert_eq!(u.as_str(), "http://h:9876/v2/lbaas/pools");
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

    #[test]
    fn backoff_is_capped_and_jittered() {
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(800);
        for attempt in 1..40 {
            let d = backoff(base, max, attempt);
            let cap = base.saturating_mul(1 << (attempt - 1).min(16)).min(max);
            assert!(d <= cap, "attempt {attempt}: {d:?} > {cap:?}");
        }
        // Full jitter: over many draws the delays are not all equal.
        let draws: std::collections::BTreeSet<_> = (0..50).map(|_| backoff(base, max, 5)).collect();
        assert!(draws.len() > 1);
    }
}
