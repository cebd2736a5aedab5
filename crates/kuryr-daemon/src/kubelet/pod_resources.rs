//! Client of the kubelet's PodResources gRPC service: one unary
//! `PodResourcesLister/List` call over HTTP/2 (h2c, prior knowledge) on the
//! kubelet's unix socket, as upstream kuryr-kubernetes' daemon makes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::proto::{DecodeError, PodResources, decode_list_response};

/// The socket under `[sriov] kubelet_root_dir`.
pub const SOCKET_IN_ROOT_DIR: &str = "pod-resources/kubelet.sock";
pub const V1_LIST: &str = "/v1.PodResourcesLister/List";
/// Kubelets before 1.20 only serve v1alpha1 (same fields for what we read).
pub const V1ALPHA1_LIST: &str = "/v1alpha1.PodResourcesLister/List";
/// The kubelet's own limit on this service's messages (16 MiB).
const MAX_MESSAGE: usize = 16 << 20;
/// gRPC length-prefixed message header: compressed flag + u32 length.
const FRAME_HEADER: usize = 5;

pub const GRPC_OK: u32 = 0;
pub const GRPC_UNIMPLEMENTED: u32 = 12;

/// gRPC status code names, for messages.
pub fn grpc_code_name(code: u32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "unknown code",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("HTTP/2: {0}")]
    Http(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The call ended with a non-OK `grpc-status`; `message` is `grpc-message`.
    #[error("{method}: gRPC status {code} ({}): {message}", grpc_code_name(*code))]
    Status {
        method: &'static str,
        code: u32,
        message: String,
    },
    #[error("{method}: {message}")]
    Protocol { method: &'static str, message: String },
    #[error("{method}: {source}")]
    Decode {
        method: &'static str,
        #[source]
        source: DecodeError,
    },
}

/// Talks to one kubelet socket; a connection per [`PodResourcesClient::list`].
#[derive(Clone, Debug)]
pub struct PodResourcesClient {
    socket: PathBuf,
    timeout: Duration,
}

/// Stops the HTTP/2 connection task when the call is over (or timed out).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PodResourcesClient {
    /// `timeout` bounds the whole call: connect, handshake, answer.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// The client of the kubelet whose root directory is `kubelet_root_dir`.
    pub fn in_root_dir(kubelet_root_dir: &Path, timeout: Duration) -> Self {
        Self::new(kubelet_root_dir.join(SOCKET_IN_ROOT_DIR), timeout)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every pod's devices (`List`, v1; v1alpha1 when the kubelet answers
    /// UNIMPLEMENTED to v1).
    pub async fn list(&self) -> Result<Vec<PodResources>, PodResourcesError> {
        tokio::time::timeout(self.timeout, self.list_unbounded())
            .await
            .map_err(|_| PodResourcesError::Timeout(self.timeout))?
    }

    async fn list_unbounded(&self) -> Result<Vec<PodResources>, PodResourcesError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(PodResourcesError::Connect)?;
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(|e| PodResourcesError::Http(e.to_string()))?;
        let _conn = AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "kubelet PodResources connection ended");
            }
        }));
        match unary_list(&mut send, V1_LIST).await {
            Err(PodResourcesError::Status {
                code: GRPC_UNIMPLEMENTED,
                ..
            }) => unary_list(&mut send, V1ALPHA1_LIST).await,
            other => other,
        }
    }
}

