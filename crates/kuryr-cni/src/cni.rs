//! CNI protocol handling: env, netconf, commands, results, errors.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::http::{self, Endpoint, HttpError};

pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const DEFAULT_DAEMON: &str = "127.0.0.1:5036";
/// How long the plugin waits for the daemon's answer unless `kuryr_daemon_timeout` says. The
/// daemon's worst ADD is twice `vif_annotation_timeout` (60 s: the VIFs, then their activation),
/// its timeout Event and the plug: 180 s leaves the plug ~55 s and still fits the kubelet's 4 minute
/// sandbox deadline. The plugin sends the timeout it uses (`config_kuryr.kuryr_daemon_timeout`)
/// and the daemon ends its waits before it (3 s before, less for a short timeout), so its 504 and
/// Warning Event reach the runtime instead of a hang-up, also with a raised
/// `vif_annotation_timeout`; only a plug slower than that margin could still be cut off.
/// (Upstream's plugin had no timeout at all.)
pub const DEFAULT_TIMEOUT_SECS: u64 = 180;
// The kubelet gives RunPodSandbox twice its 2 minute runtime-request-timeout.
const _: () = assert!(DEFAULT_TIMEOUT_SECS < 240);
/// The shortest and longest `kuryr_daemon_timeout` taken, in seconds.
pub const MIN_TIMEOUT_SECS: f64 = 0.001;
pub const MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// CNI error codes (spec) and upstream kuryr's own.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const POD_GONE: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const DECODE: u32 = 6;
    pub const INVALID_NETCONF: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    pub const INTERNAL: u32 = 999;
}

#[derive(Debug)]
pub struct CniError {
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    fn new(version: &str, code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            cni_version: version.to_string(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"cniVersion": self.cni_version, "code": self.code, "msg": self.msg, "details": self.details})
    }
}

/// The CNI_* environment.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub command: Option<String>,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub path: Option<String>,
}

impl Env {
    pub fn from_process() -> Self {
        let get = |k: &str| std::env::var(k).ok();
        Self {
            command: get("CNI_COMMAND"),
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            path: get("CNI_PATH"),
        }
    }
}

fn version_rank(v: &str) -> Option<usize> {
    SUPPORTED_VERSIONS.iter().position(|s| *s == v)
}

