//! Probes between pods on a real dataplane: TCP, UDP and ICMP from one network namespace to an
//! address, each with a deadline, many at once (one thread each), so a test over N pods costs
//! one timeout instead of N² of them. Servers ([`Server`]) answer every TCP connection and UDP
//! datagram with one byte until dropped. Used by the dataplane, NetworkPolicy and Services tests.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::enter_netns;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Icmp,
}

/// What a probe must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// An answer within the deadline (retried until then: ARP, flows being installed).
    Open,
    /// No answer for the whole deadline (a dropped packet; a refused TCP connection counts as
    /// an answer, so a missing server is not mistaken for a filter).
    Closed,
}

/// One probe: from the namespace at `from` (a path) to `addr:port` (`port` ignored for ICMP).
#[derive(Clone, Debug)]
pub struct Probe {
    pub label: String,
    pub from: String,
    pub proto: Proto,
    pub addr: IpAddr,
    pub port: u16,
    pub expect: Expect,
}

impl Probe {
    pub fn new(
        label: impl Into<String>,
        from: &str,
        proto: Proto,
        addr: IpAddr,
        port: u16,
        expect: Expect,
    ) -> Self {
        Self {
            label: label.into(),
            from: from.to_string(),
            proto,
            addr,
            port,
            expect,
        }
    }
}

/// The outcome of one probe attempt.
enum Answer {
    Yes,
    /// Reached, but nobody listens (TCP RST / ICMP port unreachable).
    Refused,
    No(String),
}

fn attempt(p: &Probe, timeout: Duration) -> Answer {
    let to = SocketAddr::new(p.addr, p.port);
    match p.proto {
        Proto::Tcp => match TcpStream::connect_timeout(&to, timeout) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(timeout));
                let mut b = [0u8; 1];
                match s.read_exact(&mut b) {
                    Ok(()) => Answer::Yes,
                    Err(e) => Answer::No(format!("connected, no data: {e}")),
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Answer::Refused,
            Err(e) => Answer::No(e.to_string()),
        },
        Proto::Udp => {
            let bind: SocketAddr = if p.addr.is_ipv4() {
                "0.0.0.0:0".parse().expect("address")
            } else {
                "[::]:0".parse().expect("address")
            };
            let r = (|| -> std::io::Result<()> {
                let s = UdpSocket::bind(bind)?;
                s.connect(to)?;
                s.set_read_timeout(Some(timeout))?;
                s.send(b"p")?;
                let mut b = [0u8; 8];
                s.recv(&mut b).map(drop)
            })();
            match r {
                Ok(()) => Answer::Yes,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => Answer::Refused,
                Err(e) => Answer::No(e.to_string()),
            }
        }
        Proto::Icmp => {
            // iputils ping needs no raw-socket code here; the thread is already in `from`.
            let secs = timeout.as_secs().max(1).to_string();
            match Command::new("ping")
                .args(["-n", "-c1", "-W", &secs, &p.addr.to_string()])
                .output()
            {
                Ok(o) if o.status.success() => Answer::Yes,
                Ok(o) => Answer::No(
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .last()
                        .unwrap_or("")
                        .to_string(),
                ),
                Err(e) => Answer::No(format!("run ping: {e}")),
            }
        }
    }
}

