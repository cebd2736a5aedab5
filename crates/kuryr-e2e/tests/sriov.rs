//! SR-IOV in the daemon: the controller asks Neutron for a `direct`
//! port on the physnet but cannot know which VF the device plugin gave the
//! pod, so the daemon picks a free VF of the physnet's PFs
//! (`[sriov] physical_device_mappings`) and moves it into the pod.
//!
//! The VF selection itself is unit-tested against a fake sysfs tree in
//! `kuryr-daemon` (`binding::sriov::allocation`). Here: the real VF move where the
//! machine has SR-IOV NICs, and everywhere the full path up to the VF pick,
//! which must fail cleanly (CNI error naming the physnet, nothing plugged)
//! when the node has no VF for the physnet.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kuryr_daemon::binding::{
    BindingConfig, BindingDrivers, PlugKind, PlugSpec, PlugTarget, SriovConfig, find_free_vf,
    sriov_capable_pfs,
};
use kuryr_daemon::netlink::NetNs;
use serde_json::json;
use support::*;

const NS: &str = "e2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sriov_vf_moves_into_the_pod_where_the_hardware_allows() -> Result<()> {
    if !can_netns() {
        return Ok(());
    }
    let pfs = sriov_capable_pfs();
    if pfs.is_empty() {
        // Hardware CI does not have: allowed under KURYR_TEST_REQUIRE_ALL=1.
        skip_hardware(
            "no SR-IOV capable NIC (no /sys/class/net/*/device/sriov_numvfs above 0); \
             VF selection is unit-tested on a fake sysfs in kuryr-daemon",
        );
        return Ok(());
    }
    let Ok(before) = find_free_vf(Path::new("/sys"), &pfs, &HashSet::new()) else {
        skip_hardware(format!("SR-IOV PFs {pfs:?} have no free VF in this namespace"));
        return Ok(());
    };
    let config = BindingConfig {
        sriov: SriovConfig {
            options: kuryr_config::SriovSection {
                physical_device_mappings: std::collections::BTreeMap::from([(
                    "e2e-physnet".to_string(),
                    pfs.clone(),
                )])
                .into(),
                ..Default::default()
            },
            ..SriovConfig::default()
        },
        ..BindingConfig::default()
    };
    let drivers = BindingDrivers::new(&config);
    let pod = Ns::new("kvf")?;
    let netns = NetNs::open(&pod.path())?;
    let spec = PlugSpec {
        port_id: "e2e-sriov-port".into(),
        ifname: "eth1".into(),
        host_ifname: String::new(),
        mac: "fa:16:3e:5e:00:01".parse().map_err(anyhow::Error::msg)?,
        mtu: None,
        addresses: vec!["10.76.0.5/24".parse().map_err(anyhow::Error::msg)?],
        gateways: vec![],
        routes: vec![],
        is_default: false,
        kind: PlugKind::Sriov {
            pci_address: None,
            physnet: Some("e2e-physnet".into()),
            vlan: None,
        },
    };
    let target = PlugTarget::new(&netns, "e2e-uid");
    let driver = drivers.for_kind(&spec.kind);
    driver.setup(&spec, &target).await?;
    let addrs = pod.addrs()?;
    let teardown = driver.teardown(&spec, &target).await;
    let vf = addrs
        .iter()
        .find(|(n, _, _)| n == "eth1")
        .with_context(|| format!("no eth1 in the pod: {addrs:?}"))?;
    ensure!(vf.1 == "fa:16:3e:5e:00:01", "VF MAC {}", vf.1);
    ensure!(
        vf.2.contains(&"10.76.0.5/24".to_string()),
        "VF addresses {:?}",
        vf.2
    );
    teardown?;
    ensure!(!pod.links()?.contains(&"eth1".to_string()), "VF still in the pod");
    // The VF is back on the host and free again.
    let again = find_free_vf(Path::new("/sys"), &pfs, &HashSet::new()).map_err(anyhow::Error::msg)?;
    ensure!(again.pci_address == before.pci_address, "{again:?} != {before:?}");
    Ok(())
}

/// Without a VF for the physnet, the SR-IOV interface fails the ADD with a
/// CNI error naming the physnet and the PF, and eth0 is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sriov_pod_without_a_free_vf_fails_cleanly() -> Result<()> {
    init_logs();
    if !can_netns() {
        return Ok(());
    }
    cni_binary()?;
    for target in neutron_targets().await? {
        let fx = neutron_fixture(&target.client, &["10.77.0.0/24", "10.78.0.0/24"]).await?;
        let result: Result<()> = async {
            let kube = start_kube().await?;
            let extra = format!(
                "multi_vif_drivers = sriov\n[sriov]\ndefault_physnet_subnets = physnet2:{}\n",
                fx.subnets[1].subnet
            );
            let _ctrl = start_controller(&kube.client, &target, controller_config(&fx, &extra));
            create_namespace(&kube.client, NS).await?;
            let mut nodes = two_nodes(&kube).await?;
            // A PF that does not exist here stands for "no free VF on this node".
            let pf = unique("nopf");
            nodes[0].stop_daemon().await?;
            nodes[0].sriov_mappings = vec![format!("physnet2:{pf}")];
            nodes[0].start_daemon().await?;

            let pod = create_pod_with(
                &kube.client,
                NS,
                "vf",
                nodes[0].name,
                json!({}),
                json!({"requests": {"pod.alpha.kubernetes.io/opaque-int-resource-sriov-vf-physnet2": "1"},
                       "limits": {"intel.com/physnet2": "1"}}),
            )
            .await?;
            let sandbox = PodSandbox::new(&pod)?;
            let out = cni(&nodes[0], "ADD", &sandbox).await?;
            ensure!(!out.success, "ADD without a VF succeeded: {}", out.stdout);
            let details = out.stdout["details"].as_str().unwrap_or_default();
            ensure!(
                out.stdout["code"] == 999 && details.contains("physnet physnet2") && details.contains(&pf),
                "CNI error should name the physnet and the PF: {}",
                out.stdout
            );
            ensure!(sandbox.netns.links()? == ["lo"], "ADD left interfaces in the pod");
            ensure!(
                nodes[0].leftover_links()?.is_empty(),
                "ADD left veths on the node"
            );
            // The runtime's DEL after a failed ADD, then the pod goes away with its ports.
            cni_del(&nodes[0], &sandbox).await?;
            Api::<Pod>::namespaced(kube.client.clone(), NS)
                .delete("vf", &DeleteParams::default())
                .await?;
            eventually("SR-IOV pod ports deleted", Duration::from_secs(120), || async {
                Ok(pod_ports(&target.client, &fx.project)
                    .await?
                    .is_empty()
                    .then_some(()))
            })
            .await
        }
        .await;
        cleanup_project(&target.client, &fx.project).await;
        result.with_context(|| format!("against {}", target.name))?;
    }
    Ok(())
}
