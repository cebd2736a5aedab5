//! A client of the OVSDB management protocol (RFC 7047): JSON-RPC 1.0 over
//! ovsdb-server's unix or TCP socket, one connection per binding operation,
//! every call bounded by one deadline. What the OVS binding needs of the
//! `Open_vSwitch` database, without starting an `ovs-vsctl` process that
//! reads the whole database for each command (os-vif's native interface does
//! the same from Python).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// The database every call names.
const DATABASE: &str = "Open_vSwitch";

/// Larger answers are refused: the binding only ever selects a few rows.
const MAX_MESSAGE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    /// The socket could not be reached, written or read.
    #[error("{db}: {source}")]
    Io {
        db: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{db}: no answer within {timeout:?}")]
    Timeout { db: String, timeout: Duration },
    /// An operation or the commit failed (RFC 7047 4.1.3: `error`, `details`).
    #[error("{error}: {details}")]
    Operation { error: String, details: String },
    /// What ovsdb-server sent is not what the protocol says.
    #[error("{0}")]
    Protocol(String),
    #[error("{0:?}: not an ovsdb connection this daemon can open (unix:PATH or tcp:HOST:PORT)")]
    Target(String),
}

impl OvsdbError {
    /// The server did not answer, could not be reached or went away (as
    /// opposed to refusing what it was asked, or a connection string to fix).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Io { .. } | Self::Timeout { .. })
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection to ovsdb-server.
pub struct Ovsdb {
    db: String,
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    next_id: u64,
    timeout: Duration,
    deadline: Instant,
}

impl Ovsdb {
    /// Connects to `db` (`unix:PATH` or `tcp:HOST:PORT`); everything done on
    /// the connection ends within `timeout` from now.
    pub async fn connect(db: &str, timeout: Duration) -> Result<Self, OvsdbError> {
        let deadline = Instant::now() + timeout;
        let io = |source| OvsdbError::Io {
            db: db.to_string(),
            source,
        };
        let late = || OvsdbError::Timeout {
            db: db.to_string(),
            timeout,
        };
        let stream: Box<dyn Stream> = if let Some(path) = db.strip_prefix("unix:") {
            let s = tokio::time::timeout_at(deadline, tokio::net::UnixStream::connect(path))
                .await
                .map_err(|_| late())?
                .map_err(io)?;
            Box::new(s)
        } else if let Some(addr) = db.strip_prefix("tcp:") {
            let s = tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| late())?
                .map_err(io)?;
            // Small requests and answers: no Nagle delay.
            let _ = s.set_nodelay(true);
            Box::new(s)
        } else {
            return Err(OvsdbError::Target(db.to_string()));
        };
        Ok(Self {
            db: db.to_string(),
            stream,
            buf: Vec::new(),
            next_id: 0,
            timeout,
            deadline,
        })
    }

    fn io(&self, source: std::io::Error) -> OvsdbError {
        OvsdbError::Io {
            db: self.db.clone(),
            source,
        }
    }

    fn late(&self) -> OvsdbError {
        OvsdbError::Timeout {
            db: self.db.clone(),
            timeout: self.timeout,
        }
    }

    /// The databases the server has.
    pub async fn list_dbs(&mut self) -> Result<Vec<String>, OvsdbError> {
        let result = self.call("list_dbs", json!([])).await?;
        serde_json::from_value(result).map_err(|e| OvsdbError::Protocol(format!("list_dbs answer: {e}")))
    }

    /// Runs `ops` as one transaction on the `Open_vSwitch` database: all of
    /// them or none. The results, one per operation.
    pub async fn transact(&mut self, ops: Vec<Value>) -> Result<Vec<Value>, OvsdbError> {
        let count = ops.len();
        let mut params = Vec::with_capacity(count + 1);
        params.push(json!(DATABASE));
        params.extend(ops);
        let Value::Array(results) = self.call("transact", Value::Array(params)).await? else {
            return Err(OvsdbError::Protocol("transact answer is not an array".into()));
        };
        // A failed operation has an `error` member and the ones after it are
        // null; a failed commit adds one result more, with its `error`.
        if let Some(failed) = results.iter().find(|r| r.get("error").is_some()) {
            return Err(OvsdbError::Operation {
                error: failed["error"].as_str().unwrap_or("error").to_string(),
                details: failed["details"].as_str().unwrap_or_default().to_string(),
            });
        }
        if results.len() < count {
            return Err(OvsdbError::Protocol(format!(
                "transact answered {} results for {count} operations",
                results.len()
            )));
        }
        Ok(results)
    }

    /// Runs `ops` as one transaction and waits for ovs-vswitchd to apply it
    /// (as `ovs-vsctl` does unless told `--no-wait`): `next_cfg` counted up in
    /// the same transaction and read back, then [`Ovsdb::wait_applied`]. The
    /// results of `ops`, one per operation.
    pub async fn transact_applied(&mut self, mut ops: Vec<Value>) -> Result<Vec<Value>, OvsdbError> {
        let count = ops.len();
        ops.push(json!({"op": "mutate", "table": "Open_vSwitch", "where": [],
            "mutations": [["next_cfg", "+=", 1]]}));
        ops.push(select("Open_vSwitch", json!([]), &["next_cfg"]));
        let mut results = self.transact(ops).await?;
        let cfg = first_row(&results[count + 1])
            .and_then(|r| r["next_cfg"].as_i64())
            .unwrap_or_default();
        self.wait_applied(cfg).await?;
        results.truncate(count);
        Ok(results)
    }

