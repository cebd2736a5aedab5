//! Drives the real `kubectl` (v1.32) against the emulator over TLS with a bearer token.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kube_emulator::{KubeEmulator, KubeOptions};

// The workspace's one skip behaviour (a failure under KURYR_TEST_REQUIRE_ALL=1); kube-emulator
// cannot depend on kuryr-testbed, which depends on it.
#[allow(dead_code)]
#[path = "../../kuryr-testbed/src/skip.rs"]
mod skip;

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        c
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.cmd(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl is installed");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin piped")
                .write_all(input.as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("kubectl runs")
    }

    /// `kubectl get <args> -o jsonpath=<path>`.
    fn get_jsonpath(&self, args: &[&str], path: &str) -> String {
        let path = format!("jsonpath={path}");
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend(["-o", path.as_str()]);
        self.ok(&full, None)
    }

    /// Runs kubectl, asserts success, returns stdout.
    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stderr}\nstdout: {stdout}"
        );
        stdout
    }

    /// Runs kubectl, asserts failure, returns stderr.
    fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    fn spawn_lines(&self, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kubectl spawns");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }
}

fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if line.contains(needle) {
                return line;
            }
            seen.push(line);
        }
    }
    panic!("no line containing {needle:?}; saw {seen:?}");
}

/// Every CRD manifest of deploy/crds/ (the KuryrPort fixture when the directory is absent).
fn crd_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        files.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kuryrport-crd.yaml"));
    }
    files
}

/// `metadata.name` of a CRD manifest.
fn crd_name(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let doc: serde_json::Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()));
    doc.pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_else(|| panic!("{} has no metadata.name", path.display()))
        .to_string()
}

/// Whether to run: kubectl missing is a skip (said on stderr) unless `KURYR_TEST_REQUIRE_KUBECTL=1`
/// or `KURYR_TEST_REQUIRE_ALL=1`; kubectl present but broken is a failure.
fn kubectl_available() -> bool {
    match Command::new("kubectl").args(["version", "--client"]).output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "kubectl is installed but `kubectl version --client` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("KURYR_TEST_REQUIRE_KUBECTL").as_deref() != Ok("1"),
                "KURYR_TEST_REQUIRE_KUBECTL=1 but kubectl is not on PATH"
            );
            skip::skip(format!(
                "kubectl_drives_the_emulator: kubectl is not on PATH ({e})"
            ));
            false
        }
        Err(e) => panic!("running kubectl failed: {e}"),
    }
}

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns1\n";

fn pod(label: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod1\n  namespace: ns1\n  labels:\n    app: {label}\nspec:\n  containers:\n  - name: c1\n    image: busybox\n    ports:\n    - containerPort: 80\n"
    )
}

/// kubectl's `-v=6` log shows the KuryrPort POST answered 422.
fn assert_kuryrport_post_got_422(log: &str) {
    assert!(
        log.lines().any(|l| l.contains("POST")
            && l.contains("/kuryrports?")
            && l.contains(" 422 Unprocessable Entity")),
        "no 422 response logged: {log}"
    );
}

