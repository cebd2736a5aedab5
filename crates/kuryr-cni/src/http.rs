//! Minimal blocking HTTP/1.1 client over TCP or a unix socket: one request
//! per connection (`Connection: close`), bounded by a deadline.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Where the daemon listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port`
    Tcp(String),
    /// Path of a unix socket.
    Unix(String),
}

impl Endpoint {
    /// Accepts `http://host:port[/]`, `host:port`, `unix:///path` and `/path`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix://") {
            return Ok(Self::Unix(path.to_string()));
        }
        if s.starts_with('/') {
            return Ok(Self::Unix(s.to_string()));
        }
        if s.starts_with("https://") {
            return Err(format!(
                "kuryr_daemon {s:?}: https is not supported, use http:// or a unix socket"
            ));
        }
        let rest = s.strip_prefix("http://").unwrap_or(s).trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
            return Err(format!(
                "kuryr_daemon {s:?}: expected http://host:port or a unix socket path"
            ));
        }
        Ok(Self::Tcp(rest.to_string()))
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

#[derive(Debug)]
pub enum HttpError {
    /// Could not reach the daemon at all.
    Connect(String),
    /// Deadline passed.
    Timeout(String),
    /// The daemon answered something that is not HTTP.
    Protocol(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(m) => write!(f, "cannot connect to the kuryr daemon: {m}"),
            Self::Timeout(m) => write!(f, "timed out talking to the kuryr daemon: {m}"),
            Self::Protocol(m) => write!(f, "bad answer from the kuryr daemon: {m}"),
        }
    }
}

trait Stream: Read + Write {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()>;
}
impl Stream for TcpStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}
impl Stream for UnixStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

fn io_err(what: &str, e: std::io::Error) -> HttpError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            HttpError::Timeout(format!("{what}: {e}"))
        }
        _ => HttpError::Protocol(format!("{what}: {e}")),
    }
}

/// Connects to the first address of `addr` that answers, in resolver order: `localhost` is `::1`
/// before `127.0.0.1` on many hosts, where the daemon listens on the latter only.
fn connect_any<A>(addr: A, timeout: Duration) -> Result<TcpStream, HttpError>
where
    A: ToSocketAddrs + std::fmt::Debug,
{
    let addr_name = format!("{addr:?}");
    let addr_name = addr_name.trim_matches('"');
    let mut last = None;
    for sa in addr
        .to_socket_addrs()
        .map_err(|e| HttpError::Connect(format!("{addr_name}: {e}")))?
    {
        match TcpStream::connect_timeout(&sa, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(format!("{sa}: {e}")),
        }
    }
    Err(HttpError::Connect(format!(
        "{addr_name}: {}",
        last.unwrap_or_else(|| "no address".into())
    )))
}

/// `POST path` with a JSON body (or `GET` when `body` is None).
pub fn request(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let deadline = Instant::now() + timeout;
    let (mut stream, host): (Box<dyn Stream>, String) = match ep {
        Endpoint::Tcp(addr) => {
            let s = connect_any(addr.as_str(), timeout)?;
            let _ = s.set_nodelay(true);
            (Box::new(s), addr.clone())
        }
        Endpoint::Unix(path) => {
            let s = UnixStream::connect(path).map_err(|e| HttpError::Connect(format!("{path}: {e}")))?;
            (Box::new(s), "localhost".to_string())
        }
    };
    stream
        .set_timeouts(timeout)
        .map_err(|e| HttpError::Connect(e.to_string()))?;
    let body = body.unwrap_or_default();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nUser-Agent: kuryr-cni\r\n");
    if method != "GET" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).map_err(|e| io_err("send request", e))?;

    let mut raw = Vec::with_capacity(4096);
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HttpError::Timeout(format!(
                "no complete answer within {timeout:?}"
            )));
        }
        stream.set_timeouts(left).map_err(|e| io_err("set timeout", e))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if let Some(resp) = parse_response(&raw)? {
                    return Ok(resp);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("read answer", e)),
        }
    }
    parse_response(&raw)?
        .ok_or_else(|| HttpError::Protocol("connection closed before a complete answer".into()))
}