async fn unary_list(
    send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    method: &'static str,
) -> Result<Vec<PodResources>, PodResourcesError> {
    let protocol = |message: String| PodResourcesError::Protocol { method, message };
    let http = |e: hyper::Error| PodResourcesError::Http(e.to_string());
    send.ready().await.map_err(http)?;
    // ListPodResourcesRequest has no fields: an empty, uncompressed message.
    let request = http::Request::post(format!("http://localhost{method}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(Bytes::from_static(&[0; FRAME_HEADER])))
        .map_err(|e| protocol(e.to_string()))?;
    let response = send.send_request(request).await.map_err(http)?;
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(protocol(format!("HTTP status {}", parts.status)));
    }
    // Trailers-only answer (how gRPC servers send most errors).
    let header_status = grpc_status(&parts.headers, method)?;
    if let Some((code, message)) = &header_status
        && *code != GRPC_OK
    {
        return Err(PodResourcesError::Status {
            method,
            code: *code,
            message: message.clone(),
        });
    }
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/grpc") {
        return Err(protocol(format!(
            "content-type {content_type:?} is not application/grpc"
        )));
    }
    let collected = Limited::new(body, MAX_MESSAGE + FRAME_HEADER)
        .collect()
        .await
        .map_err(|e| protocol(format!("reading the answer: {e}")))?;
    let trailer_status = match collected.trailers() {
        Some(trailers) => grpc_status(trailers, method)?,
        None => None,
    };
    match trailer_status.or(header_status) {
        None => return Err(protocol("the answer carries no grpc-status".into())),
        Some((code, message)) if code != GRPC_OK => {
            return Err(PodResourcesError::Status {
                method,
                code,
                message,
            });
        }
        Some(_) => {}
    }
    let data = collected.to_bytes();
    let message = unary_message(&data).map_err(protocol)?;
    decode_list_response(message).map_err(|source| PodResourcesError::Decode { method, source })
}

/// `grpc-status` and `grpc-message` of a header or trailer block, if present.
fn grpc_status(
    headers: &HeaderMap,
    method: &'static str,
) -> Result<Option<(u32, String)>, PodResourcesError> {
    let Some(status) = headers.get("grpc-status") else {
        return Ok(None);
    };
    let code = status
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| PodResourcesError::Protocol {
            method,
            message: format!("grpc-status {status:?} is not a number"),
        })?;
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Ok(Some((code, message)))
}

