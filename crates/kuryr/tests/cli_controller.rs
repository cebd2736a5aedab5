//! The `kuryr` binary against a running controller: `kuryr pools list|show` print the pools the
//! controller really has (checked against Neutron), and `kuryr controller` refuses an unknown
//! `[kubernetes] enabled_handlers` entry. The pool test runs against the Neutron emulator and,
//! with KURYR_TEST_NEUTRON_URL set, the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kube::api::{Api, ListParams};
use kuryr_controller::pool::driver::PoolSummary;
use kuryr_crds::KuryrPort;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::ListFilter;
use kuryr_testbed::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// Runs `kuryr args..` off the async runtime (the controller keeps running in this process).
async fn kuryr(args: Vec<String>) -> Result<Output> {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_kuryr"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
    })
    .await??;
    Ok(out)
}

async fn kuryr_ok(args: &[&str]) -> Result<String> {
    let out = kuryr(args.iter().map(|s| s.to_string()).collect()).await?;
    if !out.status.success() {
        bail!(
            "kuryr {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// One row of `kuryr pools list`: name, pool driver, VIF driver, host, available, recyclable,
/// in use.
type Row = (String, String, String, String, usize, usize, usize);

fn parse_list(text: &str) -> Result<Vec<Row>> {
    let mut lines = text.lines();
    let header = lines.next().context("no header")?;
    if !header.starts_with("NAME") || !header.contains("AVAILABLE") || !header.contains("IN USE") {
        bail!("unexpected header: {header}");
    }
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 9 {
                bail!("short row: {l}");
            }
            Ok((
                f[0].to_string(),
                f[1].to_string(),
                f[2].to_string(),
                f[3].to_string(),
                f[4].parse()?,
                f[5].parse()?,
                f[6].parse()?,
            ))
        })
        .collect()
}

/// Ports Neutron holds per pool (by the pool tag on every pooled port).
async fn neutron_pool_ports(
    neutron: &kuryr_neutron::NeutronClient,
    project: &str,
) -> Result<BTreeMap<String, usize>> {
    let mut per_pool = BTreeMap::new();
    for p in neutron.list_ports(&ListFilter::new().project_id(project)).await? {
        for t in &p.tags {
            if let Some(pool) = t.strip_prefix(tags::TAG_POOL_PREFIX) {
                *per_pool.entry(pool.to_string()).or_insert(0) += 1;
            }
        }
    }
    Ok(per_pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pools_list_and_show_print_the_running_controllers_pools() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.74.0.0/24").await?;
        create_namespace(&kube.client, "kuryr-system", json!({})).await?;
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("kuryr_manage.sock");
        let cluster = format!("cli-{}", uuid::Uuid::new_v4().simple());
        let ini = format!(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = neutron\n\
             cluster_id = {cluster}\ncontroller_namespace = kuryr-system\nenable_manager = true\n\
             [pool_manager]\nsock_file = {}\n[vif_pool]\nports_pool_min = 1\nports_pool_batch = 3\n\
             [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
            socket.display(),
            fx.project,
            fx.subnet,
            fx.sg
        );
        // `kuryr pools --config-file` finds the socket where the controller's config puts it.
        let conf = dir.path().join("kuryr.conf");
        std::fs::write(&conf, &ini)?;
        let ctrl = start_controller(&kube.client, &target, config(&ini), "cli");
        create_namespace(&kube.client, "cli", json!({})).await?;
        for (name, node) in [("a", NODES[0]), ("b", NODES[0]), ("c", NODES[1])] {
            create_pod(&kube.client, "cli", name, node, json!({})).await?;
        }
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "cli");
        let pod_ports: BTreeMap<String, String> = eventually("3 pods wired", WAIT, || async {
            let ports: BTreeMap<String, String> = kps
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter_map(|kp| {
                    let (_, v) = kp.status.as_ref()?.default_vif()?;
                    v.active()
                        .then(|| (kp.spec.pod_node_name.clone() + "/" + v.id(), v.id().to_string()))
                })
                .collect();
            Ok((ports.len() == 3).then_some(ports))
        })
        .await?;

        // Once refills are done, what the CLI prints is what Neutron holds.
        let sock = socket.to_str().unwrap();
        let rows = eventually("CLI agrees with Neutron", WAIT, || async {
            let before = parse_list(&kuryr_ok(&["pools", "--socket", sock, "list"]).await?)?;
            let in_neutron = neutron_pool_ports(neutron, &fx.project).await?;
            let after = parse_list(&kuryr_ok(&["pools", "--socket", sock, "list"]).await?)?;
            let agrees = before == after
                && before.len() == in_neutron.len()
                && before
                    .iter()
                    .all(|(name, _, _, _, a, r, u)| in_neutron.get(name) == Some(&(a + r + u)));
            Ok(agrees.then_some(before))
        })
        .await?;
        assert_eq!(rows.len(), 2, "{}: one pool per node: {rows:?}", target.name);
        let by_host: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.3.as_str(), r)).collect();
        assert_eq!(by_host[NODES[0]].6, 2, "{}: in use on node 1", target.name);
        assert_eq!(by_host[NODES[1]].6, 1, "{}: in use on node 2", target.name);
        for r in &rows {
            assert_eq!((r.1.as_str(), r.2.as_str()), ("neutron", "neutron-vif"));
            assert!(r.4 >= 1, "{}: ports_pool_min keeps a spare: {r:?}", target.name);
        }

        // --json and the configuration file give the same pools.
        let json: Vec<PoolSummary> =
            serde_json::from_str(&kuryr_ok(&["pools", "--socket", sock, "list", "--json"]).await?)?;
        let from_json: Vec<Row> = json
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.pool_driver.clone(),
                    p.vif_driver.clone(),
                    p.host.clone(),
                    p.available,
                    p.recyclable,
                    p.in_use,
                )
            })
            .collect();
        assert_eq!(from_json, rows, "{}", target.name);
        let via_conf =
            parse_list(&kuryr_ok(&["pools", "--config-file", conf.to_str().unwrap(), "list"]).await?)?;
        assert_eq!(via_conf, rows);

        // `show` lists the node's ports: the pods' ports are the ones in use.
        let node1 = by_host[NODES[0]];
        let shown = kuryr_ok(&["pools", "--socket", sock, "show", &node1.0]).await?;
        assert!(
            shown
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["in", "use", "2"]),
            "{shown}"
        );
        let in_use: Vec<&str> = shown
            .lines()
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [port, "inUse", _] => Some(port),
                _ => None,
            })
            .collect();
        let mut want: Vec<&str> = pod_ports
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{}/", NODES[0])))
            .map(|(_, v)| v.as_str())
            .collect();
        let mut got = in_use.clone();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{}: {shown}", target.name);

        let missing = kuryr(vec![
            "pools".into(),
            "--socket".into(),
            sock.into(),
            "show".into(),
            "kpp-nope".into(),
        ])
        .await?;
        assert!(!missing.status.success());
        assert!(
            String::from_utf8_lossy(&missing.stderr).contains("kpp-nope"),
            "{}",
            String::from_utf8_lossy(&missing.stderr)
        );

        ctrl.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
        eprintln!("pools-cli[{}]: {} pools printed", target.name, rows.len());
    }
    Ok(())
}