fn kuryrport(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: openstack.org/v1\nkind: KuryrPort\nmetadata:\n  name: {name}\n  namespace: ns1\nspec:\n{spec}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_drives_the_emulator() {
    if !kubectl_available() {
        return;
    }
    let opts = KubeOptions {
        tls: true,
        token: Some("s3cret".into()),
        ..KubeOptions::default()
    };
    let handle = KubeEmulator::start(opts).await.expect("emulator starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let k = Kubectl {
        kubeconfig,
        cache: dir.path().join("cache"),
    };

    let version = k.ok(&["version", "-o", "json"], None);
    assert!(version.contains("v1.32.0-kube-emulator"), "{version}");
    assert!(k.ok(&["get", "namespaces"], None).contains("default"));

    // Every CRD, namespace, pod and a KuryrPort from YAML (client-side apply with server-side
    // field validation).
    let files = crd_files();
    let mut args = vec!["apply".to_string()];
    for f in &files {
        args.push("-f".into());
        args.push(f.display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let crds = k.ok(&args, None);
    for f in &files {
        let name = crd_name(f);
        assert!(
            crds.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{name} created"
            )),
            "{name}: {crds}"
        );
    }
    let served = k.ok(
        &["api-resources", "--api-group=openstack.org", "-o", "name"],
        None,
    );
    for f in files.iter().filter(|f| crd_name(f).ends_with(".openstack.org")) {
        let name = crd_name(f);
        assert!(served.lines().any(|l| l == name), "{name} not served: {served}");
    }
    assert!(
        k.ok(&["apply", "-f", "-"], Some(NAMESPACE))
            .contains("namespace/ns1 created")
    );
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&pod("web")))
            .contains("pod/pod1 created")
    );
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&pod("web")))
            .contains("pod/pod1 unchanged")
    );
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&pod("db")))
            .contains("pod/pod1 configured")
    );
    assert_eq!(
        k.get_jsonpath(&["pod", "pod1", "-n", "ns1"], "{.metadata.labels.app}"),
        "db"
    );
    let kp = kuryrport("kp1", "  podUid: uid-1\n  podNodeName: node-a\n");
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&kp))
            .contains("kuryrport.openstack.org/kp1 created")
    );

    // Printer columns from the CRD.
    let table = k.ok(&["get", "kp", "-n", "ns1"], None);
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    for col in ["NAME", "PODUID", "NODENAME", "LABELS"] {
        assert!(header.contains(col), "missing column {col}: {table}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains("kp1") && row.contains("uid-1") && row.contains("node-a"),
        "{table}"
    );
    assert!(k.ok(&["get", "kp", "-A"], None).contains("ns1"));

    // label, merge patch, JSON patch, status subresource patch.
    assert!(
        k.ok(&["label", "kp", "kp1", "-n", "ns1", "app=web"], None)
            .contains("kuryrport.openstack.org/kp1 labeled")
    );
    assert!(
        k.ok(&["get", "kp", "-n", "ns1", "-l", "app=web"], None)
            .contains("map[app:web]")
    );
    assert!(
        k.ok(&["get", "kp", "-n", "ns1", "-l", "app!=web"], None)
            .is_empty()
    );
    k.ok(
        &[
            "patch",
            "kp",
            "kp1",
            "-n",
            "ns1",
            "--type=merge",
            "-p",
            r#"{"spec":{"podNodeName":"node-b"}}"#,
        ],
        None,
    );
    k.ok(&["patch", "kp", "kp1", "-n", "ns1", "--type=json", "-p", r#"[{"op":"test","path":"/spec/podUid","value":"uid-1"},{"op":"replace","path":"/spec/podUid","value":"uid-2"}]"#], None);
    let spec = k.get_jsonpath(&["kp", "kp1", "-n", "ns1"], "{.spec.podUid}/{.spec.podNodeName}");
    assert_eq!(spec, "uid-2/node-b");
    let err = k.fails(
        &[
            "patch",
            "kp",
            "kp1",
            "-n",
            "ns1",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/podUid","value":"nope"}]"#,
        ],
        None,
    );
    assert!(err.contains("did not match"), "{err}");
    k.ok(
        &[
            "patch",
            "pod",
            "pod1",
            "-n",
            "ns1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running","podIP":"10.0.0.7"}}"#,
        ],
        None,
    );
    let wide = k.ok(&["get", "pod", "pod1", "-n", "ns1", "-o", "wide"], None);
    assert!(wide.contains("Running") && wide.contains("10.0.0.7"), "{wide}");
    // The main endpoint ignores status for kinds with a status subresource.
    k.ok(
        &[
            "patch",
            "pod",
            "pod1",
            "-n",
            "ns1",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Failed"}}"#,
        ],
        None,
    );
    assert_eq!(
        k.get_jsonpath(&["pod", "pod1", "-n", "ns1"], "{.status.phase}"),
        "Running"
    );

    // get -w sees an update.
    let (mut watch, rx) = k.spawn_lines(&["get", "kp", "-n", "ns1", "-w"]);
    wait_line(&rx, "node-b");
    k.ok(
        &[
            "patch",
            "kp",
            "kp1",
            "-n",
            "ns1",
            "--type=merge",
            "-p",
            r#"{"spec":{"podNodeName":"node-watch"}}"#,
        ],
        None,
    );
    wait_line(&rx, "node-watch");
    let _ = watch.kill();
    let _ = watch.wait();

    // delete waits while a finalizer is present and returns once it is removed.
    k.ok(
        &[
            "patch",
            "kp",
            "kp1",
            "-n",
            "ns1",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["kuryr.openstack.org/kuryrport-finalizer"]}}"#,
        ],
        None,
    );
    let (mut delete, delete_rx) = k.spawn_lines(&["delete", "kp", "kp1", "-n", "ns1", "--timeout=60s"]);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        delete.try_wait().expect("poll delete").is_none(),
        "delete returned while a finalizer was present"
    );
    let ts = k.get_jsonpath(&["kp", "kp1", "-n", "ns1"], "{.metadata.deletionTimestamp}");
    assert!(!ts.is_empty(), "deletionTimestamp not set");
    k.ok(
        &[
            "patch",
            "kp",
            "kp1",
            "-n",
            "ns1",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
        None,
    );
    wait_line(&delete_rx, "deleted");
    let status = delete.wait().expect("delete exits");
    assert!(status.success());
    let gone = k.fails(&["get", "kp", "kp1", "-n", "ns1"], None);
    assert!(gone.contains("NotFound") || gone.contains("not found"), "{gone}");

    // Server-side apply creates, then updates.
    let kp2 = kuryrport("kp2", "  podUid: uid-9\n  podNodeName: node-c\n");
    assert!(
        k.ok(&["apply", "--server-side", "-f", "-"], Some(&kp2))
            .contains("kuryrport.openstack.org/kp2 serverside-applied")
    );
    let kp2b = kuryrport("kp2", "  podUid: uid-9\n  podNodeName: node-d\n");
    k.ok(&["apply", "--server-side", "-f", "-"], Some(&kp2b));
    assert_eq!(
        k.get_jsonpath(&["kp", "kp2", "-n", "ns1"], "{.spec.podNodeName}"),
        "node-d"
    );
    let managers = k.get_jsonpath(
        &["kp", "kp2", "-n", "ns1", "--show-managed-fields"],
        "{.metadata.managedFields[*].manager}",
    );
    assert!(managers.contains("kubectl"), "{managers}");
    // Another field manager changing a field "kubectl" owns conflicts; --force-conflicts takes it over.
    let kp2c = kuryrport("kp2", "  podUid: uid-9\n  podNodeName: node-e\n");
    let err = k.fails(
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        Some(&kp2c),
    );
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .spec.podNodeName"),
        "{err}"
    );
    k.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&kp2c),
    );
    let owners = k.ok(
        &[
            "get",
            "kp",
            "kp2",
            "-n",
            "ns1",
            "--show-managed-fields",
            "-o",
            "jsonpath={.spec.podNodeName} {.metadata.managedFields[?(@.manager==\"other\")].fieldsV1.f:spec}",
        ],
        None,
    );
    assert!(owners.starts_with("node-e "), "{owners}");
    assert!(
        owners.contains("f:podNodeName") && owners.contains("f:podUid"),
        "{owners}"
    );

    // An invalid custom resource is rejected with 422 and the field path (-v=6 logs each
    // request with its response code).
    let bad = kuryrport("kp3", "  podUid: uid-3\n");
    let err = k.fails(&["apply", "-v=6", "-f", "-"], Some(&bad));
    assert!(
        err.contains("is invalid") && err.contains("spec.podNodeName: Required value"),
        "{err}"
    );
    assert_kuryrport_post_got_422(&err);
    let err = k.fails(
        &["create", "-v=6", "-f", "-"],
        Some(&kuryrport("kp4", "  podUid: 5\n  podNodeName: n\n")),
    );
    assert!(
        err.contains("spec.podUid") && err.contains("must be of type string"),
        "{err}"
    );
    assert_kuryrport_post_got_422(&err);
    // The same through the raw API: the Status body says 422/Invalid.
    let raw = k.fails(
        &["create", "--raw", "/apis/openstack.org/v1/namespaces/ns1/kuryrports", "-f", "-"],
        Some(r#"{"apiVersion":"openstack.org/v1","kind":"KuryrPort","metadata":{"name":"kp5"},"spec":{"podUid":"u"}}"#),
    );
    assert!(
        raw.contains("is invalid") && raw.contains("spec.podNodeName"),
        "{raw}"
    );

    // Deleting the namespace deletes its contents.
    assert!(
        k.ok(&["delete", "namespace", "ns1"], None)
            .contains("namespace \"ns1\" deleted")
    );
    assert!(k.ok(&["get", "kp", "-A"], None).is_empty());

    handle.shutdown().await.expect("clean shutdown");
}

