//! The connection layer under every server of the daemon: a cap on
//! connections, the request head read here (with a deadline and a size cap)
//! so that malformed or slow requests get upstream's JSON error rather than
//! hyper's empty 400 or nothing, then one request per connection through
//! hyper and the router.
//!
//! A client that has not sent its head yet costs nothing to turn away: when
//! every slot is taken, the connection that has been reading its head the
//! longest is closed to make room, so stalled clients cannot lock out
//! working ones.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use bytes::{Buf, Bytes};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

use crate::api::ApiError;

/// Any stream a listener gives.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}
type BoxStream = Box<dyn Stream>;

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<BoxStream> {
        Ok(match self {
            Self::Tcp(l) => Box::new(l.accept().await?.0),
            Self::Unix(l) => Box::new(l.accept().await?.0),
        })
    }
}

/// Counts what was turned away (a metric), by reason.
pub type OnReject = Arc<dyn Fn(&'static str) + Send + Sync>;

#[derive(Clone)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub max_head_bytes: usize,
    pub max_body_bytes: usize,
}

/// How long a new connection waits for an evicted one to let go of its slot.
const EVICT_WAIT: Duration = Duration::from_millis(500);
/// How long an error answer may take to write, and the client to take it.
const LINGER: Duration = Duration::from_millis(500);
/// Error answers written at once; beyond this a turned-away connection is
/// just closed (it holds a descriptor while lingering).
const MAX_LINGERING: usize = 64;
/// Pause after accept fails for lack of descriptors, so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections still reading their head, oldest first, each with the
/// means to close it.
#[derive(Default)]
struct HeadReaders {
    next: AtomicU64,
    waiting: Mutex<BTreeMap<u64, oneshot::Sender<()>>>,
}

impl HeadReaders {
    fn register(&self) -> (u64, oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, tx);
        (id, rx)
    }

    fn done(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Close the oldest; false when none is reading its head.
    fn evict_oldest(&self) -> bool {
        let oldest = self.lock().pop_first();
        oldest.is_some_and(|(_, tx)| tx.send(()).is_ok())
    }

    fn evict_all(&self) {
        for (_, tx) in std::mem::take(&mut *self.lock()) {
            let _ = tx.send(());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, oneshot::Sender<()>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What every connection of one server shares.
struct Shared {
    limits: ConnLimits,
    readers: HeadReaders,
    lingering: Arc<Semaphore>,
    on_reject: OnReject,
}

impl Shared {
    /// Answer `e` and close, if a lingering slot is free; else just close.
    fn turn_away(&self, stream: BoxStream, e: ApiError) {
        if let Ok(l) = self.lingering.clone().try_acquire_owned() {
            tokio::spawn(async move {
                answer_and_close(stream, &e).await;
                drop(l);
            });
        }
    }
}

/// Serve `router` on `listener` until `stop` turns true, then wait for the
/// requests in flight.
pub async fn serve(
    listener: Listener,
    router: Router,
    limits: ConnLimits,
    on_reject: OnReject,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let shared = Arc::new(Shared {
        limits,
        readers: HeadReaders::default(),
        lingering: Arc::new(Semaphore::new(MAX_LINGERING)),
        on_reject,
    });
    loop {
        let stream = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = listener.accept() => r,
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                tracing::warn!(error = %e, "cannot accept a connection: out of descriptors or memory");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
            // The client gave up before we took it (ECONNABORTED and the like).
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) if shared.readers.evict_oldest() => {
                (shared.on_reject)("evicted");
                tokio::time::timeout(EVICT_WAIT, slots.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            (shared.on_reject)("connections");
            shared.turn_away(
                stream,
                ApiError::busy(format!(
                    "all {} connections are serving requests",
                    shared.limits.max_connections
                )),
            );
            continue;
        };
        tokio::spawn(connection(stream, permit, router.clone(), shared.clone()));
    }
    // Stalled clients would hold the shutdown for a whole header timeout.
    shared.readers.evict_all();
    let all = u32::try_from(shared.limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

async fn connection(
    mut stream: BoxStream,
    permit: OwnedSemaphorePermit,
    router: Router,
    shared: Arc<Shared>,
) {
    let limits = &shared.limits;
    let (id, evicted) = shared.readers.register();
    let read = tokio::select! {
        r = tokio::time::timeout(limits.header_timeout, read_head(&mut stream, limits)) => r,
        _ = evicted => {
            // The slot goes to the connection that evicted this one now.
            drop(permit);
            shared.turn_away(stream, ApiError::read_timeout(
                "connection closed to make room: its request head was not complete",
            ));
            return;
        }
    };
    shared.readers.done(id);
    let head = match read {
        Ok(Ok(Some(h))) => h,
        // Closed before sending anything.
        Ok(Ok(None)) => return,
        Ok(Err(HeadError::Io(e))) => {
            tracing::debug!(error = %e, "reading a request head");
            return;
        }
        Ok(Err(HeadError::Reply(reason, e))) => {
            (shared.on_reject)(reason);
            drop(permit);
            shared.turn_away(stream, e);
            return;
        }
        Err(_) => {
            (shared.on_reject)("header_timeout");
            drop(permit);
            shared.turn_away(
                stream,
                ApiError::read_timeout(format!(
                    "request head not complete within {:?}",
                    limits.header_timeout
                )),
            );
            return;
        }
    };
    let io = TokioIo::new(Rewind {
        pre: head,
        inner: stream,
    });
    let served = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(io, TowerToHyperService::new(router))
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "serving a connection");
    }
    drop(permit);
}

enum HeadError {
    Io(std::io::Error),
    /// Answer with this (and count it under the reason).
    Reply(&'static str, ApiError),
}

fn malformed(details: impl Into<String>) -> HeadError {
    HeadError::Reply("malformed", ApiError::malformed(details))
}

/// Read until the head is complete and check it; the bytes read (the head
/// and whatever part of the body came with it), `None` when the client
/// closed without sending a byte.
async fn read_head(stream: &mut BoxStream, limits: &ConnLimits) -> Result<Option<Bytes>, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(malformed("the connection ended inside the request head"));
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) if len <= limits.max_head_bytes => {
                check_head(&req, limits)?;
                return Ok(Some(Bytes::from(buf)));
            }
            Ok(httparse::Status::Partial) if buf.len() <= limits.max_head_bytes => {}
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                return Err(HeadError::Reply(
                    "too_large",
                    ApiError::too_large(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        format!(
                            "the request head is over {} bytes or 64 headers",
                            limits.max_head_bytes
                        ),
                    ),
                ));
            }
            Err(e) => return Err(malformed(format!("not an HTTP/1.x request: {e}"))),
        }
    }
}