/// Runs one probe on the calling thread (which it moves into `p.from`).
fn run_one(p: &Probe, deadline: Duration) -> Result<Duration, String> {
    enter_netns(&p.from)?;
    let start = Instant::now();
    let per_try = Duration::from_secs(1);
    match p.expect {
        Expect::Open => {
            let mut last;
            loop {
                match attempt(p, per_try) {
                    Answer::Yes => return Ok(start.elapsed()),
                    Answer::Refused => last = "refused".to_string(),
                    Answer::No(e) => last = e,
                }
                if start.elapsed() >= deadline {
                    return Err(format!("no answer within {deadline:?} (last: {last})"));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Expect::Closed => match attempt(p, deadline) {
            Answer::Yes => Err("answered, but must be blocked".into()),
            Answer::Refused => Err("refused: the packet got through (expected it dropped)".into()),
            Answer::No(_) => Ok(start.elapsed()),
        },
    }
}

/// Runs every probe in parallel; fails listing each probe that did not meet its expectation.
/// Returns how long each took, in order.
pub fn check_all(probes: &[Probe], deadline: Duration) -> Result<Vec<Duration>> {
    let handles: Vec<_> = probes
        .iter()
        .cloned()
        .map(|p| std::thread::spawn(move || run_one(&p, deadline)))
        .collect();
    let mut failed = Vec::new();
    let mut took = Vec::new();
    for (p, h) in probes.iter().zip(handles) {
        match h.join().unwrap_or_else(|_| Err("probe thread panicked".into())) {
            Ok(d) => took.push(d),
            Err(e) => failed.push(format!(
                "{} ({:?} {} -> {}:{}, expected {:?}): {e}",
                p.label, p.proto, p.from, p.addr, p.port, p.expect
            )),
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} probes failed:\n  {}",
            failed.len(),
            probes.len(),
            failed.join("\n  ")
        );
    }
    Ok(took)
}

/// One attempt per probe, all in parallel, each waiting at most `timeout`: whether each got
/// through (an answer, or a refusal: the packet reached the destination). `expect` is ignored;
/// callers that poll until a whole matrix matches use this instead of [`check_all`].
pub fn reach_once(probes: &[Probe], timeout: Duration) -> Vec<Result<bool, String>> {
    let handles: Vec<_> = probes
        .iter()
        .cloned()
        .map(|p| {
            std::thread::spawn(move || -> Result<bool, String> {
                enter_netns(&p.from)?;
                Ok(match attempt(&p, timeout) {
                    Answer::Yes | Answer::Refused => true,
                    Answer::No(_) => false,
                })
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("probe thread panicked".into())))
        .collect()
}

/// TCP and UDP servers on `port` (all addresses) in a namespace, answering every connection and
/// datagram with one byte (or a given reply) until dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(netns: &str, port: u16) -> Result<Self> {
        Self::start_replying(netns, port, "k")
    }

    /// A server whose answer is `reply` (e.g. the pod's name, to tell backends apart); a TCP
    /// connection is closed after it.
    pub fn start_replying(netns: &str, port: u16, reply: &str) -> Result<Self> {
        let reply: Arc<[u8]> = Arc::from(reply.as_bytes());
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<std::result::Result<(), String>>();
        let mut threads = Vec::new();
        {
            let (netns, stop, tx, reply) = (netns.to_string(), stop.clone(), tx.clone(), reply.clone());
            threads.push(std::thread::spawn(move || {
                let l = enter_netns(&netns).and_then(|()| {
                    let l =
                        TcpListener::bind(("::", port)).map_err(|e| format!("bind tcp [::]:{port}: {e}"))?;
                    l.set_nonblocking(true).map_err(|e| e.to_string())?;
                    Ok(l)
                });
                let l = match l {
                    Ok(l) => {
                        let _ = tx.send(Ok(()));
                        l
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut s, _)) => {
                            let _ = s.write_all(&reply);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }));
        }
        {
            let (netns, stop) = (netns.to_string(), stop.clone());
            let reply = reply.clone();
            threads.push(std::thread::spawn(move || {
                let s = enter_netns(&netns).and_then(|()| {
                    let s =
                        UdpSocket::bind(("::", port)).map_err(|e| format!("bind udp [::]:{port}: {e}"))?;
                    s.set_read_timeout(Some(Duration::from_millis(100)))
                        .map_err(|e| e.to_string())?;
                    Ok(s)
                });
                let s = match s {
                    Ok(s) => {
                        let _ = tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let mut b = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = s.recv_from(&mut b) {
                        let _ = s.send_to(&reply, from);
                    }
                }
            }));
        }
        let server = Self { stop, threads };
        for _ in 0..2 {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => bail!("server in {netns}: {e}"),
                Err(_) => bail!("server in {netns} did not start"),
            }
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `n` TCP connections, one after the other, from the namespace at `from` to `addr:port`, each
/// read to its end: per connection, what the server said or why there was no answer.
pub fn tcp_replies(
    from: &str,
    addr: IpAddr,
    port: u16,
    n: usize,
    timeout: Duration,
) -> Result<Vec<std::result::Result<String, String>>> {
    let from = from.to_string();
    let h = std::thread::spawn(move || -> std::result::Result<Vec<_>, String> {
        enter_netns(&from)?;
        let to = SocketAddr::new(addr, port);
        Ok((0..n)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(&to, timeout).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
                let mut out = String::new();
                s.read_to_string(&mut out).map_err(|e| format!("read: {e}"))?;
                Ok(out)
            })
            .collect())
    });
    match h.join() {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => bail!("tcp_replies to {addr}:{port}: {e}"),
        Err(_) => bail!("tcp_replies thread panicked"),
    }
}
