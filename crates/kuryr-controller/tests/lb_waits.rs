//! The shared load balancer waits against the Octavia emulator: many pending load balancers cost
//! a few batched list calls and no per-load-balancer reads; each waiter wakes when its own load
//! balancer goes ACTIVE or ERROR; a deletion is confirmed; `lbaas_activation_timeout` bounds a wait.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kuryr_controller::services::provisioning::{LbWaits, settings};
use kuryr_neutron::ClientOptions;
use kuryr_neutron::octavia::{LoadBalancerCreate, OctaviaClient, OctaviaError};
use octavia_emulator::{LatencyProfile, OctaviaEmulator, OctaviaHandle, OctaviaOptions, WorkerDelays};

/// The emulator takes any subnet in UUID form (it only checks the format, as Octavia's API does).
const SUBNET: &str = "6f1a3c8e-0d55-4a63-9a3e-2f4b7f1c9d20";
const PROJECT: &str = "0b9f3c2e5d7a4e1f8c6b2a9d4e7f1c3a";

async fn emulator(lb_create_ms: u64) -> (OctaviaHandle, OctaviaClient) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = OctaviaEmulator::start(OctaviaOptions {
        latency: LatencyProfile::Custom {
            api_ms: BTreeMap::new(),
            worker: WorkerDelays {
                lb_create_ms,
                lb_delete_ms: 300,
                ..WorkerDelays::default()
            },
        },
        ..OctaviaOptions::default()
    })
    .await
    .unwrap();
    let client = OctaviaClient::new(&ClientOptions::noauth(emu.url())).unwrap();
    (emu, client)
}

fn tag(i: usize) -> String {
    format!("kuryr-rs.service=demo/svc-{i}")
}

