//! The shared ACTIVE poller against the Neutron emulator: many waiting ports cost a few batched
//! list calls and no per-port reads; a deleted port ends its wait; a port that never binds times
//! out as ResourceNotReady.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kuryr_controller::drivers::vif::active::{ActivePoller, PollSettings};
use kuryr_controller::error::Error;
use kuryr_neutron::{ClientOptions, NeutronClient, PortCreate};
use neutron_emulator::{AgentHosts, Emulator, EmulatorOptions};

async fn emulator(active_delay: Duration) -> (neutron_emulator::EmulatorHandle, NeutronClient, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let emu = Emulator::start(EmulatorOptions {
        active_delay,
        agent_hosts: AgentHosts::Only(["node-1".to_string()].into()),
        ..EmulatorOptions::default()
    })
    .await
    .unwrap();
    let client = NeutronClient::new(&ClientOptions::noauth(emu.url())).unwrap();
    let net = client
        .create_network(&kuryr_neutron::NetworkCreate {
            name: Some("pods".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .create_subnet(&kuryr_neutron::SubnetCreate {
            network_id: net.id.clone(),
            ip_version: 4,
            cidr: Some("10.90.0.0/22".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    (emu, client, net.id)
}

fn bound(net: &str, host: &str) -> PortCreate {
    PortCreate {
        binding_host_id: Some(host.into()),
        ..PortCreate::new(net)
    }
}

fn settings() -> PollSettings {
    PollSettings {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
        chunk: 80,
        wait: Duration::from_secs(20),
        parks: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiting_ports_share_batched_list_calls() {
    let (emu, client, net) = emulator(Duration::from_millis(300)).await;
    let ports = client
        .create_ports(&vec![bound(&net, "node-1"); 100])
        .await
        .unwrap();
    emu.reset_stats();
    let poller = ActivePoller::new(client.clone(), settings());
    let waits = ports.iter().map(|p| {
        let poller = poller.clone();
        let id = p.id.clone();
        tokio::spawn(async move { poller.wait_active(&id).await })
    });
    for w in futures::future::join_all(waits).await {
        w.unwrap().expect("every port turns ACTIVE");
    }
    let stats = emu.stats();
    assert_eq!(stats.count("port.get"), 0, "{stats:?}");
    let lists = stats.count("port.list");
    // 100 ids make 2 chunks per poll; a poll per port would be hundreds of calls.
    assert!(lists >= 2 && lists % 2 == 0, "{stats:?}");
    assert!(lists <= 30, "{lists} list calls for 100 ports: {stats:?}");
    assert_eq!(poller.pending(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_port_ends_its_wait_and_an_unbound_one_times_out() {
    let (_emu, client, net) = emulator(Duration::from_secs(3600)).await;
    let doomed = client.create_port(&bound(&net, "node-1")).await.unwrap();
    let poller = ActivePoller::new(client.clone(), settings());
    let wait = {
        let poller = poller.clone();
        let id = doomed.id.clone();
        tokio::spawn(async move { poller.wait_active(&id).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.delete_port(&doomed.id).await.unwrap();
    let err = wait
        .await
        .unwrap()
        .expect_err("a deleted port never turns ACTIVE");
    assert!(
        matches!(err, Error::ResourceNotReady(ref m) if m.contains("gone")),
        "{err}"
    );

    let never = client.create_port(&bound(&net, "node-1")).await.unwrap();
    let short = ActivePoller::new(
        client.clone(),
        PollSettings {
            wait: Duration::from_millis(500),
            ..settings()
        },
    );
    let err = short
        .wait_active(&never.id)
        .await
        .expect_err("not ACTIVE within the wait");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains(&never.id), "{err}");
    assert_eq!(short.pending(), 0, "a waiter that gave up is not polled for");
}