/// Run one CNI command; `Ok(None)` means success with no output.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    let latest = SUPPORTED_VERSIONS[SUPPORTED_VERSIONS.len() - 1];
    let command = env.command.as_deref().unwrap_or_default();
    let netconf: Value = if stdin.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                latest,
                code::DECODE,
                "cannot decode the network configuration on stdin",
                e.to_string(),
            )
        })?
    };
    let Some(conf) = netconf.as_object() else {
        return Err(CniError::new(
            latest,
            code::INVALID_NETCONF,
            "the network configuration must be a JSON object",
            "",
        ));
    };
    if command == "VERSION" {
        return Ok(Some(
            json!({"cniVersion": latest, "supportedVersions": SUPPORTED_VERSIONS}),
        ));
    }
    let version = match conf.get("cniVersion") {
        Some(Value::String(v)) => v.clone(),
        Some(_) => {
            return Err(CniError::new(
                latest,
                code::INVALID_NETCONF,
                "cniVersion must be a string",
                "",
            ));
        }
        None => {
            return Err(CniError::new(
                latest,
                code::INVALID_NETCONF,
                "cniVersion is missing from the network configuration",
                "",
            ));
        }
    };
    let Some(rank) = version_rank(&version) else {
        return Err(CniError::new(
            latest,
            code::INCOMPATIBLE_VERSION,
            format!("CNI version {version} is not supported"),
            format!("supported: {}", SUPPORTED_VERSIONS.join(", ")),
        ));
    };
    let v = version.as_str();
    let needs = |min: &str, what: &str| -> Result<(), CniError> {
        match version_rank(min) {
            Some(m) if rank >= m => Ok(()),
            _ => Err(CniError::new(
                v,
                code::INCOMPATIBLE_VERSION,
                format!("{what} needs CNI version {min} or later, netconf has {v}"),
                "",
            )),
        }
    };
    let endpoint = match conf.get("kuryr_daemon") {
        None => Endpoint::Tcp(DEFAULT_DAEMON.into()),
        Some(Value::String(s)) => {
            Endpoint::parse(s).map_err(|e| CniError::new(v, code::INVALID_NETCONF, e, ""))?
        }
        Some(_) => {
            return Err(CniError::new(
                v,
                code::INVALID_NETCONF,
                "kuryr_daemon must be a string",
                "",
            ));
        }
    };
    let timeout = match conf.get("kuryr_daemon_timeout") {
        None => Duration::from_secs(DEFAULT_TIMEOUT_SECS),
        Some(t) => match t.as_f64() {
            // A zero timeout would be refused by the socket calls (reported as "try again",
            // forever); one of centuries overflows the deadline.
            Some(s) if (MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(&s) => Duration::from_secs_f64(s),
            _ => {
                return Err(CniError::new(
                    v,
                    code::INVALID_NETCONF,
                    format!(
                        "kuryr_daemon_timeout must be a number of seconds from {MIN_TIMEOUT_SECS} to {MAX_TIMEOUT_SECS}"
                    ),
                    "",
                ));
            }
        },
    };
    // The daemon bounds its ADD to answer within the timeout given (see DEFAULT_TIMEOUT_SECS).
    let mut sent = netconf.clone();
    if let Some(o) = sent.as_object_mut() {
        o.entry("kuryr_daemon_timeout")
            .or_insert_with(|| json!(timeout.as_secs_f64()));
    }
    let client = Client {
        endpoint,
        timeout,
        version: v,
    };

    match command {
        "ADD" => {
            require(env, v, &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
            let resp = client.post("/addNetwork?all=1", &params(env, &sent))?;
            let body: Value = serde_json::from_slice(&resp).map_err(|e| {
                CniError::new(
                    v,
                    code::INTERNAL,
                    "the daemon's ADD answer is not JSON",
                    e.to_string(),
                )
            })?;
            let result = cni_result(&body, env, v)
                .map_err(|e| CniError::new(v, code::INTERNAL, "cannot build the CNI result", e))?;
            Ok(Some(result))
        }
        "DEL" => {
            require(env, v, &["CNI_CONTAINERID", "CNI_IFNAME"])?;
            client.post("/delNetwork", &params(env, &sent))?;
            Ok(None)
        }
        "CHECK" => {
            needs("0.4.0", "CHECK")?;
            require(env, v, &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
            client.post("/checkNetwork", &params(env, &sent))?;
            Ok(None)
        }
        "STATUS" => {
            needs("1.1.0", "STATUS")?;
            client
                .post("/status", &params(env, &sent))
                .map_err(|e| CniError {
                    code: code::PLUGIN_NOT_AVAILABLE,
                    msg: format!("kuryr daemon not ready: {}", e.msg),
                    ..e
                })?;
            Ok(None)
        }
        "GC" => {
            needs("1.1.0", "GC")?;
            client.post("/gc", &params(env, &sent))?;
            Ok(None)
        }
        "" => Err(CniError::new(v, code::INVALID_ENV, "CNI_COMMAND is not set", "")),
        other => Err(CniError::new(
            v,
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
            "",
        )),
    }
}

fn require(env: &Env, v: &str, names: &[&str]) -> Result<(), CniError> {
    for name in names {
        let val = match *name {
            "CNI_CONTAINERID" => &env.container_id,
            "CNI_NETNS" => &env.netns,
            "CNI_IFNAME" => &env.ifname,
            _ => &None,
        };
        if val.as_deref().is_none_or(str::is_empty) {
            return Err(CniError::new(
                v,
                code::INVALID_ENV,
                format!("required environment variable {name} is not set"),
                "",
            ));
        }
    }
    Ok(())
}

/// The request body, with upstream's exact keys.
fn params(env: &Env, netconf: &Value) -> Value {
    let s = |o: &Option<String>| o.clone().unwrap_or_default();
    json!({
        "CNI_IFNAME": s(&env.ifname),
        "CNI_NETNS": s(&env.netns),
        "CNI_PATH": s(&env.path),
        "CNI_COMMAND": s(&env.command),
        "CNI_CONTAINERID": s(&env.container_id),
        "CNI_ARGS": s(&env.args),
        "config_kuryr": netconf,
    })
}

struct Client<'a> {
    endpoint: Endpoint,
    timeout: Duration,
    version: &'a str,
}

impl Client<'_> {
    fn post(&self, path: &str, body: &Value) -> Result<Vec<u8>, CniError> {
        let v = self.version;
        let bytes = serde_json::to_vec(body)
            .map_err(|e| CniError::new(v, code::INTERNAL, "cannot encode the request", e.to_string()))?;
        let resp =
            http::request(&self.endpoint, "POST", path, Some(&bytes), self.timeout).map_err(|e| match e {
                // The daemon may be starting or overloaded: the runtime retries.
                HttpError::Connect(_) | HttpError::Timeout(_) => {
                    CniError::new(v, code::TRY_AGAIN_LATER, "Try Again Later", e.to_string())
                }
                HttpError::Protocol(_) => {
                    CniError::new(v, code::INTERNAL, "kuryr daemon answered garbage", e.to_string())
                }
            })?;
        if (200..300).contains(&resp.status) {
            return Ok(resp.body);
        }
        // Daemon error body {"code","msg","details"}; tolerate anything else.
        let err: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        let code = err
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(match resp.status {
                400 => code::INVALID_ENV,
                410 => code::POD_GONE,
                504 => code::TRY_AGAIN_LATER,
                _ => code::INTERNAL,
            });
        let msg = err
            .get("msg")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("kuryr daemon answered HTTP {}", resp.status));
        let details = match err.get("details") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::from_utf8_lossy(&resp.body).into_owned(),
        };
        Err(CniError::new(v, code, msg, details))
    }
}