/// `kuryr controller` stops at start-up, before touching any server, when `enabled_handlers`
/// names a handler that does not exist; the error lists the valid ones.
#[tokio::test]
async fn controller_refuses_an_unknown_handler() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    // Nothing listens there: start-up must fail on the configuration first.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:9\n\
         users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    )?;
    let conf = dir.path().join("kuryr.conf");
    std::fs::write(
        &conf,
        "[kubernetes]\nenabled_handlers = vif,kuryrport,lb,kuryrprot\n\
         [neutron]\nendpoint_override = http://127.0.0.1:9\n\
         [neutron_defaults]\nproject = p\npod_subnet = s\npod_security_groups = g\n\
         [health_server]\nport = 0\n[prometheus_exporter]\ncontroller_exporter_port = 0\n",
    )?;
    let run = kuryr(vec![
        "controller".into(),
        "--config-file".into(),
        conf.to_str().unwrap().into(),
        "--kubeconfig".into(),
        kubeconfig.to_str().unwrap().into(),
    ]);
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .context("kuryr controller kept running with an unknown handler")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("\"kuryrprot\""), "{stderr}");
    assert!(
        stderr.contains(
            "valid handlers: endpoints, kuryrloadbalancer, kuryrnetwork, kuryrnetworkpolicy, kuryrport, namespace, \
             pod_label, policy, service, vif"
        ),
        "{stderr}"
    );
    // `lb` is upstream's and only skipped.
    assert!(!stderr.contains("\"lb\""), "{stderr}");
    Ok(())
}