/// `Ok(None)` while the response is incomplete.
pub(crate) fn parse_response(raw: &[u8]) -> Result<Option<Response>, HttpError> {
    let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head =
        std::str::from_utf8(&raw[..head_end]).map_err(|_| HttpError::Protocol("non-UTF-8 headers".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HttpError::Protocol(format!("bad status line {status_line:?}")))?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                content_length = Some(
                    v.parse::<usize>()
                        .map_err(|_| HttpError::Protocol(format!("bad Content-Length {v:?}")))?,
                );
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let body = &raw[head_end + 4..];
    if chunked {
        return Ok(decode_chunked(body)?.map(|body| Response { status, body }));
    }
    match content_length {
        Some(n) if body.len() >= n => Ok(Some(Response {
            status,
            body: body[..n].to_vec(),
        })),
        Some(_) => Ok(None),
        // 204/304 or no length: complete once the peer closes; the caller
        // handles EOF by calling us again.
        None if status == 204 || status == 304 => Ok(Some(Response {
            status,
            body: Vec::new(),
        })),
        None => Ok(None),
    }
}

fn decode_chunked(mut body: &[u8]) -> Result<Option<Vec<u8>>, HttpError> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_str =
            std::str::from_utf8(&body[..eol]).map_err(|_| HttpError::Protocol("bad chunk size".into()))?;
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| HttpError::Protocol(format!("bad chunk size {size_str:?}")))?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        // A size near usize::MAX (a hostile or broken peer) must not overflow.
        let Some(with_crlf) = size.checked_add(2) else {
            return Err(HttpError::Protocol(format!(
                "chunk size {size_str:?} is too large"
            )));
        };
        if body.len() < with_crlf {
            return Ok(None);
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_a_name_resolves_to_is_tried() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Refused first (nothing listens on 127.0.0.2), as `::1` is for a `localhost` whose
        // daemon listens on 127.0.0.1 only.
        let addrs: [std::net::SocketAddr; 2] = [([127, 0, 0, 2], port).into(), ([127, 0, 0, 1], port).into()];
        let s = connect_any(&addrs[..], Duration::from_secs(2)).expect("the second address");
        assert_eq!(s.peer_addr().ok(), Some(addrs[1]));
        let e = connect_any(&addrs[..1], Duration::from_secs(2)).expect_err("refused");
        assert!(e.to_string().contains("127.0.0.2"), "{e}");
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:5036").ok(),
            Some(Endpoint::Tcp("127.0.0.1:5036".into()))
        );
        assert_eq!(
            Endpoint::parse("127.0.0.1:5036/").ok(),
            Some(Endpoint::Tcp("127.0.0.1:5036".into()))
        );
        assert_eq!(
            Endpoint::parse("unix:///run/k.sock").ok(),
            Some(Endpoint::Unix("/run/k.sock".into()))
        );
        assert_eq!(
            Endpoint::parse("/run/k.sock").ok(),
            Some(Endpoint::Unix("/run/k.sock".into()))
        );
        assert!(Endpoint::parse("https://x:1").is_err());
        assert!(Endpoint::parse("http://nohostport").is_err());
    }

    #[test]
    fn responses_parse() {
        let r = parse_response(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}")
            .ok()
            .flatten();
        assert_eq!(r.map(|r| (r.status, r.body)), Some((202, b"{}".to_vec())));
        assert!(matches!(
            parse_response(b"HTTP/1.1 202 Accepted\r\ncontent-length: 5\r\n\r\n{}"),
            Ok(None)
        ));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .ok()
        .flatten();
        assert_eq!(r.map(|r| r.body), Some(b"abc".to_vec()));
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        let r = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n").ok().flatten();
        assert_eq!(r.map(|r| r.status), Some(204));
    }
}