/// Turn the daemon's answer into a CNI result of version `v`.
///
/// kuryr-rs daemons answer `?all=1` with `{"vif": <eth0 VIF>, "result":
/// {interfaces, ips, routes, dns}}` (CNI 1.0 shape, every interface). An
/// upstream daemon ignores the query and answers the bare eth0 VIF; we then
/// build the result from that VIF alone.
pub fn cni_result(body: &Value, env: &Env, v: &str) -> Result<Value, String> {
    let mut result = match body.get("result") {
        Some(Value::Object(r)) => r.clone(),
        Some(_) => return Err("\"result\" is not an object".into()),
        None => result_from_vif(body, env)?,
    };
    let old = version_rank(v).unwrap_or(0) < version_rank("1.0.0").unwrap_or(0);
    if old && let Some(Value::Array(ips)) = result.get_mut("ips") {
        for ip in ips.iter_mut() {
            let fam = ip
                .get("address")
                .and_then(Value::as_str)
                .map(|a| if a.contains(':') { "6" } else { "4" });
            if let (Some(fam), Some(obj)) = (fam, ip.as_object_mut()) {
                obj.insert("version".into(), Value::String(fam.into()));
            }
        }
    }
    result.insert("cniVersion".into(), Value::String(v.into()));
    Ok(Value::Object(result))
}

