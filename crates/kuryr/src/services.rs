//! `kuryr controller` and `kuryr daemon`: the long-running services.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use kuryr_config::KuryrConfig;
use kuryr_controller::metrics::Metrics;
use kuryr_controller::openstack::Deployments;
use kuryr_controller::service::{ControllerOptions, run};
use kuryr_daemon::DaemonConfig;
use tokio_util::sync::CancellationToken;

use crate::cli::{ControllerArgs, DaemonArgs};
use crate::kubeclient;

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}

pub async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let config = Arc::new(args.config.load()?.config);
    let kube = kubeclient::client(&args.kube, &config).await?;
    let metrics = Metrics::new();
    let deployments = Deployments::from_config(&config, &metrics).context("OpenStack deployments")?;
    let mut opts = ControllerOptions::new(config, kube, deployments, metrics);
    if let Some(identity) = args.identity {
        opts.identity = identity;
    }
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    run(opts, stop).await.context("controller")
}

pub async fn daemon(args: DaemonArgs) -> anyhow::Result<()> {
    let config = args.config.load_without_credentials()?.config;
    let node = match args.node_name.filter(|n| !n.is_empty()) {
        Some(n) => n,
        None => hostname()
            .context("--node-name (or $KUBERNETES_NODE_NAME) is not set and the hostname is unreadable")?,
    };
    let daemon_config = daemon_config(&config, &node, args.unix_socket, args.state_dir);
    let kube = kubeclient::client(&args.kube, &config).await?;
    kuryr_daemon::kube::run(daemon_config, kube, shutdown_signal())
        .await
        .context("CNI daemon")
}

/// The daemon's settings: everything from `kuryr.conf` through the daemon's
/// one constructor ([`DaemonConfig::from_kuryr_config`]), then the CLI flags
/// (the node name is already resolved from `--node-name`/env/hostname).
fn daemon_config(
    config: &KuryrConfig,
    node: &str,
    unix_socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
) -> DaemonConfig {
    let mut d = DaemonConfig::from_kuryr_config(config, node);
    d.unix_socket = unix_socket;
    if let Some(dir) = state_dir {
        d.state_dir = Some(dir);
    }
    d
}

fn hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    let name = name.trim();
    anyhow::ensure!(!name.is_empty(), "empty hostname");
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn daemon_settings_come_from_the_upstream_sections() -> anyhow::Result<()> {
        let loaded = KuryrConfig::from_ini_str(
            "[cni_daemon]\nbind_address = 127.0.0.1:6036\nvif_annotation_timeout = 7\nnetns_proc_dir = /host/proc\n\
             [cni_health_server]\nport = 8091\n[prometheus_exporter]\ncni_exporter_port = 9666\n\
             [binding]\nlink_iface = ens3\n[neutron_defaults]\novs_bridge = br-kuryr\n",
        )?;
        let d = daemon_config(&loaded.config, "node-a", None, None);
        assert_eq!(d.node_name, "node-a");
        assert_eq!(d.bind_address, "127.0.0.1:6036".parse()?);
        assert_eq!(d.health_address.port(), 8091);
        assert_eq!(d.metrics_address.port(), 9666);
        assert_eq!(d.vif_annotation_timeout, Duration::from_secs(7));
        assert_eq!(
            d.netns_proc_dir.as_deref(),
            Some(std::path::Path::new("/host/proc"))
        );
        assert_eq!(d.binding.link_iface.as_deref(), Some("ens3"));
        assert_eq!(d.binding.ovs_bridge, "br-kuryr");
        Ok(())
    }

    #[test]
    fn empty_link_iface_means_none() -> anyhow::Result<()> {
        let d = daemon_config(&KuryrConfig::from_ini_str("")?.config, "n", None, None);
        assert_eq!(d.binding.link_iface, None);
        assert_eq!(d.bind_address, "127.0.0.1:5036".parse()?);
        assert_eq!(
            d.state_dir.as_deref(),
            Some(std::path::Path::new(kuryr_daemon::daemon::DEFAULT_STATE_DIR))
        );
        Ok(())
    }

    /// `kuryr daemon` must carry every daemon option of kuryr.conf, not only
    /// the ones it once copied by hand (OVS database and plug mode, SR-IOV
    /// PFs, the OVS timeout), and the CLI flags must win.
    #[test]
    fn daemon_cli_carries_binding_and_sriov_options() -> anyhow::Result<()> {
        let loaded = KuryrConfig::from_ini_str(
            "[binding]\novs_db = unix:/run/ovs/db.sock\novs_datapath_type = netdev\novs_plug_mode = linux_bridge\n\
             [sriov]\nphysical_device_mappings = physnet1:ens1f0,physnet1:ens1f1,physnet2:ens2f0\n\
             [cni_daemon]\npyroute2_timeout = 25\n",
        )?;
        let d = daemon_config(
            &loaded.config,
            "node-b",
            Some("/run/kuryr/daemon.sock".into()),
            Some("/tmp/kuryr-state".into()),
        );
        assert_eq!(
            d.state_dir.as_deref(),
            Some(std::path::Path::new("/tmp/kuryr-state"))
        );
        assert_eq!(d.node_name, "node-b");
        assert_eq!(
            d.unix_socket.as_deref(),
            Some(std::path::Path::new("/run/kuryr/daemon.sock"))
        );
        assert_eq!(d.binding.ovs_db.as_deref(), Some("unix:/run/ovs/db.sock"));
        assert_eq!(d.binding.ovs_datapath_type, "netdev");
        assert_eq!(d.binding.ovs_plug, kuryr_config::OvsPlugMode::LinuxBridge);
        assert_eq!(d.binding.ovs_timeout_secs, 25);
        assert_eq!(
            d.binding.sriov.options.pfs_of_physnet("physnet1"),
            Some(&["ens1f0".to_string(), "ens1f1".to_string()][..])
        );
        assert_eq!(
            d.binding.sriov.options.pfs_of_physnet("physnet2"),
            Some(&["ens2f0".to_string()][..])
        );
        Ok(())
    }
}
