//! The pools' books stay true: what a pool counts in use is what the KuryrPorts record.
//!
//! - a stale copy of a wired KuryrPort (an event queued before its VIFs were recorded, as the
//!   periodic watch reconcile re-sends during a long exhaustion) takes no second port;
//! - a port taken from a pool by a pod that never recorded it stops being counted in use and
//!   the orphan sweep deletes it;
//! - a port borrowed from a sibling pool (same network, other security groups) becomes the
//!   borrower's: its groups and its pool tag, which recovery and the books go by;
//! - a pool one of whose security groups was deleted (its NetworkPolicy is gone) is dropped at
//!   its first failed refill, not refilled again and again;
//! - the pools of a group being deleted are dropped with their spare ports (a pool above min
//!   never refills, so it would keep them for good).
//!
//! Both run against the emulator and, with KURYR_TEST_NEUTRON_URL set, the real neutron-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kuryr_controller::context::{Context, Platform};
use kuryr_controller::drivers::pool::VifPool;
use kuryr_controller::drivers::{PodRef, PortSpec};
use kuryr_controller::handlers::kuryrport::KuryrPortHandler;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::pipeline::ResourceEventHandler;
use kuryr_controller::pool::{PoolManager, sweep};
use kuryr_crds::{KuryrPort, KuryrPortSpec};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

/// The drivers a controller builds from `bed`, with the pools recovered (nothing running yet).
async fn context(
    kube: &Kube,
    target: &NeutronTarget,
    bed: &PoolBed,
) -> Result<(Arc<Context>, Arc<PoolManager>)> {
    let metrics = Metrics::new();
    let deployments = Deployments::noauth(&target.url, &metrics)?;
    let platform = Arc::new(Platform::new(
        kube.client.clone(),
        config(&bed.ini),
        deployments,
        metrics,
    ));
    claim_cluster_id(&platform).await?;
    let ctx = Context::build(platform)?;
    let Some(pools) = ctx.drivers.pools.clone() else {
        bail!("the test config pools ports");
    };
    pools.recover().await?;
    Ok((ctx, pools))
}

/// Pod `name` in `ns` on the first node and its KuryrPort as the vif handler creates it.
async fn pod_and_kuryrport(kube: &kube::Client, ns: &str, name: &str) -> Result<(Pod, KuryrPort)> {
    let pod = create_pod(kube, ns, name, NODES[0], json!({})).await?;
    let kp = KuryrPort::new(
        name,
        KuryrPortSpec {
            pod_uid: pod.uid().unwrap_or_default(),
            pod_node_name: NODES[0].into(),
            pod_static: false,
        },
    );
    let kp = Api::<KuryrPort>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &kp)
        .await?;
    Ok((pod, kp))
}

/// A security group of the fixture's project besides its default one (what a policy adds).
async fn extra_group(
    neutron: &kuryr_neutron::NeutronClient,
    fx: &NeutronFixture,
    name: &str,
) -> Result<String> {
    Ok(neutron
        .create_security_group(&kuryr_neutron::SecurityGroupCreate {
            name: name.into(),
            project_id: Some(fx.project.clone()),
            ..Default::default()
        })
        .await?
        .id)
}

/// A pod on the first node, asking a pool directly.
fn pod_ref(name: &str) -> PodRef {
    PodRef {
        namespace: "books".into(),
        name: name.into(),
        uid: format!("{name}-uid"),
        node: NODES[0].into(),
    }
}

fn default_port(kp: &KuryrPort) -> Option<String> {
    kp.status.as_ref()?.default_vif().map(|(_, v)| v.id().to_string())
}