    /// Waits until ovs-vswitchd has applied the configuration numbered `cfg`
    /// (the `next_cfg` a transaction set): `cur_cfg` catches up with it.
    pub async fn wait_applied(&mut self, cfg: i64) -> Result<(), OvsdbError> {
        let mut pause = Duration::from_millis(1);
        loop {
            let rows = self
                .transact(vec![select("Open_vSwitch", json!([]), &["cur_cfg"])])
                .await?;
            let cur = first_row(&rows[0])
                .and_then(|r| r["cur_cfg"].as_i64())
                .unwrap_or_default();
            if cur >= cfg {
                return Ok(());
            }
            if Instant::now() + pause >= self.deadline {
                return Err(OvsdbError::Protocol(format!(
                    "ovs-vswitchd did not apply the change within {:?} (cur_cfg {cur}, waiting for {cfg})",
                    self.timeout
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, OvsdbError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"method": method, "params": params, "id": id}))
            .await?;
        loop {
            let mut msg = self.recv().await?;
            if let Some(m) = msg.get("method") {
                // The server's own requests: its inactivity probe wants an
                // answer; notifications (no id) want none.
                if m == "echo" && !msg["id"].is_null() {
                    let reply = json!({"result": msg["params"], "error": null, "id": msg["id"]});
                    self.send(&reply).await?;
                }
                continue;
            }
            if msg.get("id") != Some(&json!(id)) {
                continue;
            }
            if !msg["error"].is_null() {
                return Err(OvsdbError::Protocol(format!("{method}: {}", msg["error"])));
            }
            return Ok(msg["result"].take());
        }
    }

    async fn send(&mut self, msg: &Value) -> Result<(), OvsdbError> {
        let bytes = serde_json::to_vec(msg).map_err(|e| OvsdbError::Protocol(e.to_string()))?;
        match tokio::time::timeout_at(self.deadline, self.stream.write_all(&bytes)).await {
            Ok(r) => r.map_err(|e| self.io(e)),
            Err(_) => Err(self.late()),
        }
    }

    /// The next JSON value on the stream (messages are concatenated values,
    /// with no framing of their own).
    async fn recv(&mut self) -> Result<Value, OvsdbError> {
        loop {
            let mut values = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            match values.next() {
                Some(Ok(v)) => {
                    let used = values.byte_offset();
                    self.buf.drain(..used);
                    return Ok(v);
                }
                Some(Err(e)) if e.is_eof() => {}
                Some(Err(e)) => {
                    return Err(OvsdbError::Protocol(format!(
                        "malformed JSON from ovsdb-server: {e}"
                    )));
                }
                // Only whitespace so far.
                None => self.buf.clear(),
            }
            if self.buf.len() > MAX_MESSAGE {
                return Err(OvsdbError::Protocol(format!(
                    "an answer of more than {MAX_MESSAGE} bytes"
                )));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = match tokio::time::timeout_at(self.deadline, self.stream.read(&mut chunk)).await {
                Ok(r) => r.map_err(|e| self.io(e))?,
                Err(_) => return Err(self.late()),
            };
            if n == 0 {
                // A restarting server: unreachable, as for a refused connect.
                return Err(self.io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "ovsdb-server closed the connection",
                )));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// `select` of `columns` of the rows of `table` matching `conditions`.
pub fn select(table: &str, conditions: Value, columns: &[&str]) -> Value {
    json!({"op": "select", "table": table, "where": conditions, "columns": columns})
}

/// The condition `column == value`.
pub fn eq(column: &str, value: Value) -> Value {
    json!([column, "==", value])
}

/// A uuid datum.
pub fn uuid(id: &str) -> Value {
    json!(["uuid", id])
}

/// A reference to a row inserted earlier in the same transaction.
pub fn named(name: &str) -> Value {
    json!(["named-uuid", name])
}

/// A string-to-string map datum.
pub fn string_map<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
    let pairs: Vec<Value> = pairs.into_iter().map(|(k, v)| json!([k, v])).collect();
    json!(["map", pairs])
}

/// The rows a `select` result holds.
pub fn rows(result: &Value) -> &[Value] {
    result["rows"].as_array().map_or(&[], Vec::as_slice)
}

pub fn first_row(result: &Value) -> Option<&Value> {
    rows(result).first()
}

/// A row's `_uuid`.
pub fn row_uuid(row: &Value) -> Option<&str> {
    match row["_uuid"].as_array().map(Vec::as_slice) {
        Some([kind, id]) if kind == "uuid" => id.as_str(),
        _ => None,
    }
}

/// An optional string column (`["set", []]` when empty) as a string, empty
/// when unset.
pub fn optional_string(datum: &Value) -> &str {
    datum.as_str().unwrap_or_default()
}

/// The value of `key` in a string map datum.
pub fn map_get<'a>(datum: &'a Value, key: &str) -> Option<&'a str> {
    let pairs = match datum.as_array().map(Vec::as_slice) {
        Some([kind, pairs]) if kind == "map" => pairs.as_array()?,
        _ => return None,
    };
    pairs.iter().find_map(|p| match p.as_array().map(Vec::as_slice) {
        Some([k, v]) if k == key => v.as_str(),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that meets each request with an echo request of its own and,
    /// once the client answered that, answers with `answer(request)`; all it
    /// writes goes in pieces of `split` bytes.
    async fn fake_server(answer: fn(&Value) -> Value, split: usize) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut read = tokio::io::BufReader::new(read);
            let mut pending = Vec::new();
            let mut byte = [0u8; 1];
            let mut depth = 0i32;
            let mut waiting: Option<Value> = None;
            loop {
                // The client sends one compact object per call, with no
                // braces in its strings here: read by their depth.
                if read.read_exact(&mut byte).await.is_err() {
                    return;
                }
                pending.push(byte[0]);
                match byte[0] {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    _ => {}
                }
                if depth != 0 {
                    continue;
                }
                let msg: Value = serde_json::from_slice(&pending).unwrap();
                pending.clear();
                let out = match waiting.take() {
                    None => {
                        waiting = Some(json!({"id": msg["id"], "error": null, "result": answer(&msg)}));
                        json!({"method": "echo", "params": ["x"], "id": "echo"})
                    }
                    // Only the answer to the echo lets the reply go.
                    Some(reply) if msg["id"] == "echo" && msg["result"] == json!(["x"]) => reply,
                    Some(_) => return,
                };
                let mut bytes = serde_json::to_vec(&out).unwrap();
                bytes.extend(b"\n  ");
                for piece in bytes.chunks(split) {
                    write.write_all(piece).await.unwrap();
                    write.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
        });
        (dir, format!("unix:{}", path.display()))
    }

    #[tokio::test]
    async fn answers_split_anywhere_and_interleaved_echoes_are_read_whole() {
        for split in [1, 3, 7, 4096] {
            let (_dir, db) = fake_server(|_| json!(["Open_vSwitch", "_Server"]), split).await;
            let mut c = Ovsdb::connect(&db, Duration::from_secs(5)).await.unwrap();
            assert_eq!(
                c.list_dbs().await.unwrap(),
                ["Open_vSwitch", "_Server"],
                "split {split}"
            );
            // A second call on the same connection gets its own answer.
            assert_eq!(c.list_dbs().await.unwrap().len(), 2, "split {split}");
        }
    }

    #[tokio::test]
    async fn a_failed_operation_is_an_error_naming_it() {
        let (_dir, db) = fake_server(
            |_| json!([{"count": 1}, {"error": "constraint violation", "details": "Transaction causes multiple rows in \"Port\" table to have identical values"}, null]),
            4096,
        )
        .await;
        let mut c = Ovsdb::connect(&db, Duration::from_secs(5)).await.unwrap();
        let err = c
            .transact(vec![
                json!({"op": "comment", "comment": "a"}),
                json!({"op": "comment", "comment": "b"}),
            ])
            .await
            .unwrap_err();
        match &err {
            OvsdbError::Operation { error, details } => {
                assert_eq!(error, "constraint violation");
                assert!(details.contains("identical values"), "{details}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!err.is_unreachable());
    }

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_at_once_and_other_schemes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("unix:{}/db.sock", dir.path().display());
        let started = std::time::Instant::now();
        let err = Ovsdb::connect(&db, Duration::from_secs(10)).await.err().unwrap();
        assert!(err.is_unreachable(), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let err = Ovsdb::connect("ssl:127.0.0.1:6640", Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, OvsdbError::Target(_)), "{err}");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let db = format!("unix:{}", path.display());
        let mut c = Ovsdb::connect(&db, Duration::from_millis(300)).await.unwrap();
        let err = c.list_dbs().await.unwrap_err();
        assert!(matches!(err, OvsdbError::Timeout { .. }), "{err}");
        hold.abort();
    }

    #[test]
    fn datums_read_as_ovsdb_writes_them() {
        let row = json!({"_uuid": ["uuid", "4f6c"], "error": ["set", []], "external_ids": ["map", [["iface-id", "p1"], ["vm-uuid", "u"]]]});
        assert_eq!(row_uuid(&row), Some("4f6c"));
        assert_eq!(optional_string(&row["error"]), "");
        assert_eq!(
            optional_string(&json!("could not open network device")),
            "could not open network device"
        );
        assert_eq!(map_get(&row["external_ids"], "iface-id"), Some("p1"));
        assert_eq!(map_get(&row["external_ids"], "attached-mac"), None);
        assert_eq!(string_map([("a", "1")]), json!(["map", [["a", "1"]]]));
    }
}
