//! The soak's nodes: per node a network namespace with a Linux bridge `br-int` (the node's
//! integration bridge; `[binding] ovs_plug_mode = linux_bridge`), and the CNI daemon as a
//! process in it (`kuryr daemon`, this same binary), reaching the Kubernetes API through a
//! proxy into the namespace. The kubelet stand-in starts each pod as a kubelet does: a network
//! namespace of its own and a CNI ADD to its node's daemon (over the daemon's unix socket); a
//! deleted pod gets its CNI DEL (retried while the daemon is down, as kubelet retries
//! StopPodSandbox) and its namespace removed.
//!
//! Needs root and network namespaces; [`probe`] says why when they are not there.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube_emulator::netns::relay_from_netns;
use kube_emulator::standins::{SetupFn, TeardownFn};
use kuryr_crds::Vif;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::procs::Proc;

const BRIDGE: &str = "br-int";
/// A CNI ADD waits for the pod's port (the daemon's `vif_annotation_timeout`) and a little more.
const ADD_TIMEOUT: Duration = Duration::from_secs(100);
/// How long a deleted pod's CNI DEL is retried (the daemon may be down meanwhile).
const DEL_RETRY_FOR: Duration = Duration::from_secs(180);

/// Whether this machine lets the soak run node daemons: root, `ip netns`, veth and bridges.
pub fn probe() -> Result<(), String> {
    let ns = format!("kchaos-probe-{}", std::process::id());
    ip(&["netns", "add", &ns]).map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let bridge = ip(&["-n", &ns, "link", "add", BRIDGE, "type", "bridge"])
        .map_err(|e| format!("cannot create a Linux bridge in a network namespace: {e}"));
    let _ = ip(&["netns", "del", &ns]);
    bridge.map(|_| ())
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip").args(args).output().context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One node: its namespace, its daemon and the API proxy into the namespace.
pub struct Node {
    pub name: String,
    netns: String,
    socket: PathBuf,
    pub daemon: Proc,
    proxy: tokio::task::JoinHandle<()>,
}

/// The soak's nodes and the pod namespaces they run.
pub struct Nodes {
    pub nodes: Vec<Node>,
    /// Prefix of the pods' namespace names (`<prefix><pod uid>`), unique to this run.
    pod_prefix: String,
}

impl Nodes {
    /// Creates the namespaces and starts a daemon on each of `names`, its API reached through
    /// a proxy to `api`; configuration, sockets and logs go to `dir`.
    pub async fn start(names: &[&str], api: SocketAddr, dir: &Path) -> anyhow::Result<Self> {
        let run = std::process::id();
        let mut nodes = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let netns = format!("kchaos{run}n{i}");
            ip(&["netns", "add", &netns])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            ip(&["-n", &netns, "link", "add", BRIDGE, "type", "bridge"])?;
            ip(&["-n", &netns, "link", "set", BRIDGE, "up"])?;
            let (proxy_addr, proxy) = relay_from_netns(&format!("/var/run/netns/{netns}"), api)
                .await
                .with_context(|| format!("an API relay into {netns}"))?;
            let kubeconfig = dir.join(format!("kubeconfig-{name}"));
            std::fs::write(&kubeconfig, kubeconfig_yaml(proxy_addr))
                .with_context(|| format!("writing {}", kubeconfig.display()))?;
            let conf = dir.join(format!("daemon-{name}.conf"));
            std::fs::write(&conf, DAEMON_INI).with_context(|| format!("writing {}", conf.display()))?;
            let socket = dir.join(format!("daemon-{name}.sock"));
            let args = vec![
                "daemon".to_string(),
                "--config-file".into(),
                conf.display().to_string(),
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--node-name".into(),
                name.to_string(),
                "--unix-socket".into(),
                socket.display().to_string(),
                "--state-dir".into(),
                dir.join(format!("daemon-{name}-state")).display().to_string(),
            ];
            let mut daemon = Proc::new(&format!("daemon-{name}"), args, Some(netns.clone()), dir)?;
            daemon.start()?;
            nodes.push(Node {
                name: name.to_string(),
                netns,
                socket,
                daemon,
                proxy,
            });
        }
        Ok(Self {
            nodes,
            pod_prefix: format!("kchaos{run}p"),
        })
    }

    fn pod_netns(prefix: &str, pod: &Value) -> String {
        Self::netns_of(prefix, str_at(pod, "/metadata/uid"))
    }

    fn netns_of(prefix: &str, uid: &str) -> String {
        format!("{prefix}{}", uid.get(..13).unwrap_or(uid))
    }

    fn sockets(&self) -> Arc<BTreeMap<String, PathBuf>> {
        Arc::new(
            self.nodes
                .iter()
                .map(|n| (n.name.clone(), n.socket.clone()))
                .collect(),
        )
    }

    /// The kubelet's pod start: a namespace, then CNI ADD on the pod's node; the pod's IP from
    /// the VIF the daemon answers with.
    pub fn setup(&self) -> SetupFn {
        let (sockets, prefix) = (self.sockets(), self.pod_prefix.clone());
        Arc::new(move |pod: Value| {
            let (sockets, prefix) = (sockets.clone(), prefix.clone());
            Box::pin(async move {
                let socket = sockets
                    .get(str_at(&pod, "/spec/nodeName"))
                    .ok_or_else(|| "the pod's node runs no daemon".to_string())?;
                let netns = Self::pod_netns(&prefix, &pod);
                if !Path::new("/var/run/netns").join(&netns).exists() {
                    ip(&["netns", "add", &netns]).map_err(|e| e.to_string())?;
                }
                let body = cni_request("ADD", &pod, &netns);
                let (status, answer) = tokio::time::timeout(ADD_TIMEOUT, post(socket, "/addNetwork", &body))
                    .await
                    .map_err(|_| format!("CNI ADD: no answer in {} s", ADD_TIMEOUT.as_secs()))?
                    .map_err(|e| format!("CNI ADD: {e:#}"))?;
                if !(200..300).contains(&status) {
                    return Err(format!("CNI ADD: {status} {}", String::from_utf8_lossy(&answer)));
                }
                let vif = serde_json::from_slice::<Value>(&answer)
                    .map_err(|e| e.to_string())
                    .and_then(|v| Vif::from_primitive(v).map_err(|e| e.to_string()))
                    .map_err(|e| format!("CNI ADD answered a VIF that does not read: {e}"))?;
                Ok(vif.fixed_ips().next().map(|(_, ip)| ip.to_string()))
            })
        })
    }

    /// The kubelet's pod teardown: CNI DEL (retried in the background while the daemon does
    /// not answer), then the pod's namespace goes.
    pub fn teardown(&self) -> TeardownFn {
        let (sockets, prefix) = (self.sockets(), self.pod_prefix.clone());
        Arc::new(move |pod: Value| {
            let (sockets, prefix) = (sockets.clone(), prefix.clone());
            Box::pin(async move {
                tokio::spawn(async move {
                    let netns = Self::pod_netns(&prefix, &pod);
                    if let Some(socket) = sockets.get(str_at(&pod, "/spec/nodeName")) {
                        let body = cni_request("DEL", &pod, &netns);
                        let until = tokio::time::Instant::now() + DEL_RETRY_FOR;
                        while tokio::time::Instant::now() < until {
                            match post(socket, "/delNetwork", &body).await {
                                Ok((s, _)) if (200..300).contains(&s) => break,
                                _ => tokio::time::sleep(Duration::from_secs(1)).await,
                            }
                        }
                    }
                    let _ = ip(&["netns", "del", &netns]);
                });
            })
        })
    }

    /// A node's daemon, SIGKILLed (pods stay plugged; the restarted daemon finds them).
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i]
            .daemon
            .stop(Signal::SIGKILL, Duration::from_secs(5))
            .await
    }

    /// Per node, its links beyond `lo` and the bridge: the host ends of its pods' interfaces.
    pub fn host_links(&self) -> BTreeMap<String, Vec<String>> {
        self.nodes
            .iter()
            .map(|n| {
                let links = ip(&["-n", &n.netns, "-o", "link", "show"])
                    .map(|out| link_names(&out))
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|l| l != "lo" && l != BRIDGE)
                    .collect();
                (n.name.clone(), links)
            })
            .collect()
    }

    /// The addresses in the namespace of the pod `uid` (`None`: the namespace is not there).
    pub fn pod_addresses(&self, uid: &str) -> Option<Vec<String>> {
        let netns = Self::netns_of(&self.pod_prefix, uid);
        let out = ip(&["-n", &netns, "-o", "addr", "show"]).ok()?;
        Some(
            out.lines()
                .filter_map(|l| {
                    let mut words = l.split_whitespace();
                    words.find(|w| *w == "inet" || *w == "inet6")?;
                    words.next()?.split('/').next().map(str::to_string)
                })
                .collect(),
        )
    }

    /// The pod namespaces of this run still there.
    pub fn pod_namespaces(&self) -> Vec<String> {
        ip(&["netns", "list"])
            .map(|out| {
                out.lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|n| n.starts_with(&self.pod_prefix))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stops the daemons (SIGTERM), then removes every namespace of this run.
    pub async fn shutdown(mut self) {
        for n in &mut self.nodes {
            let _ = n.daemon.stop(Signal::SIGTERM, Duration::from_secs(10)).await;
        }
    }
}

/// The namespaces go with the soak, however it ends (the daemons are killed on drop).
impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &self.nodes {
            n.proxy.abort();
        }
        for ns in self.pod_namespaces() {
            let _ = ip(&["netns", "del", &ns]);
        }
        for n in &self.nodes {
            let _ = ip(&["netns", "del", &n.netns]);
        }
    }
}

