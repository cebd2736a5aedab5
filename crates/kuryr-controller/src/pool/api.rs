//! Pool management API (upstream's `kuryr_manage.sock`, which was broken there): JSON over
//! HTTP/1.1 on a unix socket, plus the client `kuryr pools list|show|populate|free` uses.
//!
//! | request | answer |
//! |---|---|
//! | `GET /pools` | `[PoolSummary]` |
//! | `GET /pools/{name}` | `PoolSummary` with its ports |
//! | `POST /pools/{name}/populate` `{"count": n}` (optional, default: batch) | `{"started": bool}` |
//! | `POST /pools/{name}/free` | `{"deleted": n}` |
//!
//! Errors answer `{"error": "..."}` with 404 (unknown pool), 400 or 500.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::PoolManager;
use super::driver::PoolSummary;
use crate::error::Error;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopulateRequest {
    /// Ports to create; absent = `ports_pool_batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopulateReply {
    /// False when a populate of the pool was already running or the global cap was reached.
    pub started: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeReply {
    pub deleted: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ErrorReply {
    error: String,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(ErrorReply { error: msg.into() })).into_response()
}

fn unknown(name: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no pool named {name}"))
}

async fn list(State(m): State<Arc<PoolManager>>) -> Json<Vec<PoolSummary>> {
    Json(m.summaries())
}

async fn show(State(m): State<Arc<PoolManager>>, UrlPath(name): UrlPath<String>) -> Response {
    match m.find(&name).and_then(|(d, k)| d.snapshot(&k)) {
        Some(s) => Json(s).into_response(),
        None => unknown(&name),
    }
}

async fn populate(
    State(m): State<Arc<PoolManager>>,
    UrlPath(name): UrlPath<String>,
    body: Option<Json<PopulateRequest>>,
) -> Response {
    let Some((d, key)) = m.find(&name) else {
        return unknown(&name);
    };
    let count = body
        .and_then(|Json(b)| b.count)
        .unwrap_or(d.options().limits.batch);
    if count == 0 {
        return error(StatusCode::BAD_REQUEST, "count must be at least 1");
    }
    match d.populate(&key, count) {
        Ok(started) => Json(PopulateReply { started }).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

async fn free(State(m): State<Arc<PoolManager>>, UrlPath(name): UrlPath<String>) -> Response {
    let Some((d, key)) = m.find(&name) else {
        return unknown(&name);
    };
    match d.free(&key).await {
        Ok(deleted) => Json(FreeReply { deleted }).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub fn router(manager: Arc<PoolManager>) -> Router {
    Router::new()
        .route("/pools", get(list))
        .route("/pools/{name}", get(show))
        .route("/pools/{name}/populate", post(populate))
        .route("/pools/{name}/free", post(free))
        .with_state(manager)
}

/// Serves the API on the unix socket `path` (a stale socket file is replaced) until `stop`.
pub async fn serve(manager: Arc<PoolManager>, path: &Path, stop: CancellationToken) -> Result<(), Error> {
    let io = |what: &str, e: std::io::Error| {
        Error::Config(format!("pool manager socket {}: {what}: {e}", path.display()))
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| io("create directory", e))?;
    }
    match tokio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove stale socket", e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| io("bind", e))?;
    let _socket = SocketFile::bound(path);
    axum::serve(listener, router(manager))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .map_err(|e| io("serve", e))
}

/// The socket file this server bound, removed when serving ends however it ends (stopped, or its
/// task dropped), so that no stale socket is left for tools to connect to in vain. A file some
/// other server bound at the same path since is left alone (told apart by inode and change time:
/// a freed inode number may be given to the next file).
struct SocketFile {
    path: PathBuf,
    identity: Option<(u64, u64, i64, i64)>,
}

impl SocketFile {
    fn bound(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            identity: Self::identity(path),
        }
    }

    fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.identity.is_some() && Self::identity(&self.path) == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

// ------------------------------------------------------------------------------------ client

/// Why a pool management call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("pool manager socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pool manager answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("pool manager sent an unreadable answer: {0}")]
    Protocol(String),
}

/// One request over a fresh connection: (status, body).
pub async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, Vec<u8>), ClientError> {
    let io = |source| ClientError::Io {
        path: socket.display().to_string(),
        source,
    };
    let mut stream = tokio::net::UnixStream::connect(socket).await.map_err(io)?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.map_err(io)?;
    parse_response(&raw)
}

/// Splits an HTTP/1.1 response into status and (de-chunked) body.
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), ClientError> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| ClientError::Protocol("no end of headers".into()))?;
    let head = std::str::from_utf8(&raw[..split])
        .map_err(|_| ClientError::Protocol("headers are not UTF-8".into()))?;
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| ClientError::Protocol("bad status line".into()))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, ClientError> {
    let bad = || ClientError::Protocol("bad chunked body".into());
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size_text = std::str::from_utf8(&b[..eol]).map_err(|_| bad())?;
        let size =
            usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).map_err(|_| bad())?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if size.checked_add(2).is_none_or(|end| b.len() < end) {
            return Err(bad());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

async fn call_json<T: serde::de::DeserializeOwned>(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<T, ClientError> {
    let (status, body) = call(socket, method, path, body).await?;
    if !(200..300).contains(&status) {
        let message = serde_json::from_slice::<ErrorReply>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        return Err(ClientError::Status { status, message });
    }
    serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
}

/// `kuryr pools list`.
pub async fn list_pools(socket: &Path) -> Result<Vec<PoolSummary>, ClientError> {
    call_json(socket, "GET", "/pools", None).await
}

/// `kuryr pools show <name>`.
pub async fn show_pool(socket: &Path, name: &str) -> Result<PoolSummary, ClientError> {
    call_json(socket, "GET", &format!("/pools/{name}"), None).await
}

/// `kuryr pools populate <name> [count]`.
pub async fn populate_pool(
    socket: &Path,
    name: &str,
    count: Option<usize>,
) -> Result<PopulateReply, ClientError> {
    let body = serde_json::to_string(&PopulateRequest { count })
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    call_json(socket, "POST", &format!("/pools/{name}/populate"), Some(&body)).await
}

/// `kuryr pools free <name>`.
pub async fn free_pool(socket: &Path, name: &str) -> Result<FreeReply, ClientError> {
    call_json(socket, "POST", &format!("/pools/{name}/free"), None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_file_goes_with_its_server_but_not_a_successors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manage.sock");
        let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(SocketFile::bound(&path));
        assert!(!path.exists(), "the server's own socket is removed");
        drop(first);

        let _old = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let old = SocketFile::bound(&path);
        // A successor replaced the stale file (as `serve` does) and bound its own.
        std::fs::remove_file(&path).unwrap();
        let _new = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(old);
        assert!(path.exists(), "the successor's socket stays");
    }

    #[test]
    fn a_chunk_size_past_the_body_is_refused_not_a_panic() {
        for size in ["ffffffffffffffff", "fffffffffffffffe", "3"] {
            let body = format!("{size}\r\nab\r\n0\r\n\r\n");
            assert!(dechunk(body.as_bytes()).is_err(), "{size}");
        }
        assert_eq!(dechunk(b"2\r\nab\r\n0\r\n\r\n").ok(), Some(b"ab".to_vec()));
    }

    #[test]
    fn parses_plain_and_chunked_responses() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"[]"[..]));
        let (s, b) = parse_response(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s, b.as_slice()), (404, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }
}