/// `kubectl get events` reads core/v1 Events; one written through events.k8s.io (as kube-runtime's
/// Recorder does) is listed there with kubectl's usual columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_events_lists_events_k8s_io_events() {
    if !kubectl_available() {
        return;
    }
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    let k = Kubectl {
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    let event = r#"{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"evented.1","namespace":"kube-system"},
        "eventTime":"2026-01-01T00:00:00.000000Z","regarding":{"kind":"ConfigMap","namespace":"kube-system","name":"evented"},
        "note":"waiting for the VIF","reason":"VifNotActive","type":"Warning","action":"Wiring",
        "reportingController":"kuryr-test","reportingInstance":"node-1"}"#;
    k.ok(&["create", "-f", "-"], Some(event));

    for resource in ["events", "events.events.k8s.io"] {
        let table = k.ok(&["get", resource, "-A"], None);
        let header = table.lines().next().unwrap_or_default();
        for column in ["NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"] {
            assert!(header.contains(column), "{resource}: {table}");
        }
        let row = table
            .lines()
            .find(|l| l.contains("configmap/evented"))
            .unwrap_or_else(|| panic!("{resource}: no row for the event: {table}"));
        for cell in ["kube-system", "Warning", "VifNotActive", "waiting for the VIF"] {
            assert!(row.contains(cell), "{resource}: {table}");
        }
    }
    let message = k.get_jsonpath(&["events", "-n", "kube-system", "evented.1"], "{.message}");
    assert_eq!(message, "waiting for the VIF");

    handle.shutdown().await.expect("clean shutdown");
}