/// The daemons' kuryr.conf: OVS VIFs plugged into the node's Linux bridge (no Open vSwitch on
/// the soak's nodes); everything else upstream's defaults. Each daemon has a namespace of its
/// own, so the default ports never collide.
const DAEMON_INI: &str = "[binding]\novs_plug_mode = linux_bridge\n[neutron_defaults]\novs_bridge = br-int\n";

fn kubeconfig_yaml(server: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: chaos\n  cluster:\n    server: http://{server}\n\
         contexts:\n- name: chaos\n  context:\n    cluster: chaos\n    user: chaos\n\
         current-context: chaos\nusers:\n- name: chaos\n  user: {{}}\n"
    )
}

/// The body of a CNI request to the daemon, as the kuryr-cni plugin sends it.
fn cni_request(command: &str, pod: &Value, netns: &str) -> String {
    let uid = str_at(pod, "/metadata/uid");
    json!({
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": format!("chaos{}", uid.replace('-', "")),
        "CNI_NETNS": format!("/var/run/netns/{netns}"),
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={uid}",
            str_at(pod, "/metadata/namespace"),
            str_at(pod, "/metadata/name"),
        ),
        "config_kuryr": {"cniVersion": "0.4.0", "name": "kuryr", "type": "kuryr-cni"},
    })
    .to_string()
}

