//! Two Kubernetes clusters given one `cluster_id` in one OpenStack: the first to lead claims it;
//! the second's controller refuses to start, naming the claim, before any handler ran; the first
//! cluster's ports are untouched. A restart keeps the one claim, a claim deleted by hand is made
//! again, and a cluster with its own id runs beside. Emulator and, with KURYR_TEST_NEUTRON_URL,
//! the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kuryr_controller::cluster_claim::{DESCRIPTION_PREFIX, group_name};
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_crds::KuryrPort;
use kuryr_crds::names::neutron as tags;
use kuryr_neutron::{ListFilter, NeutronClient, SecurityGroup};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

fn ini(cluster: &str, fx: &NeutronFixture) -> String {
    format!(
        "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_vif_driver = neutron-vif\nvif_pool_driver = noop\n\
         cluster_id = {cluster}\n\
         [vif_pool]\nports_pool_update_frequency = 1\n\
         [neutron_defaults]\nproject = {}\npod_subnet = {}\npod_security_groups = {}\n",
        fx.project, fx.subnet, fx.sg
    )
}

async fn claims(neutron: &NeutronClient, cluster: &str) -> Result<Vec<SecurityGroup>> {
    Ok(neutron
        .list_security_groups(&ListFilter::new().name(group_name(cluster)))
        .await?)
}