/// Runs the kuryrport handler on the current object until it succeeds (the port turns ACTIVE).
async fn wire(handler: &KuryrPortHandler, kube: &kube::Client, ns: &str, name: &str) -> Result<KuryrPort> {
    let api = Api::<KuryrPort>::namespaced(kube.clone(), ns);
    eventually(&format!("{name} wired"), WAIT, || async {
        let kp = api.get(name).await?;
        match handler.on_present(&kp).await {
            Ok(()) => Ok(Some(api.get(name).await?)),
            Err(e) if e.is_retryable() => Ok(None),
            Err(e) => Err(anyhow::anyhow!("not retryable: {e}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_kuryrport_copy_takes_no_second_port() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let fx = neutron_fixture(&target.client, "10.71.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 1\nports_pool_batch = 2").await?;
        let (ctx, pools) = context(&kube, &target, &bed).await?;
        create_namespace(&kube.client, "books", json!({})).await?;
        let (_pod, stale) = pod_and_kuryrport(&kube.client, "books", "p1").await?;
        let handler = KuryrPortHandler::new(ctx.clone());
        let wired = wire(&handler, &kube.client, "books", "p1").await?;
        let port = default_port(&wired).expect("wired");

        // The copy from before the VIFs were recorded comes through again.
        let replay = handler.on_present(&stale).await;
        ensure!(
            replay.as_ref().is_err_and(|e| e.is_retryable()),
            "a stale copy is retried with the current object: {replay:?}"
        );
        let now = Api::<KuryrPort>::namespaced(kube.client.clone(), "books")
            .get("p1")
            .await?;
        assert_eq!(default_port(&now), Some(port.clone()), "the recorded port stays");
        let s = pools.summaries();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].in_use, 1, "one pod, one port in use: {s:?}");
        // The retry (the current object) takes nothing either.
        let again = wire(&handler, &kube.client, "books", "p1").await?;
        assert_eq!(default_port(&again), Some(port));
        assert_eq!(pools.summaries()[0].in_use, 1);
        eprintln!("pool_books[{}]: stale copy refused, 1 port in use", target.name);
        cleanup_project(&target.client, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_in_use_by_no_kuryrport_leaves_the_books_and_neutron() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.72.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_min = 0\nports_pool_batch = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let (ctx, pools) = context(&kube, &target, &bed).await?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(pools.clone().run(stop.clone()));
        create_namespace(&kube.client, "books", json!({})).await?;
        let (_pod, _) = pod_and_kuryrport(&kube.client, "books", "real").await?;
        let handler = KuryrPortHandler::new(ctx.clone());
        let recorded = default_port(&wire(&handler, &kube.client, "books", "real").await?).expect("wired");

        // A pod that takes a port and never records it (what a handler did with a stale copy).
        let info = network_info(neutron, &fx).await?;
        let spec = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
        let ghost = PodRef {
            namespace: "books".into(),
            name: "ghost".into(),
            uid: "ghost-uid".into(),
            node: NODES[0].into(),
        };
        let (vif, _) = pooled_vif(pools.as_ref(), &ghost, &spec).await?;
        let phantom = vif.id().to_string();
        assert_eq!(pools.summaries()[0].in_use, 2);

        // Within the grace, two passes and the sweep's two passes. The sweep paces itself by what
        // a pass costs (at most a twentieth of the time): against a loaded real neutron-server a
        // pass of a second or two puts half a minute between passes, so the wait allows three
        // pauses after one timed here (twice over, the server's pace varies).
        let started = std::time::Instant::now();
        pools.sweep_once(&mut Default::default()).await?;
        let pause = sweep::pause_after(Duration::from_secs(1), started.elapsed() * 2);
        let limit = pools.in_use_grace() + Duration::from_secs(60) + pause * 3;
        eventually("the phantom port forgotten and deleted", limit, || async {
            let s = pools.summaries();
            let in_neutron = kuryr_ports(neutron, &fx.project).await?;
            Ok((s[0].in_use == 1 && !in_neutron.contains(&phantom)).then_some(()))
        })
        .await?;
        let in_neutron = kuryr_ports(neutron, &fx.project).await?;
        ensure!(
            in_neutron.contains(&recorded),
            "the recorded port stays: {in_neutron:?}"
        );
        let shown = kuryr_controller::pool::api::show_pool(&bed.socket, &pools.summaries()[0].name).await?;
        let in_use: Vec<&str> = shown
            .ports
            .iter()
            .filter(|p| p.state == "inUse")
            .map(|p| p.port_id.as_str())
            .collect();
        assert_eq!(in_use, [recorded.as_str()]);
        eprintln!("pool_books[{}]: unrecorded port forgotten and swept", target.name);
        stop.cancel();
        let _ = task.await;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_borrowed_from_a_sibling_pool_carries_the_borrowers_tag() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.74.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 2\nports_pool_batch = 2").await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let other_sg = extra_group(neutron, &fx, "pool-books-other").await?;
        let info = network_info(neutron, &fx).await?;
        let first = PortSpec::new("default", fx.project.clone(), info.clone(), vec![fx.sg.clone()]);
        let (a, _) = pooled_vif(pools.as_ref(), &pod_ref("a"), &first).await?;
        let donor = pools.summaries()[0].name.clone();
        let pooled = pools.summaries()[0].available;
        ensure!(
            pooled >= 1,
            "the first pool keeps a spare port: {:?}",
            pools.summaries()
        );

        // The second pool is empty: its first pod borrows the first pool's spare port.
        let second = PortSpec::new("default", fx.project.clone(), info, vec![other_sg.clone()]);
        let (b, _) = pooled_vif(pools.as_ref(), &pod_ref("b"), &second).await?;
        let borrower = pools
            .summaries()
            .into_iter()
            .find(|s| s.security_groups == std::slice::from_ref(&other_sg))
            .expect("the second pool");
        assert_ne!(borrower.name, donor);
        assert_eq!(borrower.in_use, 1);
        let port = neutron.get_port(b.id()).await?;
        assert_eq!(port.security_groups, std::slice::from_ref(&other_sg));
        let pool_tags: Vec<&String> = port
            .tags
            .iter()
            .filter(|t| t.starts_with(kuryr_crds::names::neutron::TAG_POOL_PREFIX))
            .collect();
        assert_eq!(
            pool_tags,
            [&kuryr_crds::names::neutron::pool_tag(&borrower.name)],
            "one pool tag, the borrower's"
        );
        ensure!(
            port.tags
                .iter()
                .any(|t| t == kuryr_crds::names::neutron::TAG_MANAGED),
            "the other tags stay: {:?}",
            port.tags
        );
        let first_port = neutron.get_port(a.id()).await?;
        assert!(
            first_port
                .tags
                .contains(&kuryr_crds::names::neutron::pool_tag(&donor))
        );
        eprintln!(
            "pool_books[{}]: borrowed port retagged to {}",
            target.name, borrower.name
        );
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_whose_security_group_is_gone_is_dropped_not_refilled() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.75.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 0\nports_pool_batch = 1").await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let policy_sg = extra_group(neutron, &fx, "pool-books-policy").await?;
        let info = network_info(neutron, &fx).await?;
        let spec = PortSpec::new("default", fx.project.clone(), info, vec![policy_sg.clone()]);
        let (a, _) = pooled_vif(pools.as_ref(), &pod_ref("a"), &spec).await?;
        // The policy goes: its group off the ports, then deleted (what its release does).
        neutron
            .update_port(
                a.id(),
                &kuryr_neutron::PortUpdate {
                    security_groups: Some(vec![fx.sg.clone()]),
                    ..Default::default()
                },
            )
            .await?;
        neutron.delete_security_group(&policy_sg).await?;
        let before = kuryr_ports(neutron, &fx.project).await?;

        // A pod whose groups were computed before the deletion asks that pool once more.
        let late = pools.request_vif(&pod_ref("late"), &spec).await;
        let Err(err) = late else {
            bail!("a pool of a deleted group handed out a port");
        };
        ensure!(err.is_retryable(), "retried with fresh groups: {err}");
        eventually("the pool dropped", WAIT, || async {
            Ok(pools
                .summaries()
                .iter()
                .all(|s| !s.security_groups.contains(&policy_sg))
                .then_some(()))
        })
        .await?;
        assert_eq!(
            kuryr_ports(neutron, &fx.project).await?,
            before,
            "no port created for the deleted group"
        );
        eprintln!(
            "pool_books[{}]: pool of a deleted group dropped: {err}",
            target.name
        );
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A deleted policy group's pools go with it: their spare ports are deleted at once (no pod asks
/// for that set of groups again, and a pool above min never refills, so nothing else would
/// free them), and the other pools keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pools_of_a_deleted_group_are_dropped_with_their_spares() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.76.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 1\nports_pool_batch = 3").await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let policy_sg = extra_group(neutron, &fx, "pool-books-dropped").await?;
        let info = network_info(neutron, &fx).await?;
        let with_policy = PortSpec::new(
            "default",
            fx.project.clone(),
            info.clone(),
            vec![policy_sg.clone()],
        );
        let plain = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
        let (a, _) = pooled_vif(pools.as_ref(), &pod_ref("a"), &with_policy).await?;
        pooled_vif(pools.as_ref(), &pod_ref("b"), &plain).await?;
        let spares = |sg: &str| {
            pools
                .summaries()
                .iter()
                .filter(|s| s.security_groups.iter().any(|g| g == sg))
                .map(|s| (!s.populating).then_some(s.available))
                .sum::<Option<usize>>()
        };
        let (dropped, kept) = eventually("both pools hold spares, no refill running", WAIT, || async {
            Ok(match (spares(&policy_sg), spares(&fx.sg)) {
                (Some(d), Some(k)) if d > 0 && k > 0 => Some((d, k)),
                _ => None,
            })
        })
        .await?;
        let before = kuryr_ports(neutron, &fx.project).await?;
        assert_eq!(before.len(), 2 + dropped + kept);

        pools.drop_security_group(&policy_sg).await?;
        ensure!(
            pools
                .summaries()
                .iter()
                .all(|s| !s.security_groups.contains(&policy_sg)),
            "the pool of the deleted group is gone"
        );
        let left = kuryr_ports(neutron, &fx.project).await?;
        assert_eq!(spares(&fx.sg), Some(kept), "the other pool keeps its spares");
        assert_eq!(
            left.len(),
            2 + kept,
            "the {dropped} spares of the dropped pool are deleted: {left:?}"
        );
        assert!(
            left.contains(a.id()),
            "a port in use stays until its pod releases it"
        );
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A port whose pool tag names another pool than the one its pod's KuryrPort says it came from
/// (a borrowed port's move cut short by a crash) is counted by the record at recovery, and its
/// tag is made to agree: the books and Neutron then say the same, and the next recovery reads
/// it alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recovery_retags_a_port_for_the_pool_its_kuryrport_names() -> Result<()> {
    init_logs();
    for target in neutron_targets().await? {
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.76.0.0/24").await?;
        let bed = PoolBed::new(&kube, &fx, "ports_pool_min = 1\nports_pool_batch = 1").await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let other_sg = extra_group(neutron, &fx, "pool-books-retag").await?;
        let info = network_info(neutron, &fx).await?;
        let first = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
        let pod = PodRef {
            namespace: "default".into(),
            ..pod_ref("r")
        };
        let (vif, mut origin) = pooled_vif(pools.as_ref(), &pod, &first).await?;
        let donor = pools.summaries()[0].name.clone();
        // The record names the other groups' pool; the port keeps the first pool's tag.
        origin.security_groups = vec![other_sg.clone()];
        record_kuryrport(&kube.client, &pod, &vif, &origin).await?;

        let (_ctx, again) = context(&kube, &target, &bed).await?;
        let counted = again
            .summaries()
            .into_iter()
            .find(|s| s.in_use == 1)
            .expect("the port counted in use");
        assert_eq!(
            counted.security_groups,
            std::slice::from_ref(&other_sg),
            "{}",
            target.name
        );
        assert_ne!(counted.name, donor);
        let tags = neutron.get_port(vif.id()).await?.tags;
        let pool_tags: Vec<&String> = tags
            .iter()
            .filter(|t| t.starts_with(kuryr_crds::names::neutron::TAG_POOL_PREFIX))
            .collect();
        assert_eq!(
            pool_tags,
            [&kuryr_crds::names::neutron::pool_tag(&counted.name)],
            "{}: the tag names the pool that counts it",
            target.name
        );
        ensure!(
            tags.iter().any(|t| t == kuryr_crds::names::neutron::TAG_MANAGED),
            "the other tags stay: {tags:?}"
        );
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A spare port a pool object lists but whose tag and groups are another pool's (a move from
/// one pool to the other cut short by a crash, the listing flushed before it) is taken back as
/// recyclable, not available: the recycle pass puts the listing pool's groups on it before any
/// pod gets it, and its tag is made the listing pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listed_spare_tagged_for_another_pool_is_recycled_before_reuse() -> Result<()> {
    use kuryr_crds::KuryrPortPool;
    use kuryr_crds::names::neutron as tags;
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.77.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_min = 2\nports_pool_batch = 2\nports_pool_update_frequency = 1",
        )
        .await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let term = start_pool_term(&pools).await?;
        let other_sg = extra_group(neutron, &fx, "pool-books-listed").await?;
        let info = network_info(neutron, &fx).await?;
        let first = PortSpec::new("default", fx.project.clone(), info.clone(), vec![fx.sg.clone()]);
        let second = PortSpec::new("default", fx.project.clone(), info, vec![other_sg.clone()]);
        pooled_vif(pools.as_ref(), &pod_ref("a"), &first).await?;
        pooled_vif(pools.as_ref(), &pod_ref("b"), &second).await?;
        let by_groups = |groups: &[String]| {
            pools
                .summaries()
                .into_iter()
                .find(|s| s.security_groups == groups)
        };
        let listing = by_groups(std::slice::from_ref(&fx.sg))
            .expect("the first pool")
            .name;
        let other = by_groups(std::slice::from_ref(&other_sg))
            .expect("the second pool")
            .name;
        // A spare of the first pool, as its object lists it.
        let kpps = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        let (spare, groups_only) = eventually("two spares of the first pool listed", WAIT, || async {
            Ok(kpps.get_opt(&listing).await?.and_then(|p| {
                let available = p.status?.available;
                (available.len() >= 2).then(|| (available[0].port_id.clone(), available[1].port_id.clone()))
            }))
        })
        .await?;
        end_pool_term(term).await?;
        // The other pool's groups only (a crash before the move's tag write).
        neutron
            .update_port(
                &groups_only,
                &kuryr_neutron::PortUpdate {
                    security_groups: Some(vec![other_sg.clone()]),
                    ..Default::default()
                },
            )
            .await?;
        // The move cut short: the other pool's groups and tag on it.
        neutron
            .update_port(
                &spare,
                &kuryr_neutron::PortUpdate {
                    security_groups: Some(vec![other_sg.clone()]),
                    ..Default::default()
                },
            )
            .await?;
        let moved: Vec<String> = neutron
            .get_port(&spare)
            .await?
            .tags
            .into_iter()
            .filter(|t| !t.starts_with(tags::TAG_POOL_PREFIX))
            .chain([tags::pool_tag(&other)])
            .collect();
        neutron
            .replace_tags(kuryr_neutron::Taggable::Port, &spare, &moved)
            .await?;

        let (_ctx, again) = context(&kube, &target, &bed).await?;
        let s = again
            .summaries()
            .into_iter()
            .find(|s| s.name == listing)
            .expect("the listing pool recovered");
        ensure!(s.recyclable >= 1, "{t}: taken back as recyclable: {s:?}");
        let port = neutron.get_port(&spare).await?;
        assert!(
            port.tags.contains(&tags::pool_tag(&listing)),
            "{t}: retagged: {:?}",
            port.tags
        );
        // The recycle pass gives it the listing pool's groups back.
        let term = start_pool_term(&again).await?;
        for id in [&spare, &groups_only] {
            eventually("the spare's groups reset", WAIT, || async {
                Ok(
                    (neutron.get_port(id).await?.security_groups == std::slice::from_ref(&fx.sg))
                        .then_some(()),
                )
            })
            .await?;
        }
        end_pool_term(term).await?;
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A released port carrying another pool's tag (a borrowed port given back after a move whose
/// tag write Neutron applied though the controller saw it fail) is retagged by the recycle pass,
/// which otherwise leaves an unchanged port as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_recycle_pass_gives_a_released_port_its_pool_tag_back() -> Result<()> {
    use kuryr_controller::drivers::pool::holder;
    use kuryr_crds::names::neutron as tags;
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.78.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_min = 1\nports_pool_batch = 1\nports_pool_update_frequency = 1",
        )
        .await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let term = start_pool_term(&pools).await?;
        let info = network_info(neutron, &fx).await?;
        let spec = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
        let pod = pod_ref("a");
        let (vif, origin) = pooled_vif(pools.as_ref(), &pod, &spec).await?;
        let name = pools.summaries()[0].name.clone();
        let foreign: Vec<String> = neutron
            .get_port(vif.id())
            .await?
            .tags
            .into_iter()
            .filter(|t| !t.starts_with(tags::TAG_POOL_PREFIX))
            .chain([tags::pool_tag("kpp-k8s-node-1-0000000000000000")])
            .collect();
        neutron
            .replace_tags(kuryr_neutron::Taggable::Port, vif.id(), &foreign)
            .await?;
        pools
            .release_vif(&vif, &origin, &holder(&pod.namespace, &pod.name, &pod.uid))
            .await?;
        eventually("the released port retagged", WAIT, || async {
            let tags = neutron.get_port(vif.id()).await?.tags;
            let pool_tags: Vec<String> = tags
                .into_iter()
                .filter(|t| t.starts_with(tags::TAG_POOL_PREFIX))
                .collect();
            Ok((pool_tags == [tags::pool_tag(&name)]).then_some(()))
        })
        .await?;
        end_pool_term(term).await?;
        eprintln!("pool_books[{t}]: released port retagged for its pool");
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}

/// A retag changes the pool tags alone, one tag at a time: a tag someone else writes between
/// the controller's read of the port and its tag write stays (a whole-list replace from that
/// read dropped it). The emulator holds the controller's tag write while the other lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retag_keeps_a_tag_written_meanwhile() -> Result<()> {
    use anyhow::Context as _;
    use kuryr_controller::drivers::pool::holder;
    use kuryr_crds::names::neutron as tags;
    use neutron_emulator::{FaultConfig, FaultRule};
    init_logs();
    let targets = neutron_targets().await?;
    let target = targets
        .iter()
        .find(|t| t.emulator().is_some())
        .context("an emulator target")?;
    let emu = target.emulator().context("the emulator")?;
    let kube = start_kube().await?;
    let neutron = &target.client;
    let fx = neutron_fixture(neutron, "10.79.0.0/24").await?;
    let bed = PoolBed::new(
        &kube,
        &fx,
        "ports_pool_min = 1\nports_pool_batch = 1\nports_pool_update_frequency = 1",
    )
    .await?;
    let (_ctx, pools) = context(&kube, target, &bed).await?;
    let term = start_pool_term(&pools).await?;
    let info = network_info(neutron, &fx).await?;
    let spec = PortSpec::new("default", fx.project.clone(), info, vec![fx.sg.clone()]);
    let pod = pod_ref("a");
    let (vif, origin) = pooled_vif(pools.as_ref(), &pod, &spec).await?;
    let name = pools.summaries()[0].name.clone();
    // Given back carrying another pool's tag: the recycle pass retags it.
    let foreign: Vec<String> = neutron
        .get_port(vif.id())
        .await?
        .tags
        .into_iter()
        .filter(|t| !t.starts_with(tags::TAG_POOL_PREFIX))
        .chain([tags::pool_tag("kpp-k8s-node-1-0000000000000000")])
        .collect();
    neutron
        .replace_tags(kuryr_neutron::Taggable::Port, vif.id(), &foreign)
        .await?;
    emu.set_faults(FaultConfig {
        rules: vec![FaultRule::delay("port.tags", Duration::from_secs(2))],
        ..FaultConfig::default()
    });
    let tag_writes = || emu.stats().count("port.tags");
    let before = tag_writes();
    pools
        .release_vif(&vif, &origin, &holder(&pod.namespace, &pod.name, &pod.uid))
        .await?;
    // The controller read the port (its recycle update) and its first tag write is held.
    eventually("the retag's first write held", WAIT, || async {
        Ok((tag_writes() > before).then_some(()))
    })
    .await?;
    emu.set_faults(FaultConfig::default());
    neutron
        .add_tag(kuryr_neutron::Taggable::Port, vif.id(), "ops.owner=team-a")
        .await?;
    eventually("the released port retagged", WAIT, || async {
        let tags = neutron.get_port(vif.id()).await?.tags;
        let pool_tags: Vec<&String> = tags
            .iter()
            .filter(|t| t.starts_with(tags::TAG_POOL_PREFIX))
            .collect();
        Ok((pool_tags == [&tags::pool_tag(&name)]).then_some(tags))
    })
    .await
    .and_then(|tags| {
        ensure!(
            tags.iter().any(|t| t == "ops.owner=team-a"),
            "the tag written meanwhile is gone: {tags:?}"
        );
        Ok(())
    })?;
    end_pool_term(term).await?;
    cleanup_project(neutron, &fx.project).await;
    Ok(())
}

/// A port two pool objects list (a move whose donor's object was not written again before a
/// crash) is recovered into the pool that placed it last, whatever order the objects are read in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_port_two_pool_objects_list_belongs_where_it_was_placed_last() -> Result<()> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ListParams;
    use kuryr_crds::KuryrPortPool;
    init_logs();
    for target in neutron_targets().await? {
        let t = target.name;
        let kube = start_kube().await?;
        let neutron = &target.client;
        let fx = neutron_fixture(neutron, "10.81.0.0/24").await?;
        let bed = PoolBed::new(
            &kube,
            &fx,
            "ports_pool_min = 2\nports_pool_batch = 2\nports_pool_update_frequency = 1",
        )
        .await?;
        let (_ctx, pools) = context(&kube, &target, &bed).await?;
        let term = start_pool_term(&pools).await?;
        let other_sg = extra_group(neutron, &fx, "pool-books-twice").await?;
        let info = network_info(neutron, &fx).await?;
        let first = PortSpec::new("default", fx.project.clone(), info.clone(), vec![fx.sg.clone()]);
        let second = PortSpec::new("default", fx.project.clone(), info, vec![other_sg.clone()]);
        pooled_vif(pools.as_ref(), &pod_ref("a"), &first).await?;
        pooled_vif(pools.as_ref(), &pod_ref("b"), &second).await?;
        let kpps = Api::<KuryrPortPool>::namespaced(kube.client.clone(), CONTROLLER_NS);
        let listed = eventually("both pools' spares listed", WAIT, || async {
            let l = kpps.list(&ListParams::default()).await?.items;
            Ok((l.len() == 2
                && l.iter()
                    .all(|p| p.status.as_ref().is_some_and(|s| !s.available.is_empty())))
            .then_some(l))
        })
        .await?;
        end_pool_term(term).await?;
        // Read in this order: the old recovery kept the last listing read.
        let (placed_last, read_last) = (&listed[0], &listed[1]);
        let port = read_last.status.as_ref().expect("status").available[0].clone();
        let since = port.since.0;
        let mut stale = port.clone();
        stale.since = Time(since - std::time::Duration::from_secs(60));
        let mut fresh = port.clone();
        fresh.since = Time(since + std::time::Duration::from_secs(60));
        for (obj, entry) in [(read_last, stale), (placed_last, fresh)] {
            let mut obj = kpps.get(obj.metadata.name.as_deref().expect("name")).await?;
            let st = obj.status.as_mut().expect("status");
            st.available.retain(|p| p.port_id != port.port_id);
            st.available.push(entry);
            st.update_counts();
            kpps.replace_status(
                obj.metadata.name.as_deref().expect("name"),
                &PostParams::default(),
                &obj,
            )
            .await?;
        }

        let (_ctx, again) = context(&kube, &target, &bed).await?;
        let name = placed_last.metadata.name.clone().expect("name");
        let holder = again
            .summaries()
            .into_iter()
            .map(|s| s.name)
            .filter(|n| {
                again
                    .find(n)
                    .and_then(|(d, k)| d.snapshot(&k))
                    .is_some_and(|s| s.ports.iter().any(|p| p.port_id == port.port_id))
            })
            .collect::<Vec<_>>();
        assert_eq!(holder, [name], "{t}: the pool that placed it last holds it");
        cleanup_project(neutron, &fx.project).await;
    }
    Ok(())
}
