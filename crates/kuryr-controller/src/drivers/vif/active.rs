//! Waiting for ports to turn ACTIVE, shared by every pod of a deployment.
//!
//! Each pod's wait registers its port with the deployment's [`ActivePoller`]; one background task
//! asks Neutron about every pending port at once (`GET /v2.0/ports?id=a&id=b&...&fields=id&
//! fields=status`, chunked so that URLs stay short) and wakes the waiters whose port is ACTIVE.
//! A burst of N pods costs one list call per poll instead of N port reads per retry round, and
//! a pod learns its port is up within one poll interval instead of after a growing backoff.
//!
//! The mechanism (adaptive interval, waiters woken per key) is [`crate::batch_poller`]'s, shared
//! with the load balancers' provisioning waits.

use async_trait::async_trait;
use kuryr_neutron::{ListFilter, NeutronClient};

use crate::batch_poller::{BatchPoller, BatchPollers, StatusSource, WaitEnd};
pub use crate::batch_poller::{PollSettings, next_interval};
use crate::error::Error;
use crate::openstack::Deployments;

/// What a poll learned about one pending port.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Active,
    /// Not in Neutron's answer: the port was deleted.
    Gone,
}

/// Port statuses from one Neutron, by the batch.
struct PortStatuses(NeutronClient);

#[async_trait]
impl StatusSource for PortStatuses {
    type Key = String;
    type Outcome = Outcome;
    type Error = kuryr_neutron::Error;

    /// One list call for `ids`: which of them are ACTIVE or gone.
    async fn poll(&self, ids: &[String]) -> Result<Vec<(String, Outcome)>, kuryr_neutron::Error> {
        let mut filter = ListFilter::new();
        for id in ids {
            filter = filter.id(id.clone());
        }
        let ports = self.0.list_ports(&filter.fields(["id", "status"])).await?;
        let mut out = Vec::new();
        for id in ids {
            match ports.iter().find(|p| &p.id == id) {
                Some(p) if p.is_active() => out.push((id.clone(), Outcome::Active)),
                Some(_) => {}
                None => out.push((id.clone(), Outcome::Gone)),
            }
        }
        Ok(out)
    }
}

/// The shared ACTIVE checks of one deployment.
#[derive(Clone)]
pub struct ActivePoller {
    poller: BatchPoller<PortStatuses>,
}

impl ActivePoller {
    /// Port ids are 36-character UUIDs, about 40 bytes each in the query: the default chunk of 80
    /// stays well under the 4 KiB request line a uWSGI-served neutron-server accepts by default.
    pub fn new(client: NeutronClient, settings: PollSettings) -> Self {
        Self {
            poller: BatchPoller::new(PortStatuses(client), settings),
        }
    }

    /// Ports currently waited for.
    pub fn pending(&self) -> usize {
        self.poller.pending()
    }

    /// Waits until Neutron reports `port_id` ACTIVE. ResourceNotReady after the settings' `wait`,
    /// and when the port is gone.
    pub async fn wait_active(&self, port_id: &str) -> Result<(), Error> {
        match self.poller.wait(port_id.to_string()).await {
            Ok(Outcome::Active) => Ok(()),
            Ok(Outcome::Gone) => Err(Error::not_ready(format!("port {port_id} is gone from Neutron"))),
            Err(WaitEnd::TimedOut(wait)) => Err(Error::not_ready(format!(
                "port {port_id} is not ACTIVE after {}s",
                wait.as_secs()
            ))),
        }
    }
}

/// One [`ActivePoller`] per deployment, made on first use.
pub struct ActivePollers {
    deployments: Deployments,
    pollers: BatchPollers<PortStatuses>,
}

impl ActivePollers {
    pub fn new(deployments: Deployments, settings: PollSettings) -> Self {
        Self {
            deployments,
            pollers: BatchPollers::new(settings),
        }
    }

    pub fn get(&self, deployment: &str) -> Result<ActivePoller, Error> {
        let poller = self.pollers.get(deployment, || {
            Ok::<_, Error>(PortStatuses(self.deployments.client(deployment)?.clone()))
        })?;
        Ok(ActivePoller { poller })
    }
}