/// One HTTP/1.1 POST over a unix socket (`Connection: close`): the status and the body.
async fn post(socket: &Path, path: &str, body: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("an answer without a complete head")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("an answer without a status")?;
    let body = &raw[split + 4..];
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
    });
    Ok((status, if chunked { dechunk(body)? } else { body.to_vec() }))
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk without its size line")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .context("a chunk size that does not read")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).context("a chunk shorter than its size")?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

/// Names from `ip -o link show` (`3: veth1@if2: <...>` -> `veth1`).
fn link_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_with_and_without_chunks() {
        let plain = b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_answer(plain).ok(), Some((202, b"{}".to_vec())));
        let chunked = b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked).ok(), Some((500, b"{\"a\":1}".to_vec())));
        assert!(parse_answer(b"HTTP/1.1 200").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }

    #[test]
    fn link_names_drop_the_peer_suffix() {
        let out = "1: lo: <LOOPBACK,UP> mtu 65536\n2: br-int: <BROADCAST> mtu 1500\n\
                   7: tap1234@if3: <BROADCAST> mtu 1500\n";
        assert_eq!(link_names(out), ["lo", "br-int", "tap1234"]);
    }

    #[test]
    fn the_request_names_the_pod_and_its_namespace() {
        let pod = json!({"metadata": {"namespace": "ns1", "name": "p", "uid": "0b5e6a9c-1f7e-4d2a"}});
        let body: Value = serde_json::from_str(&cni_request("ADD", &pod, "kchaos1p0b5e")).unwrap_or_default();
        assert_eq!(body["CNI_NETNS"], "/var/run/netns/kchaos1p0b5e");
        assert_eq!(body["CNI_IFNAME"], "eth0");
        assert_eq!(
            body["CNI_ARGS"],
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p;K8S_POD_UID=0b5e6a9c-1f7e-4d2a"
        );
    }
}
