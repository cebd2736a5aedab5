//! Crash safety of the port pools: the controller is killed abruptly (its runtime torn
//! down: no flush, no hand-over, detached tasks die too - SIGKILL semantics) 10 times at random moments during a churn of pod
//! creations and deletions. Once the last controller has settled, every kuryr-rs port of the
//! test project is used by exactly one KuryrPort or held by exactly one pool, and the pool
//! management API reports exactly those counts.
//!
//! Runs against the emulator (100 pods) and, when KURYR_TEST_NEUTRON_URL is set, the real
//! neutron-server with 100 pods as well.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kuryr_controller::pool::api;
use kuryr_crds::KuryrPort;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::*;

const PODS: usize = 100;
const KILLS: usize = 10;
const SETTLE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pools_stay_consistent_when_the_controller_is_killed_during_churn() -> Result<()> {
    init_logs();
    let seed: u64 = std::env::var("KURYR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("pool_crash: seed {seed} (set KURYR_TEST_SEED to replay)");
    for target in neutron_targets().await? {
        let started = Instant::now();
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.64.0.0/23").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_batch = 3\nports_pool_min = 1\nports_pool_max = 4\nports_pool_update_frequency = 1",
        )
        .await?;
        create_namespace(&kube.client, "churn", json!({})).await?;
        let pods = Api::<Pod>::namespaced(kube.client.clone(), "churn");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut kill_at = BTreeSet::new();
        while kill_at.len() < KILLS {
            kill_at.insert(rng.random_range(1..PODS));
        }

        let mut generation = 0;
        let kube_url = kube.handle.url();
        let start = |id: String| start_isolated_controller(kube_url, &target, config(&bed.ini), &id);
        let mut ctrl = start("c0".into())?;
        let mut live: Vec<String> = Vec::new();
        for i in 0..PODS {
            let name = format!("pod-{i}");
            create_pod(&kube.client, "churn", &name, NODES[i % 2], json!({})).await?;
            live.push(name);
            if live.len() > 6 && rng.random_bool(0.6) {
                let victim = live.swap_remove(rng.random_range(0..live.len()));
                pods.delete(&victim, &DeleteParams::default()).await?;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..120))).await;
            if kill_at.contains(&i) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..600))).await;
                ctrl.kill();
                generation += 1;
                ctrl = start(format!("c{generation}"))?;
            }
        }
        let live: BTreeSet<String> = live.into_iter().collect();

        // The last controller wires what is left and frees what was deleted.
        let kps = Api::<KuryrPort>::namespaced(kube.client.clone(), "churn");
        eventually("pods and KuryrPorts settled", SETTLE, || async {
            let names: BTreeSet<String> = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|p| p.name_any())
                .collect();
            let active = kps
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|kp| {
                    kp.status
                        .as_ref()
                        .and_then(|s| s.default_vif())
                        .is_some_and(|(_, v)| v.active())
                })
                .map(|kp| kp.name_any())
                .collect::<BTreeSet<_>>();
            Ok((names == live && active == live).then_some(()))
        })
        .await?;
        let summary = eventually("every kuryr-rs port accounted for", SETTLE, || {
            accounted_for(&kube.client, neutron, &fx.project, &bed.socket)
        })
        .await?;
        ensure!(!ctrl.has_exited(), "the last controller died");
        eprintln!(
            "pool_crash[{}]: {PODS} pods, {KILLS} kills, {} live; {summary}; took {:?}",
            target.name,
            live.len(),
            started.elapsed()
        );
        ctrl.shutdown().await;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// Some(summary) when Neutron, the KuryrPorts and the pool API agree exactly; None (with the
/// difference logged) while they do not yet.
async fn accounted_for(
    kube: &kube::Client,
    neutron: &kuryr_neutron::NeutronClient,
    project: &str,
    socket: &std::path::Path,
) -> Result<Option<String>> {
    let in_neutron = kuryr_ports(neutron, project).await?;
    let mut by_kuryrport: BTreeSet<String> = BTreeSet::new();
    for kp in Api::<KuryrPort>::all(kube.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        for entry in kp.status.iter().flat_map(|s| s.vifs.values()) {
            ensure!(
                by_kuryrport.insert(entry.vif.id().to_string()),
                "port {} used by two KuryrPorts",
                entry.vif.id()
            );
        }
    }
    let mut states: BTreeMap<String, String> = BTreeMap::new();
    let (mut available, mut recyclable, mut in_use) = (0, 0, 0);
    for p in api::list_pools(socket).await? {
        let shown = api::show_pool(socket, &p.name).await?;
        available += p.available;
        recyclable += p.recyclable;
        in_use += p.in_use;
        let counted = shown.ports.len();
        // Quiet means no refill in flight either: its ports would land after the listing.
        if p.populating || counted != p.available + p.recyclable + p.in_use {
            return Ok(None);
        }
        for port in shown.ports {
            ensure!(
                states.insert(port.port_id.clone(), port.state).is_none(),
                "port {} in two pools",
                port.port_id
            );
        }
    }
    let pooled: BTreeSet<String> = states
        .iter()
        .filter(|(_, s)| *s != "inUse")
        .map(|(id, _)| id.clone())
        .collect();
    let pool_in_use: BTreeSet<String> = states
        .iter()
        .filter(|(_, s)| *s == "inUse")
        .map(|(id, _)| id.clone())
        .collect();
    let accounted: BTreeSet<String> = pooled.union(&by_kuryrport).cloned().collect();
    let ok = accounted == in_neutron
        && pooled.is_disjoint(&by_kuryrport)
        && pool_in_use == by_kuryrport
        && recyclable == 0;
    if !ok {
        tracing::info!(
            unaccounted = ?in_neutron.difference(&accounted).collect::<Vec<_>>(),
            missing_in_neutron = ?accounted.difference(&in_neutron).collect::<Vec<_>>(),
            in_use_mismatch = ?pool_in_use.symmetric_difference(&by_kuryrport).collect::<Vec<_>>(),
            recyclable,
            "not settled yet"
        );
        return Ok(None);
    }
    Ok(Some(format!(
        "{} Neutron ports = {in_use} in use + {available} available (pool API)",
        in_neutron.len()
    )))
}