/// The generated install (deploy/manifests: CRDs, Namespace, RBAC, ConfigMap, Deployment, PDB,
/// DaemonSet) applies with kubectl, and applying it again changes nothing.
fn install_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/manifests")
}

/// `kind/namespace/name=resourceVersion` of every object of the install's kinds, as the server
/// sees them.
fn install_versions(k: &Kubectl) -> Vec<String> {
    let out = k.ok(
        &[
            "get",
            "crd,ns,sa,clusterrole,clusterrolebinding,role,rolebinding,cm,deploy,pdb,ds",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}={.metadata.resourceVersion}{\"\\n\"}{end}",
        ],
        None,
    );
    let mut lines: Vec<String> = out.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

async fn kubectl_for(handle: &kube_emulator::KubeHandle, dir: &Path) -> Kubectl {
    std::fs::create_dir_all(dir).expect("kubectl directory");
    let kubeconfig = dir.join("kubeconfig");
    handle.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
    Kubectl {
        kubeconfig,
        cache: dir.join("cache"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_applies_the_generated_install_twice_without_change() {
    if !kubectl_available() {
        return;
    }
    let install = install_dir();
    assert!(install.is_dir(), "{} is missing", install.display());
    let install = install.display().to_string();
    let dir = tempfile::tempdir().expect("tempdir");

    // Client-side apply: everything created, then everything unchanged.
    let handle = KubeEmulator::start(KubeOptions {
        tls: true,
        token: Some("s3cret".into()),
        ..KubeOptions::default()
    })
    .await
    .expect("emulator starts");
    let k = kubectl_for(&handle, &dir.path().join("csa")).await;
    let first = k.ok(&["apply", "-f", &install], None);
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/kuryrports.openstack.org created",
        "namespace/kuryr created",
        "serviceaccount/kuryr-controller created",
        "serviceaccount/kuryr-cni created",
        "clusterrole.rbac.authorization.k8s.io/kuryr-controller created",
        "clusterrolebinding.rbac.authorization.k8s.io/kuryr-cni created",
        "role.rbac.authorization.k8s.io/kuryr-controller created",
        "rolebinding.rbac.authorization.k8s.io/kuryr-controller created",
        "configmap/kuryr-config created",
        "secret/kuryr-credentials created",
        "deployment.apps/kuryr-controller created",
        "poddisruptionbudget.policy/kuryr-controller created",
        "daemonset.apps/kuryr-cni created",
    ] {
        assert!(first.contains(object), "{object}: {first}");
    }
    let before = install_versions(&k);
    assert!(before.len() >= 15, "{before:?}");
    let second = k.ok(&["apply", "-f", &install], None);
    // A PDB's selector has patch strategy "replace", so kubectl always sends it and prints
    // "configured" (as against a real API server); the server must still write nothing.
    let changed: Vec<&str> = second
        .lines()
        .filter(|l| !l.ends_with(" unchanged"))
        .filter(|l| *l != "poddisruptionbudget.policy/kuryr-controller configured")
        .collect();
    assert!(changed.is_empty(), "second apply changed {changed:?}");
    assert_eq!(install_versions(&k), before, "a no-op apply wrote objects");

    // The kinds are discoverable and kubectl prints them.
    let served = k.ok(&["api-resources", "-o", "name"], None);
    for resource in [
        "deployments.apps",
        "daemonsets.apps",
        "replicasets.apps",
        "clusterroles.rbac.authorization.k8s.io",
        "rolebindings.rbac.authorization.k8s.io",
        "poddisruptionbudgets.policy",
        "serviceaccounts",
    ] {
        assert!(
            served.lines().any(|l| l == resource),
            "{resource} not served: {served}"
        );
    }
    let listed = k.ok(&["get", "deploy,ds,pdb", "-n", "kuryr"], None);
    for name in [
        "deployment.apps/kuryr-controller",
        "daemonset.apps/kuryr-cni",
        "poddisruptionbudget.policy/kuryr-controller",
    ] {
        assert!(listed.contains(name), "{name}: {listed}");
    }
    assert_eq!(
        k.get_jsonpath(
            &["ds", "kuryr-cni", "-n", "kuryr"],
            "{.spec.updateStrategy.rollingUpdate.maxUnavailable}"
        ),
        "1"
    );
    handle.shutdown().await.expect("clean shutdown");

    // Server-side apply on a fresh cluster: applied, then applied again without a write.
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator starts");
    let k = kubectl_for(&handle, &dir.path().join("ssa")).await;
    let first = k.ok(&["apply", "--server-side", "-f", &install], None);
    assert!(
        first.contains("daemonset.apps/kuryr-cni serverside-applied"),
        "{first}"
    );
    let before = install_versions(&k);
    k.ok(&["apply", "--server-side", "-f", &install], None);
    assert_eq!(
        install_versions(&k),
        before,
        "a no-op server-side apply wrote objects"
    );
    let owner = k.get_jsonpath(
        &["deploy", "kuryr-controller", "-n", "kuryr"],
        "{.metadata.managedFields[0].manager}/{.metadata.managedFields[0].operation}",
    );
    assert_eq!(owner, "kubectl/Apply");
    handle.shutdown().await.expect("clean shutdown");
}

/// The placement CRDs' bounds (deploy/crds) refuse kubectl-style bad objects as kube-apiserver
/// does: 422 with every offending field named, in its message shape; good objects pass, and a
/// whole-number float in an integer field is stored as an integer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_refuses_placement_objects_outside_their_schema() {
    if !kubectl_available() {
        return;
    }
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubectl_for(&handle, dir.path()).await;
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    for f in [
        "kuryropenstackdeployments.openstack.org.yaml",
        "kuryrprojectbindings.openstack.org.yaml",
    ] {
        k.ok(&["apply", "-f", &crds.join(f).display().to_string()], None);
    }
    let kosd = |name: &str, spec: &str| {
        format!(
            "apiVersion: openstack.org/v1\nkind: KuryrOpenStackDeployment\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    let err = k.fails(
        &["create", "-v=6", "-f", "-"],
        Some(&kosd(
            "bad",
            "  usageThreshold: 0\n  headroom: 1\n  weight: 1.5\n  availabilityZone: 'a:b'\n  \
             maintenance:\n    enabled: true\n    until: tomorrow\n  resourceAffinity:\n    resource: 'cad,gpu'\n",
        )),
    );
    assert!(
        err.lines()
            .any(|l| l.contains("POST") && l.contains(" 422 Unprocessable Entity")),
        "{err}"
    );
    // kubectl prints the causes as `* <field>: <message>`.
    for want in [
        "The KuryrOpenStackDeployment \"bad\" is invalid",
        "* spec.usageThreshold: Invalid value: 0: spec.usageThreshold in body should be greater than 0",
        "* spec.headroom: Invalid value: 1: spec.headroom in body should be less than 1",
        "* spec.weight: Invalid value: \"number\": spec.weight in body must be of type integer: \"number\"",
        "* spec.availabilityZone: Invalid value: \"a:b\": spec.availabilityZone in body should match",
        "* spec.maintenance.until: Invalid value: \"tomorrow\"",
        "* spec.resourceAffinity.resource: Invalid value: \"cad,gpu\"",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    let err = k.fails(
        &["create", "-f", "-"],
        Some(&kosd("far", "  usageThreshold: 1.5\n  weight: 2000000\n")),
    );
    assert!(
        err.contains("spec.usageThreshold: Invalid value: 1.5: spec.usageThreshold in body should be less than or equal to 1")
            && err.contains("spec.weight: Invalid value: 2000000: spec.weight in body should be less than or equal to 1e+06"),
        "{err}"
    );
    let err = k.fails(
        &["create", "-f", "-"],
        Some(
            "apiVersion: openstack.org/v1\nkind: KuryrProjectBinding\nmetadata:\n  name: p\nspec:\n  projectId: ''\n  availabilityZone: ' az1'\n",
        ),
    );
    assert!(
        err.contains(
            "spec.projectId: Invalid value: \"\": spec.projectId in body should be at least 1 chars long"
        ) && err.contains("spec.availabilityZone: Invalid value: \" az1\""),
        "{err}"
    );
    // In bounds: accepted; 3.0 in the integer weight is stored as 3.
    k.ok(
        &["create", "-f", "-"],
        Some(&kosd(
            "good",
            "  usageThreshold: 1\n  headroom: 0\n  weight: 3.0\n  availabilityZone: az1\n  resourceAffinity:\n    resource: cad\n",
        )),
    );
    assert_eq!(k.get_jsonpath(&["kosd", "good"], "{.spec.weight}"), "3");
    handle.shutdown().await.expect("clean shutdown");
}
