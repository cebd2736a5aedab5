//! Per-case context: a client, a private project, fixtures, typed-error assertions and the cleanup sweep.

use std::time::Duration;

use anyhow::{Context as _, anyhow};
use kuryr_neutron::octavia::{
    HealthMonitorCreate, ListenerCreate, LoadBalancer, LoadBalancerCreate, MemberCreate, OctaviaClient,
    OctaviaError, OctaviaErrorKind, PoolCreate, Provisioning, WaitOptions,
};
use kuryr_neutron::{ClientOptions, ListFilter};

pub struct Ctx {
    pub client: OctaviaClient,
    base_url: String,
    pub project: String,
    pub case: &'static str,
    /// Any UUID is a subnet to the noop network driver; one per case.
    pub subnet_id: String,
}

impl Ctx {
    pub fn new(base_url: &str, case: &'static str) -> anyhow::Result<Self> {
        let mut opts = ClientOptions::noauth(base_url);
        opts.timeout = Some(Duration::from_secs(60));
        let client = OctaviaClient::new(&opts)?.with_wait_options(WaitOptions {
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(60),
        });
        let short = uuid::Uuid::new_v4().simple().to_string();
        Ok(Self {
            client,
            base_url: base_url.to_owned(),
            // Octavia caps project_id at 36 characters: the case name lives in the resource names instead.
            project: format!("ct-{short}"),
            case,
            subnet_id: uuid::Uuid::new_v4().to_string(),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn project_filter(&self) -> ListFilter {
        ListFilter::new().project_id(&self.project)
    }

    /// A load balancer request in this project, without children.
    pub fn lb_req(&self, name: &str) -> LoadBalancerCreate {
        LoadBalancerCreate {
            name: Some(format!("{}-{name}", self.case)),
            project_id: Some(self.project.clone()),
            vip_subnet_id: Some(self.subnet_id.clone()),
            ..LoadBalancerCreate::default()
        }
    }

    pub fn member(&self, address: &str, port: u16) -> MemberCreate {
        MemberCreate {
            subnet_id: Some(self.subnet_id.clone()),
            ..MemberCreate::new(address, port)
        }
    }

    /// A fully populated request: one TCP listener on `port` -> ROUND_ROBIN pool with `members` and a TCP monitor.
    pub fn populated_req(&self, name: &str, port: u16, members: &[(&str, u16)]) -> LoadBalancerCreate {
        LoadBalancerCreate {
            listeners: vec![ListenerCreate {
                name: Some(format!("{name}-l{port}")),
                default_pool: Some(Box::new(PoolCreate {
                    name: Some(format!("{name}-p{port}")),
                    members: members.iter().map(|(a, p)| self.member(a, *p)).collect(),
                    healthmonitor: Some(HealthMonitorCreate {
                        monitor_type: "TCP".into(),
                        delay: 5,
                        timeout: 3,
                        max_retries: 3,
                        ..HealthMonitorCreate::default()
                    }),
                    ..PoolCreate::new("TCP", "ROUND_ROBIN")
                })),
                ..ListenerCreate::new("TCP", port)
            }],
            ..self.lb_req(name)
        }
    }

    /// Create and wait for ACTIVE.
    pub async fn active_lb(&self, req: &LoadBalancerCreate) -> anyhow::Result<LoadBalancer> {
        let lb = self
            .client
            .create_load_balancer(req)
            .await
            .context("create load balancer")?;
        self.client
            .wait_for_provisioning(&lb.id, Provisioning::Active)
            .await
            .with_context(|| format!("wait for {} to be ACTIVE", lb.id))?
            .ok_or_else(|| anyhow!("load balancer {} vanished", lb.id))
    }

    /// Cascade-delete every load balancer of this project, wait until they are gone, reset its quota.
    pub async fn sweep(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let lbs = match self.client.list_load_balancers(&self.project_filter()).await {
            Ok(l) => l,
            Err(e) => return vec![format!("list load balancers: {e}")],
        };
        for lb in &lbs {
            if let Err(e) = self.client.delete_load_balancer(&lb.id, true).await
                && !e.is_not_found()
            {
                errors.push(format!("delete {}: {e}", lb.id));
            }
        }
        for lb in &lbs {
            if let Err(e) = self
                .client
                .wait_for_provisioning(&lb.id, Provisioning::Deleted)
                .await
            {
                errors.push(format!("wait for {} to go: {e}", lb.id));
            }
        }
        if let Err(e) = self.client.reset_quota(&self.project).await
            && !e.is_not_found()
        {
            errors.push(format!("reset quota: {e}"));
        }
        errors
    }
}

/// The error of `r`, which must have failed with `status` and a kind matching `kind`.
pub fn expect_error<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, OctaviaError>,
    status: u16,
    kind: impl Fn(&OctaviaErrorKind) -> bool,
) -> anyhow::Result<OctaviaError> {
    match r {
        Ok(v) => Err(anyhow!("{what}: expected {status}, got success {v:?}")),
        Err(e) if e.status() == Some(status) && e.kind().is_some_and(&kind) => Ok(e),
        Err(e) => Err(anyhow!("{what}: expected {status}, got {e}")),
    }
}