/// What hyper would refuse with an empty answer, refused here with JSON;
/// and a declared body over the limit, refused before it is read.
fn check_head(req: &httparse::Request<'_, '_>, limits: &ConnLimits) -> Result<(), HeadError> {
    let path = req.path.unwrap_or_default();
    if axum::http::Uri::try_from(path).is_err() {
        return Err(malformed(format!(
            "request target {:?} is not a URI",
            path.chars().take(64).collect::<String>()
        )));
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in req.headers.iter() {
        if axum::http::HeaderName::from_bytes(h.name.as_bytes()).is_err()
            || axum::http::HeaderValue::from_bytes(h.value).is_err()
        {
            return Err(malformed(format!("header {:?} is not valid", h.name)));
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| malformed("Content-Length is not a number"))?;
            if length.is_some_and(|l| l != v) {
                return Err(malformed("Content-Length is given twice, differently"));
            }
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(malformed("Transfer-Encoding must end in chunked"));
            }
            chunked = true;
        }
    }
    if chunked && length.is_some() {
        return Err(malformed("both Content-Length and Transfer-Encoding are set"));
    }
    let max = u64::try_from(limits.max_body_bytes).unwrap_or(u64::MAX);
    if let Some(l) = length.filter(|l| *l > max) {
        return Err(HeadError::Reply(
            "too_large",
            ApiError::too_large(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is {l} bytes, over the limit of {max}"),
            ),
        ));
    }
    Ok(())
}

/// Write the answer, stop writing, and read for a moment what the client
/// still sends: closing with unread data would reset the connection and the
/// client could lose the answer.
async fn answer_and_close(mut stream: BoxStream, e: &ApiError) {
    let linger = async {
        stream.write_all(&e.to_http()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(LINGER, linger).await;
}

/// A stream whose first bytes were already read (the head): they are
/// handed to hyper again before the rest.
struct Rewind {
    pre: Bytes,
    inner: BoxStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pre.has_remaining() {
            let n = self.pre.len().min(buf.remaining());
            let head = self.pre.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