/// os-vif lists: `{"versioned_object.data": {"objects": [...]}}`.
fn ovo_list(v: Option<&Value>) -> Vec<&Value> {
    v.and_then(|l| l.get("versioned_object.data"))
        .and_then(|d| d.get("objects"))
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn ovo_data(v: &Value) -> Option<&Value> {
    v.get("versioned_object.data")
}

fn result_from_vif(vif: &Value, env: &Env) -> Result<Map<String, Value>, String> {
    let data =
        ovo_data(vif).ok_or("the daemon's answer has neither \"result\" nor \"versioned_object.data\"")?;
    let network = data.get("network").and_then(ovo_data);
    let mut iface = Map::new();
    iface.insert(
        "name".into(),
        json!(env.ifname.clone().unwrap_or_else(|| "eth0".into())),
    );
    if let Some(mac) = data.get("address").and_then(Value::as_str) {
        iface.insert("mac".into(), json!(mac));
    }
    if let Some(mtu) = network.and_then(|n| n.get("mtu")).and_then(Value::as_u64) {
        iface.insert("mtu".into(), json!(mtu));
    }
    iface.insert("sandbox".into(), json!(env.netns.clone().unwrap_or_default()));
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    let mut dns = Vec::new();
    let (mut v4_default, mut v6_default) = (false, false);
    for subnet in ovo_list(network.and_then(|n| n.get("subnets"))) {
        let Some(s) = ovo_data(subnet) else { continue };
        let cidr = s
            .get("cidr")
            .and_then(Value::as_str)
            .ok_or("a subnet has no cidr")?;
        let prefix = cidr
            .split_once('/')
            .map(|(_, p)| p)
            .ok_or_else(|| format!("subnet cidr {cidr:?} has no prefix length"))?;
        // A subnet without a gateway is valid: no gateway, no default route.
        let gateway = s.get("gateway").and_then(Value::as_str);
        for ip in ovo_list(s.get("ips")) {
            let Some(addr) = ovo_data(ip)
                .and_then(|d| d.get("address"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            let mut entry = json!({"address": format!("{addr}/{prefix}"), "interface": 0});
            if let Some(gw) = gateway {
                entry["gateway"] = json!(gw);
            }
            ips.push(entry);
        }
        if let Some(gw) = gateway {
            let v6 = gw.contains(':');
            let done = if v6 { &mut v6_default } else { &mut v4_default };
            if !*done {
                routes.push(json!({"dst": if v6 { "::/0" } else { "0.0.0.0/0" }, "gw": gw}));
                *done = true;
            }
        }
        for r in ovo_list(s.get("routes")) {
            if let Some(rd) = ovo_data(r) {
                let mut route = json!({"dst": rd.get("cidr").cloned().unwrap_or(Value::Null)});
                if let Some(gw) = rd.get("gateway").filter(|g| !g.is_null()) {
                    route["gw"] = gw.clone();
                }
                routes.push(route);
            }
        }
        if let Some(d) = s.get("dns").and_then(Value::as_array) {
            dns.extend(d.iter().cloned());
        }
    }
    let mut out = Map::new();
    out.insert("interfaces".into(), json!([iface]));
    out.insert("ips".into(), json!(ips));
    out.insert("routes".into(), json!(routes));
    out.insert("dns".into(), json!({"nameservers": dns}));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(cmd: &str) -> Env {
        Env {
            command: Some(cmd.into()),
            container_id: Some("c1".into()),
            netns: Some("/var/run/netns/x".into()),
            ifname: Some("eth0".into()),
            args: Some("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p".into()),
            path: Some("/opt/cni/bin".into()),
        }
    }

    #[test]
    fn version_and_bad_inputs_never_panic() {
        let v = run(&env("VERSION"), b"").ok().flatten();
        assert_eq!(
            v.as_ref()
                .and_then(|v| v["supportedVersions"].as_array())
                .map(Vec::len),
            Some(5)
        );
        let e = run(&env("ADD"), b"not json").err().map(|e| e.code);
        assert_eq!(e, Some(code::DECODE));
        let e = run(&env("ADD"), br#"{"name":"k"}"#).err().map(|e| e.code);
        assert_eq!(e, Some(code::INVALID_NETCONF));
        let e = run(&env("ADD"), br#"{"cniVersion":"0.2.0"}"#)
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(code::INCOMPATIBLE_VERSION));
        let e = run(&env("CHECK"), br#"{"cniVersion":"0.3.1"}"#)
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(code::INCOMPATIBLE_VERSION));
        let e = run(&env("GC"), br#"{"cniVersion":"1.0.0"}"#)
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(code::INCOMPATIBLE_VERSION));
        let mut missing = env("ADD");
        missing.netns = None;
        let e = run(&missing, br#"{"cniVersion":"1.0.0"}"#).err();
        assert_eq!(e.as_ref().map(|e| e.code), Some(code::INVALID_ENV));
        assert!(e.map(|e| e.msg).unwrap_or_default().contains("CNI_NETNS"));
        let e = run(&env("ADD"), br#"{"cniVersion":"1.0.0","kuryr_daemon":5}"#)
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(code::INVALID_NETCONF));
        let e = run(&env("BOGUS"), br#"{"cniVersion":"1.0.0"}"#)
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(code::INVALID_ENV));
    }

    #[test]
    fn a_timeout_out_of_range_is_a_bad_netconf_naming_it() {
        for t in ["1e20", "1e-12", "0", "-1", "\"60\""] {
            let conf = format!(r#"{{"cniVersion":"1.0.0","kuryr_daemon_timeout":{t}}}"#);
            let e = run(&env("ADD"), conf.as_bytes()).err();
            assert_eq!(
                e.as_ref().map(|e| e.code),
                Some(code::INVALID_NETCONF),
                "{t}: {e:?}"
            );
            let msg = e.map(|e| e.msg).unwrap_or_default();
            assert!(msg.contains("kuryr_daemon_timeout"), "{t}: {msg}");
        }
    }

    /// The body of the one request `run` sends for `conf` to a stand-in daemon that answers 500.
    fn sent_body(conf: &Value) -> Value {
        use std::io::{Read, Write};
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sock = std::env::temp_dir().join(format!("kuryr-cni-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind a stand-in daemon");
        let daemon = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("the plugin connects");
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // Connection: close on both sides: the request is whole once its body is.
            loop {
                let k = c.read(&mut buf).unwrap_or(0);
                req.extend_from_slice(&buf[..k]);
                let text = String::from_utf8_lossy(&req).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= len || k == 0 {
                        let _ = c.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
                        return serde_json::from_str::<Value>(body).unwrap_or(Value::Null);
                    }
                }
                if k == 0 {
                    return Value::Null;
                }
            }
        });
        let mut conf = conf.clone();
        conf["kuryr_daemon"] = json!(format!("unix://{}", sock.display()));
        let answer = run(&env("ADD"), conf.to_string().as_bytes());
        assert!(answer.is_err(), "the stand-in answers 500");
        let body = daemon.join().unwrap_or(Value::Null);
        let _ = std::fs::remove_file(&sock);
        body
    }

    #[test]
    fn the_daemon_is_told_how_long_the_plugin_waits() {
        let body = sent_body(&json!({"cniVersion": "1.0.0"}));
        assert_eq!(
            body["config_kuryr"]["kuryr_daemon_timeout"].as_f64(),
            Some(DEFAULT_TIMEOUT_SECS as f64),
            "{body}"
        );
        let body = sent_body(&json!({"cniVersion": "1.0.0", "kuryr_daemon_timeout": 7.5}));
        assert_eq!(
            body["config_kuryr"]["kuryr_daemon_timeout"].as_f64(),
            Some(7.5),
            "{body}"
        );
    }

    #[test]
    fn the_default_timeout_outlasts_the_daemons_worst_add() {
        // The daemon's worst ADD with its defaults: the VIFs, then their activation, each up to
        // vif_annotation_timeout, then its timeout Event (2 s) and the answer's way back.
        let vif = kuryr_daemon::DaemonConfig::new("n").vif_annotation_timeout;
        let worst = 2 * vif.as_secs() + 5;
        assert!(
            DEFAULT_TIMEOUT_SECS > worst,
            "{DEFAULT_TIMEOUT_SECS} s <= {worst} s"
        );
    }

    #[test]
    fn unreachable_daemon_is_try_again_later() {
        let conf = br#"{"cniVersion":"1.0.0","kuryr_daemon":"unix:///nonexistent/kuryr.sock"}"#;
        let e = run(&env("ADD"), conf).err().map(|e| e.code);
        assert_eq!(e, Some(code::TRY_AGAIN_LATER));
        let e = run(
            &env("STATUS"),
            br#"{"cniVersion":"1.1.0","kuryr_daemon":"/nonexistent.sock"}"#,
        )
        .err()
        .map(|e| e.code);
        assert_eq!(e, Some(code::PLUGIN_NOT_AVAILABLE));
    }

    #[test]
    fn upstream_vif_body_becomes_a_result_even_without_gateway() {
        let vif = json!({
          "versioned_object.name": "VIFOpenVSwitch", "versioned_object.namespace": "os_vif", "versioned_object.version": "1.0",
          "versioned_object.data": {"address": "fa:16:3e:00:00:01", "id": "p1",
            "network": {"versioned_object.data": {"mtu": 1450, "subnets": {"versioned_object.data": {"objects": [
              {"versioned_object.data": {"cidr": "10.0.0.0/24", "dns": [],
                "ips": {"versioned_object.data": {"objects": [{"versioned_object.data": {"address": "10.0.0.5"}}]}},
                "routes": {"versioned_object.data": {"objects": []}}}},
              {"versioned_object.data": {"cidr": "fd00::/64", "gateway": "fd00::1", "dns": [],
                "ips": {"versioned_object.data": {"objects": [{"versioned_object.data": {"address": "fd00::5"}}]}},
                "routes": {"versioned_object.data": {"objects": []}}}}
            ]}}}}}
        });
        let r = cni_result(&vif, &env("ADD"), "0.3.1").unwrap_or_default();
        assert_eq!(r["cniVersion"], "0.3.1");
        assert_eq!(r["ips"][0]["address"], "10.0.0.5/24");
        assert_eq!(r["ips"][0]["version"], "4");
        assert!(r["ips"][0].get("gateway").is_none());
        assert_eq!(r["ips"][1]["version"], "6");
        assert_eq!(r["routes"], json!([{"dst": "::/0", "gw": "fd00::1"}]));
        assert_eq!(r["interfaces"][0]["mtu"], 1450);
        let r1 = cni_result(&vif, &env("ADD"), "1.0.0").unwrap_or_default();
        assert!(r1["ips"][0].get("version").is_none());
    }
}
