//! Drop-in check from the runtime's side: upstream kuryr-kubernetes 10.0.0's own CNI plugin
//! (`kuryr-cni` of the PyPI package, which parses the daemon's answer with os-vif's versioned
//! objects) wires and unwires a pod through the kuryr-rs daemon, next to kuryr-rs' own plugin.
//! A node that keeps upstream's plugin in its CNI config works unchanged.
//!
//! The venv comes from `scripts/upstream-kuryr-venv.sh` (the README test command creates it and
//! exports KURYR_TEST_UPSTREAM_PYTHON); without it the test says why it skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_crds::KuryrPort;
use serde_json::json;
use support::*;

const NS: &str = "upstream";

/// Upstream's `kuryr-cni` next to the venv's python: `Err` with the path looked at when it is not there.
fn upstream_plugin() -> Result<PathBuf, PathBuf> {
    let python = std::env::var_os("KURYR_TEST_UPSTREAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.upstream-kuryr/venv/bin/python")
        });
    let plugin = python.with_file_name("kuryr-cni");
    if plugin.exists() { Ok(plugin) } else { Err(plugin) }
}

/// Runs upstream's plugin inside the node's namespace, as a runtime on that node would.
async fn upstream_cni(plugin: &Path, node: &Node, command: &str, pod: &PodSandbox) -> Result<CniOutput> {
    let dir = tempfile::tempdir()?;
    let conf_file = dir.path().join("kuryr.conf");
    // Logs to a file as deployments configure it: with oslo.log's default they would go to
    // stdout, where the runtime expects only the result.
    let log_file = dir.path().join("kuryr-cni.log");
    std::fs::write(
        &conf_file,
        format!(
            "[DEFAULT]\nlog_file = {}\n[cni_daemon]\nbind_address = {UPSTREAM_DAEMON_ADDRESS}\n",
            log_file.display()
        ),
    )?;
    let conf = json!({"cniVersion": "0.3.1", "name": "kuryr", "type": "kuryr-cni",
        "kuryr_conf": conf_file.display().to_string(), "debug": false});
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &node.ns.0]).arg(plugin);
    let mut out = exec_plugin(cmd, command, pod, &conf).await?;
    if !out.success {
        let log = std::fs::read_to_string(&log_file).unwrap_or_default();
        out.stderr = format!("{}\nplugin log:\n{log}", out.stderr);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_python_plugin_wires_a_pod_through_the_kuryr_rs_daemon() -> Result<()> {
    init_logs();
    let plugin = match upstream_plugin() {
        Ok(plugin) => plugin,
        Err(missing) => {
            skip(format!(
                "upstream kuryr venv not found (no {}): run scripts/upstream-kuryr-venv.sh (scripts/test-all.sh \
                 does and exports KURYR_TEST_UPSTREAM_PYTHON)",
                missing.display()
            ));
            return Ok(());
        }
    };
    if !can_netns() {
        return Ok(());
    }
    cni_binary()?;
    for target in neutron_targets().await? {
        let fx = neutron_fixture(&target.client, &["10.73.0.0/24"]).await?;
        let result: Result<()> = async {
            let kube = start_kube().await?;
            let _ctrl = start_controller(&kube.client, &target, controller_config(&fx, ""));
            create_namespace(&kube.client, NS).await?;
            let nodes = two_nodes(&kube).await?;
            // One pod through upstream's plugin, its peer on the other node through ours.
            let up = create_pod(&kube.client, NS, "via-upstream", nodes[0].name, json!({})).await?;
            let peer = create_pod(&kube.client, NS, "via-kuryr-rs", nodes[1].name, json!({})).await?;
            let (up_box, peer_box) = (PodSandbox::new(&up)?, PodSandbox::new(&peer)?);
            let add = upstream_cni(&plugin, &nodes[0], "ADD", &up_box).await?;
            ensure!(
                add.success,
                "upstream plugin ADD failed: {} {}",
                add.stdout,
                add.stderr
            );
            let result = add.stdout;
            cni_add(&nodes[1], &peer_box).await?;

            let kp = Api::<KuryrPort>::namespaced(kube.client.clone(), NS)
                .get("via-upstream")
                .await?;
            let (_, vif) = kp
                .status
                .as_ref()
                .and_then(|s| s.default_vif())
                .context("no eth0 VIF")?;
            let port = target.client.get_port(vif.id()).await?;
            let ip = &port.fixed_ips.first().context("port without IP")?.ip_address;
            // Upstream's result: built by os-vif from our VIF JSON.
            ensure!(result["interfaces"][0]["name"] == "eth0", "{result}");
            ensure!(
                result["interfaces"][0]["mac"] == port.mac_address.as_str(),
                "{result}"
            );
            ensure!(
                result["interfaces"][0]["sandbox"] == up_box.container.as_str(),
                "{result}"
            );
            ensure!(
                result["ips"][0]["address"]
                    .as_str()
                    .is_some_and(|a| a.starts_with(&format!("{ip}/"))),
                "{result}"
            );
            ensure!(result["ips"][0]["version"] == "4", "{result}");
            let addrs = up_box.netns.addrs()?;
            ensure!(
                addrs.iter().any(|(n, mac, a)| n == "eth0"
                    && *mac == port.mac_address
                    && a.iter().any(|x| x.starts_with(&format!("{ip}/")))),
                "pod namespace: {addrs:?}"
            );
            reachable(&peer_box.netns.path(), &up_box.netns.path(), ip.parse()?)
                .map_err(anyhow::Error::msg)?;

            // DEL through upstream's plugin, twice (runtimes repeat DELs).
            for round in 0..2 {
                let del = upstream_cni(&plugin, &nodes[0], "DEL", &up_box).await?;
                ensure!(
                    del.success,
                    "upstream plugin DEL #{round} failed: {} {}",
                    del.stdout,
                    del.stderr
                );
            }
            ensure!(up_box.netns.links()? == ["lo"], "eth0 left after DEL");
            cni_del(&nodes[1], &peer_box).await?;
            let pods = Api::<Pod>::namespaced(kube.client.clone(), NS);
            for p in ["via-upstream", "via-kuryr-rs"] {
                pods.delete(p, &DeleteParams::default()).await?;
            }
            eventually(
                "the ports deleted in Neutron",
                Duration::from_secs(120),
                || async {
                    Ok(pod_ports(&target.client, &fx.project)
                        .await?
                        .is_empty()
                        .then_some(()))
                },
            )
            .await?;
            for n in &nodes {
                ensure!(n.leftover_links()?.is_empty(), "{}: links left", n.name);
            }
            eprintln!(
                "upstream_plugin[{}]: upstream kuryr-cni ADD/DEL through the kuryr-rs daemon",
                target.name
            );
            Ok(())
        }
        .await;
        cleanup_project(&target.client, &fx.project).await;
        result.with_context(|| format!("against {}", target.name))?;
    }
    Ok(())
}
