//! Usage of each deployment, measured periodically off the request path (docs/architecture.md#several-openstack-deployments:
//! statistics are collected periodically, never inside a request). For kuryr the capacity that runs out is addresses on
//! the pod networks, so usage = used / total IPs over the networks the deployment reports.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kuryr_neutron::ListFilter;
use tokio_util::sync::CancellationToken;

use super::Binder;
use crate::openstack::Deployments;

/// One measurement of every deployment; deployments that cannot be measured are left out (their
/// previous figure stays).
pub async fn measure(deployments: &Deployments) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for name in deployments.names() {
        let Ok(client) = deployments.client(name) else {
            continue;
        };
        match client.list_network_ip_availabilities(&ListFilter::new()).await {
            Ok(avail) => {
                let (used, total) = avail
                    .iter()
                    .fold((0u128, 0u128), |(u, t), a| (u + a.used_ips, t + a.total_ips));
                if total > 0 {
                    out.insert(name.to_string(), used as f64 / total as f64);
                }
            }
            Err(e) => tracing::warn!(deployment = name, error = %e, "usage measurement failed"),
        }
    }
    out
}

pub async fn run(binder: Arc<Binder>, deployments: Deployments, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => binder.set_usage(&measure(&deployments).await).await,
        }
    }
}