/// `grpc-message` is percent-encoded UTF-8.
fn percent_decode(raw: &[u8]) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let decoded = match (raw.get(i), raw.get(i + 1), raw.get(i + 2)) {
            (Some(b'%'), Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match decoded {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.extend(raw.get(i));
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The one message of a unary answer body (gRPC length-prefixed framing).
fn unary_message(data: &[u8]) -> Result<&[u8], String> {
    if data.is_empty() {
        return Err("the answer has no message".into());
    }
    if data.len() < FRAME_HEADER {
        return Err(format!("truncated gRPC frame header ({} bytes)", data.len()));
    }
    let (header, rest) = data.split_at(FRAME_HEADER);
    let (flag, len) = (
        header[0],
        u32::from_be_bytes([header[1], header[2], header[3], header[4]]),
    );
    match flag {
        0 => {}
        1 => return Err("compressed message, but no grpc-encoding was offered".into()),
        other => return Err(format!("gRPC frame flag {other:#x} is unknown")),
    }
    let len = usize::try_from(len).map_err(|_| format!("gRPC message of {len} bytes"))?;
    if rest.len() < len {
        return Err(format!(
            "truncated gRPC message: {len} bytes announced, {} received",
            rest.len()
        ));
    }
    if rest.len() > len {
        return Err(format!(
            "{} bytes after the one message of a unary answer",
            rest.len() - len
        ));
    }
    Ok(rest)
}

/// The device ids of `resource` given to pod `namespace/name`: over its
/// containers in order, each id once.
pub fn pod_devices(pods: &[PodResources], namespace: &str, name: &str, resource: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let ids = pods
        .iter()
        .filter(|p| p.namespace == namespace && p.name == name)
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.devices)
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| &d.device_ids);
    for id in ids {
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::super::fake::{Answer, FakeKubelet, pod_with as pod};
    use super::*;

    #[test]
    fn frames_and_messages() {
        assert_eq!(
            unary_message(&[0, 0, 0, 0, 2, 0x0a, 0x00]).unwrap(),
            &[0x0a, 0x00]
        );
        assert_eq!(unary_message(&[0, 0, 0, 0, 0]).unwrap(), &[] as &[u8]);
        assert!(unary_message(&[]).unwrap_err().contains("no message"));
        assert!(
            unary_message(&[0, 0, 0])
                .unwrap_err()
                .contains("truncated gRPC frame header")
        );
        assert!(
            unary_message(&[0, 0, 0, 0, 9, 1])
                .unwrap_err()
                .contains("9 bytes announced")
        );
        assert!(
            unary_message(&[1, 0, 0, 0, 0])
                .unwrap_err()
                .contains("compressed")
        );
        assert!(
            unary_message(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
                .unwrap_err()
                .contains("after the one message")
        );
        assert_eq!(percent_decode(b"no %E2%9C%93 device%"), "no \u{2713} device%");
    }

    #[test]
    fn devices_of_one_pod_and_resource() {
        let pods = vec![
            pod(
                "ns",
                "a",
                &[
                    ("intel.com/sriov_a", &["0000:3b:02.3"]),
                    ("intel.com/other", &["x"]),
                ],
            ),
            pod("other", "a", &[("intel.com/sriov_a", &["0000:3b:02.4"])]),
            pod(
                "ns",
                "a",
                &[("intel.com/sriov_a", &["0000:3b:02.5", "0000:3b:02.3"])],
            ),
        ];
        assert_eq!(
            pod_devices(&pods, "ns", "a", "intel.com/sriov_a"),
            vec!["0000:3b:02.3", "0000:3b:02.5"]
        );
        assert!(pod_devices(&pods, "ns", "b", "intel.com/sriov_a").is_empty());
    }

    #[tokio::test]
    async fn lists_over_the_socket_falling_back_to_v1alpha1() {
        let pods = vec![pod("ns", "a", &[("intel.com/sriov_a", &["0000:3b:02.3"])])];
        let kubelet = FakeKubelet::start(HashMap::from([(V1_LIST, Answer::Pods(pods.clone()))])).await;
        let client = PodResourcesClient::in_root_dir(kubelet.root_dir(), Duration::from_secs(5));
        assert_eq!(client.list().await.unwrap(), pods);
        assert_eq!(kubelet.calls(), vec![V1_LIST]);

        // An old kubelet: v1 is UNIMPLEMENTED (trailers-only, as grpc-go answers).
        let old = FakeKubelet::start(HashMap::from([(V1ALPHA1_LIST, Answer::Pods(pods.clone()))])).await;
        let client = PodResourcesClient::in_root_dir(old.root_dir(), Duration::from_secs(5));
        assert_eq!(client.list().await.unwrap(), pods);
        assert_eq!(old.calls(), vec![V1_LIST, V1ALPHA1_LIST]);
    }

    #[tokio::test]
    async fn grpc_errors_are_reported_with_their_message() {
        for trailers_only in [true, false] {
            let kubelet = FakeKubelet::start(HashMap::from([(
                V1_LIST,
                Answer::Status {
                    code: 14,
                    message: "pod resources: not ready \u{2713}".into(),
                    trailers_only,
                },
            )]))
            .await;
            let client = PodResourcesClient::in_root_dir(kubelet.root_dir(), Duration::from_secs(5));
            let err = client.list().await.unwrap_err();
            assert!(
                matches!(&err, PodResourcesError::Status { code: 14, message, .. } if message == "pod resources: not ready \u{2713}"),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "/v1.PodResourcesLister/List: gRPC status 14 (UNAVAILABLE): pod resources: not ready \u{2713}"
            );
        }
    }

    #[tokio::test]
    async fn bad_answers_missing_sockets_and_silence_are_errors() {
        // A truncated message inside a well-formed frame.
        let kubelet = FakeKubelet::start(HashMap::from([(
            V1_LIST,
            Answer::Body(vec![0, 0, 0, 0, 2, 0x0a, 0x05]),
        )]))
        .await;
        let client = PodResourcesClient::in_root_dir(kubelet.root_dir(), Duration::from_secs(5));
        let err = client.list().await.unwrap_err();
        assert!(matches!(err, PodResourcesError::Decode { .. }), "{err:?}");
        assert!(
            err.to_string().contains("ListPodResourcesResponse.pod_resources"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let err = PodResourcesClient::in_root_dir(dir.path(), Duration::from_secs(5))
            .list()
            .await
            .unwrap_err();
        assert!(matches!(err, PodResourcesError::Connect(_)), "{err:?}");

        let silent = FakeKubelet::start(HashMap::from([(V1_LIST, Answer::Hang)])).await;
        let client = PodResourcesClient::in_root_dir(silent.root_dir(), Duration::from_millis(200));
        let err = client.list().await.unwrap_err();
        assert!(matches!(err, PodResourcesError::Timeout(_)), "{err:?}");
    }
}