async fn create(client: &OctaviaClient, i: usize) -> String {
    client
        .create_load_balancer(&LoadBalancerCreate {
            name: Some(format!("demo/svc-{i}")),
            vip_subnet_id: Some(SUBNET.into()),
            project_id: Some(PROJECT.into()),
            tags: vec!["kuryr-rs".into(), tag(i)],
            ..Default::default()
        })
        .await
        .unwrap()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pending_load_balancers_share_batched_list_calls() {
    let (emu, client) = emulator(1500).await;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(create(&client, i).await);
    }
    emu.reset_stats();
    let waits = LbWaits::new(client.clone(), settings(300));
    let started = Instant::now();
    let all = ids.iter().enumerate().map(|(i, id)| {
        let waits = waits.clone();
        let id = id.clone();
        tokio::spawn(async move { waits.active(&id, Some(&tag(i))).await })
    });
    for (w, id) in futures::future::join_all(all).await.into_iter().zip(&ids) {
        let lb = w.unwrap().expect("ACTIVE").expect("still there");
        assert_eq!(&lb.id, id);
        assert_eq!(lb.provisioning_status, "ACTIVE");
    }
    let stats = emu.stats();
    assert_eq!(stats.count("loadbalancer.get"), 0, "{stats:?}");
    let lists = stats.count("loadbalancer.list");
    // 50 tags make 2 chunks per poll; polling each on its own would be 50 GETs per round.
    assert!(lists >= 2, "{stats:?}");
    assert!(lists <= 30, "{lists} list calls for 50 load balancers: {stats:?}");
    // Woken within about one (short) interval of going ACTIVE, not after a long backoff.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(waits.pending(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_wakes_its_waiter_a_deletion_is_confirmed_and_the_timeout_holds() {
    let (emu, client) = emulator(3_600_000).await;
    let waits = LbWaits::new(client.clone(), settings(300));

    // ERROR ends the wait at once with ProvisioningFailed; the other load balancer keeps waiting.
    let doomed = create(&client, 1).await;
    let other = create(&client, 2).await;
    let wait_doomed = {
        let waits = waits.clone();
        let id = doomed.clone();
        tokio::spawn(async move { waits.active(&id, Some(&tag(1))).await })
    };
    let wait_other = {
        let waits = waits.clone();
        let id = other.clone();
        tokio::spawn(async move { waits.active(&id, Some(&tag(2))).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    emu.force_error(&doomed).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), wait_doomed)
        .await
        .expect("woken")
        .unwrap()
        .expect_err("ERROR is not ACTIVE");
    assert!(
        matches!(err, OctaviaError::ProvisioningFailed { ref lb_id, .. } if *lb_id == doomed),
        "{err}"
    );
    assert!(
        !wait_other.is_finished(),
        "the other load balancer is still pending"
    );
    wait_other.abort();

    // A cascade delete: the wait ends once Octavia no longer has it (confirmed by one read).
    emu.reset_stats();
    client.delete_load_balancer(&doomed, true).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waits.deleted(&doomed, Some(&tag(1))))
        .await
        .expect("deleted in time")
        .expect("deleted");
    assert!(
        client
            .get_load_balancer(&doomed)
            .await
            .unwrap_err()
            .is_not_found()
    );

    // [neutron_defaults] lbaas_activation_timeout = 1: a load balancer still PENDING_CREATE after 1 s is a
    // WaitTimeout (retryable), and it is no longer polled for.
    let short = LbWaits::new(client.clone(), settings(1));
    let started = Instant::now();
    let err = short
        .active(&other, Some(&tag(2)))
        .await
        .expect_err("still pending");
    assert!(matches!(err, OctaviaError::WaitTimeout { .. }), "{err}");
    assert!(err.is_transient(), "{err}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(short.pending(), 0, "a waiter that gave up is not polled for");
}

/// A load balancer without a kuryr-rs Service tag (one upstream made, adopted) is read on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untagged_load_balancer_is_read_alone() {
    let (emu, client) = emulator(500).await;
    let lb = client
        .create_load_balancer(&LoadBalancerCreate {
            name: Some("demo/upstream".into()),
            vip_subnet_id: Some(SUBNET.into()),
            project_id: Some(PROJECT.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    emu.reset_stats();
    let waits = LbWaits::new(client.clone(), settings(300));
    let got = waits.active(&lb.id, None).await.unwrap().expect("there");
    assert_eq!(got.provisioning_status, "ACTIVE");
    let stats = emu.stats();
    assert_eq!(stats.count("loadbalancer.list"), 0, "{stats:?}");
    assert!(stats.count("loadbalancer.get") >= 1, "{stats:?}");
}

/// A write Octavia refuses because the load balancer is busy (409 while PENDING_*) waits on the
/// shared waits (list calls by tag, no per-write GET loop) and is resent once it is ACTIVE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_busy_load_balancer_waits_on_the_shared_waits_and_is_resent() {
    use kuryr_controller::services::octavia::LbActor;
    let (emu, client) = emulator(1500).await;
    let client = client.without_busy_retry();
    let lb = create(&client, 7).await;
    emu.reset_stats();
    let actor = LbActor {
        client: &client,
        waits: LbWaits::new(client.clone(), settings(300)),
        tags: vec!["kuryr-rs".into(), tag(7)],
    };
    // Still PENDING_CREATE: Octavia refuses the delete with 409 until it is ACTIVE.
    tokio::time::timeout(Duration::from_secs(20), actor.delete(&lb))
        .await
        .expect("in time")
        .expect("deleted after the wait");
    assert!(client.get_load_balancer(&lb).await.unwrap_err().is_not_found());
    let stats = emu.stats();
    assert_eq!(
        stats.count("loadbalancer.delete"),
        2,
        "refused, then taken: {stats:?}"
    );
    assert!(stats.count("loadbalancer.list") >= 1, "{stats:?}");
    // One read confirms the deletion (404); the busy wait itself read nothing on its own.
    assert!(stats.count("loadbalancer.get") <= 2, "{stats:?}");
}