async fn kube_system_uid(kube: &kube::Client) -> Result<String> {
    let ns = Api::<Namespace>::all(kube.clone()).get("kube-system").await?;
    Ok(ns.metadata.uid.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_id_another_cluster_holds_is_refused() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.82.0.0/24").await?;
        let cluster = format!("claim-{}", uuid::Uuid::new_v4().simple());
        let cfg = config(&ini(&cluster, &fx));

        // The first cluster leads, claims the id and wires a pod.
        let first_kube = start_kube().await?;
        let first = start_controller(&first_kube.client, &target, cfg.clone(), "first");
        create_namespace(&first_kube.client, "demo", json!({})).await?;
        create_pod(&first_kube.client, "demo", "web", NODES[0], json!({})).await?;
        let ports = wait_active_ports(&first_kube.client, "demo", 1).await?;
        let held = claims(neutron, &cluster).await?;
        assert_eq!(held.len(), 1, "one claim: {held:?}");
        let first_uid = kube_system_uid(&first_kube.client).await?;
        assert_eq!(held[0].description, format!("{DESCRIPTION_PREFIX}{first_uid}"));
        assert!(
            held[0].tags.contains(&tags::TAG_MANAGED.to_string()),
            "{:?}",
            held[0].tags
        );
        assert!(
            held[0].tags.contains(&tags::cluster_tag(&cluster)),
            "{:?}",
            held[0].tags
        );

        // The second cluster, same id: its controller stops with the reason, before wiring a pod.
        let second_kube = start_kube().await?;
        create_namespace(&second_kube.client, "demo", json!({})).await?;
        create_pod(&second_kube.client, "demo", "db", NODES[0], json!({})).await?;
        let metrics = Metrics::new();
        let mut opts = ControllerOptions::new(
            cfg.clone(),
            second_kube.client.clone(),
            Deployments::noauth(&target.url, &metrics)?,
            metrics,
        );
        opts.health_addr = None;
        opts.metrics_addr = None;
        let refused = tokio::time::timeout(Duration::from_secs(60), run(opts, CancellationToken::new()))
            .await
            .expect("the second controller stops on its own")
            .expect_err("the second controller refuses the id");
        let msg = refused.to_string();
        let second_uid = kube_system_uid(&second_kube.client).await?;
        for part in [&cluster, &held[0].id, &first_uid, &second_uid] {
            assert!(msg.contains(part.as_str()), "{part:?} missing in {msg}");
        }
        let second_ports = Api::<KuryrPort>::namespaced(second_kube.client.clone(), "demo")
            .list(&Default::default())
            .await?;
        assert!(
            second_ports.items.is_empty(),
            "no handler ran: {:?}",
            second_ports.items
        );
        assert_eq!(
            claims(neutron, &cluster).await?.len(),
            1,
            "the refused cluster left no claim"
        );

        // A cluster of its own id runs beside the first.
        let own = format!("{cluster}-b");
        let beside = start_controller(&second_kube.client, &target, config(&ini(&own, &fx)), "beside");
        wait_active_ports(&second_kube.client, "demo", 1).await?;
        assert_eq!(claims(neutron, &own).await?.len(), 1);
        beside.shutdown().await?;

        // The first cluster's pod port outlived the refused controller's term (its sweep period
        // is a second: it had time to act, had it swept).
        tokio::time::sleep(Duration::from_secs(3)).await;
        for p in &ports {
            neutron.get_port(p).await?;
        }

        // A restart keeps the one claim; a claim deleted while no controller ran is made again.
        first.shutdown().await?;
        let again = start_controller(&first_kube.client, &target, cfg.clone(), "again");
        create_pod(&first_kube.client, "demo", "web2", NODES[1], json!({})).await?;
        wait_active_ports(&first_kube.client, "demo", 2).await?;
        let after = claims(neutron, &cluster).await?;
        assert_eq!(after.iter().map(|g| &g.id).collect::<Vec<_>>(), vec![&held[0].id]);
        again.shutdown().await?;
        neutron.delete_security_group(&held[0].id).await?;
        let last = start_controller(&first_kube.client, &target, cfg.clone(), "last");
        eventually("the claim made again", Duration::from_secs(30), || async {
            let c = claims(neutron, &cluster).await?;
            Ok((c.len() == 1 && c[0].description.ends_with(&first_uid)).then_some(()))
        })
        .await?;
        last.shutdown().await?;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A cluster refused in one deployment keeps no claim in another (it would later refuse the
/// cluster holding the id there); another cluster's later claim that stays (credentials of
/// another scope cannot see this one) stops the sweeps of that deployment, not the controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_claim_is_withdrawn_everywhere_and_a_contested_one_stops_sweeps() -> Result<()> {
    use kuryr_controller::cluster_claim::ClusterClaim;
    use kuryr_controller::context::Platform;
    use kuryr_neutron::{ClientOptions, SecurityGroupCreate};
    use neutron_emulator::{Emulator, EmulatorOptions};
    use std::sync::Arc;

    init_logs();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (e, w) = (
        Emulator::start(EmulatorOptions::default()).await?,
        Emulator::start(EmulatorOptions::default()).await?,
    );
    let east = NeutronClient::new(&ClientOptions::noauth(e.url()))?;
    let west = NeutronClient::new(&ClientOptions::noauth(w.url()))?;
    let kube = start_kube().await?;
    let cluster = format!("claim-{}", uuid::Uuid::new_v4().simple());
    let cfg = config(&format!(
        "[kubernetes]\ncluster_id = {cluster}\n\
         [neutron]\nauth_type = noauth\nendpoint_override = {}\n\
         [deployment:west]\nauth_type = noauth\nendpoint_override = {}\n\
         [neutron_defaults]\nproject = p1\n",
        e.url(),
        w.url()
    ));
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&cfg, &metrics)?;
    let platform = Arc::new(Platform::new(
        kube.client.clone(),
        cfg,
        deployments.clone(),
        metrics,
    ));
    let foreign = |project: &str| SecurityGroupCreate {
        name: group_name(&cluster),
        project_id: Some(project.into()),
        description: Some(format!("{DESCRIPTION_PREFIX}another-cluster")),
        ..Default::default()
    };

    // West is another cluster's: the check refuses, and east keeps no claim of this cluster.
    let theirs = west.create_security_group(&foreign("p1")).await?;
    let claim = ClusterClaim::new(platform.clone());
    let refused = claim.check_all().await.expect_err("refused in west");
    assert!(refused.to_string().contains(&theirs.id), "{refused}");
    claim.withdraw().await;
    assert!(claims(&east, &cluster).await?.is_empty(), "east keeps no claim");
    assert_eq!(claims(&west, &cluster).await?.len(), 1, "west keeps theirs only");
    assert!(deployments.claimed_names().is_empty());

    // Freed: claimed in both, confirmed by the next check.
    west.delete_security_group(&theirs.id).await?;
    let claim = ClusterClaim::new(platform.clone());
    assert!(!claim.check_all().await?, "made, not yet confirmed");
    assert!(deployments.claimed_names().is_empty());
    assert!(
        deployments.adoptable("default", String::new).is_err(),
        "nothing adopted by tag before the claim is confirmed"
    );
    assert!(claim.check_all().await?, "confirmed");
    assert_eq!(deployments.claimed_names(), ["default", "west"]);

    // A later claim of another cluster in another project that stays: east's sweeps stop (at
    // once: not confirmed during the grace, then contested), west's go on, nothing is refused.
    // Later by Neutron's whole-second clock: one made in the same second could sort first.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let contested = east.create_security_group(&foreign("p2")).await?;
    assert!(!claim.check_all().await?);
    assert_eq!(deployments.claimed_names(), ["west"]);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(!claim.check_all().await?, "still contested after the grace");
    assert_eq!(deployments.claimed_names(), ["west"]);
    // The earlier cluster goes on: what it finds by its tags is still adopted.
    deployments.adoptable("default", String::new)?;
    assert_eq!(
        claims(&east, &cluster).await?.len(),
        2,
        "nobody's claim was deleted"
    );
    east.delete_security_group(&contested.id).await?;
    assert!(claim.check_all().await?);
    assert_eq!(deployments.claimed_names(), ["default", "west"]);
    Ok(())
}
