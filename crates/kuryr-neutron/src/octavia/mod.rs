//! Typed Octavia v2 client (catalog type `load-balancer`, API under `/v2`), on the same transport as
//! [`crate::NeutronClient`]: Keystone, retries, concurrency cap, request ids and the metrics hook are shared code.
//!
//! Octavia changes a load balancer asynchronously: every write puts it in `PENDING_*` until the provider is done, and
//! a write to a busy load balancer is refused with 409 ([`OctaviaErrorKind::Immutable`]). The client's writes wait for
//! the load balancer named in that 409 to be ACTIVE again (capped exponential backoff with jitter) and resend, up to
//! [`WaitOptions::timeout`]; [`OctaviaClient::wait_for_provisioning`] waits after a write.
//!
//! ```no_run
//! # async fn demo() -> kuryr_neutron::octavia::OctaviaResult<()> {
//! use kuryr_neutron::ClientOptions;
//! use kuryr_neutron::octavia::*;
//! let octavia = OctaviaClient::new(&ClientOptions::noauth("http://127.0.0.1:9876"))?;
//! let lb = octavia
//!     .create_load_balancer(&LoadBalancerCreate {
//!         vip_subnet_id: Some("subnet-id".into()),
//!         listeners: vec![ListenerCreate {
//!             default_pool: Some(Box::new(PoolCreate {
//!                 name: Some("svc-80".into()), // fully populated creates need named pools
//!                 members: vec![MemberCreate::new("10.0.0.5", 8080)],
//!                 ..PoolCreate::new("TCP", "ROUND_ROBIN")
//!             })),
//!             ..ListenerCreate::new("TCP", 80)
//!         }],
//!         ..LoadBalancerCreate::default()
//!     })
//!     .await?;
//! octavia.wait_for_provisioning(&lb.id, Provisioning::Active).await?;
//! # Ok(()) }
//! ```

mod error;
mod types;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub use error::{OctaviaApiError, OctaviaError, OctaviaErrorKind, OctaviaResult};
pub use types::*;

use crate::auth::ClientOptions;
use crate::client::Page;
use crate::filter::ListFilter;
use crate::metrics::Metrics;
use crate::quota_gate::{QuotaGate, project_of};
use crate::transport::{Call, Reply, Service, StatusFailure, Transport};

/// Octavia on the shared transport.
pub(crate) struct Octavia;

impl Service for Octavia {
    type Error = OctaviaError;
    const NAME: &'static str = "octavia";
    const SERVICE_TYPE: &'static str = "load-balancer";
    const VERSION: &'static str = "v2";

    fn api_error(f: StatusFailure) -> OctaviaError {
        OctaviaError::Api(Box::new(OctaviaApiError::from_failure(f)))
    }
    fn error_label(e: &OctaviaError) -> Option<&str> {
        e.kind().map(OctaviaErrorKind::as_str)
    }
    fn status(e: &OctaviaError) -> Option<u16> {
        e.status()
    }
    fn request_id(e: &OctaviaError) -> Option<&str> {
        e.request_id()
    }
}

/// How long and how often to poll a load balancer's `provisioning_status`.
#[derive(Debug, Clone, Copy)]
pub struct WaitOptions {
    /// First poll interval; doubles per poll up to `max_interval`, each with jitter.
    pub initial_interval: Duration,
    pub max_interval: Duration,
    /// Give up after this long ([`OctaviaError::WaitTimeout`]); also bounds the 409 wait-and-retry of writes.
    pub timeout: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        Self {
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(300),
        }
    }
}

impl WaitOptions {
    /// Poll interval before poll number `n` (1-based): doubling from `initial_interval`, capped, with "equal jitter"
    /// (half fixed, half random) so that pollers spread out but never spin.
    pub fn interval(&self, n: u32) -> Duration {
        let cap = self
            .initial_interval
            .saturating_mul(1u32 << n.saturating_sub(1).min(16))
            .min(self.max_interval);
        let half = cap / 2;
        let jitter_ms = half.as_millis().min(u128::from(u64::MAX)) as u64;
        half + Duration::from_millis(rand::rng().random_range(0..=jitter_ms))
    }
}

/// What [`OctaviaClient::wait_for_provisioning`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    /// `provisioning_status` ACTIVE.
    Active,
    /// The load balancer is gone (404) - or `DELETED`, which Octavia shows briefly.
    Deleted,
}

impl Provisioning {
    fn as_str(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Deleted => "deletion",
        }
    }
}

/// Typed Octavia v2 client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct OctaviaClient {
    transport: Transport<Octavia>,
    wait: WaitOptions,
    /// Whether writes refused with 409 while a load balancer is `PENDING_*` are waited out and resent.
    busy_retry: bool,
    gate: Arc<QuotaGate>,
}

impl OctaviaClient {
    /// Build a client; `opts.endpoint_override` is Octavia's endpoint (e.g. `http://127.0.0.1:9876`), otherwise the
    /// catalog's `load-balancer` endpoint is used. Authentication happens lazily on the first call.
    pub fn new(opts: &ClientOptions) -> OctaviaResult<Self> {
        Ok(Self {
            transport: Transport::new(opts, None)?,
            wait: WaitOptions::default(),
            busy_retry: true,
            gate: Arc::default(),
        })
    }

    /// Like [`OctaviaClient::new`], reporting every operation to `metrics`.
    pub fn with_metrics(opts: &ClientOptions, metrics: Arc<dyn Metrics>) -> OctaviaResult<Self> {
        Ok(Self {
            transport: Transport::new(opts, Some(metrics))?,
            wait: WaitOptions::default(),
            busy_retry: true,
            gate: Arc::default(),
        })
    }

    /// Replace the polling and 409-retry limits.
    pub fn with_wait_options(mut self, wait: WaitOptions) -> Self {
        self.wait = wait;
        self
    }

    /// Writes refused because a load balancer is `PENDING_*` (409, [`OctaviaErrorKind::Immutable`]) return that
    /// error at once: for a caller that waits for load balancers itself (one shared poll for many, without
    /// holding a worker meanwhile) rather than in this client's per-write loop.
    pub fn without_busy_retry(mut self) -> Self {
        self.busy_retry = false;
        self
    }

    pub fn wait_options(&self) -> WaitOptions {
        self.wait
    }

    async fn execute(&self, call: Call) -> OctaviaResult<Reply> {
        self.transport.execute(call).await
    }

    /// A write that Octavia may refuse with 409 while something is `PENDING_*`: wait for the load balancer the
    /// 409 names (or, when it names a pool or listener, back off) and resend, until [`WaitOptions::timeout`].
    async fn write(&self, call: Call) -> OctaviaResult<Reply> {
        let started = Instant::now();
        let mut n = 0u32;
        loop {
            let err = match self.execute(call.clone()).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            let Some(OctaviaErrorKind::Immutable { resource, id, .. }) = err.kind().cloned() else {
                return Err(err);
            };
            if !self.busy_retry {
                return Err(err);
            }
            let left = self.wait.timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(err);
            }
            n += 1;
            let names_lb = resource.eq_ignore_ascii_case("loadbalancer")
                || resource.eq_ignore_ascii_case("load balancer");
            tracing::debug!(
                op = call.op,
                resource,
                id = id.as_deref().unwrap_or(""),
                attempt = n,
                "octavia resource busy, waiting before resending"
            );
            match id {
                Some(lb_id) if names_lb => {
                    let opts = WaitOptions {
                        timeout: left,
                        ..self.wait
                    };
                    match self.wait_with(&lb_id, Provisioning::Active, opts).await {
                        Ok(_) => {}
                        // Deleted meanwhile: resend, and let Octavia's answer (404) be the result.
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
                _ => tokio::time::sleep(self.wait.interval(n).min(left)).await,
            }
        }
    }

    async fn get_one<T: DeserializeOwned>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
    ) -> OctaviaResult<T> {
        Ok(self.execute(Call::new(op, Method::GET, seg)).await?.unwrap(key)?)
    }

    async fn create_one<T: DeserializeOwned, B: Serialize>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
        body: &B,
    ) -> OctaviaResult<T> {
        let body = serde_json::to_value(body)
            .map_err(|e| OctaviaError::Config(format!("{op}: cannot serialize request body: {e}")))?;
        let project = project_of(&body);
        // Octavia's quota resources are the body's keys (`loadbalancer`, `listener`, ...).
        let pass = match self.gate.admit(key, &project) {
            // Listeners, pools and members count against their load balancer's project, which
            // their bodies do not name: not gated.
            _ if project.is_empty() => None,
            Ok(pass) => Some(pass),
            Err(held) => {
                return Err(OctaviaError::Api(Box::new(OctaviaApiError {
                    kind: OctaviaErrorKind::Quota,
                    status: 403,
                    message: held.message(),
                    faultcode: None,
                    debuginfo: None,
                    request_id: None,
                    retry_after: None,
                    operation: op,
                })));
            }
        };
        let call = Call::new(op, Method::POST, seg).json(&json!({ key: body }))?;
        let answer = self.write(call).await;
        let over_quota = match &answer {
            Ok(_) => Some(false),
            Err(e) if e.kind() == Some(&OctaviaErrorKind::Quota) => Some(true),
            Err(_) => None,
        };
        if let Some(pass) = pass {
            self.gate.observe(key, &project, pass, over_quota);
        }
        Ok(answer?.unwrap(key)?)
    }

    async fn update_one<T: DeserializeOwned, B: Serialize>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
        body: &B,
    ) -> OctaviaResult<T> {
        let call = Call::new(op, Method::PUT, seg).json(&json!({ key: body }))?;
        Ok(self.write(call).await?.unwrap(key)?)
    }

    async fn delete_at(
        &self,
        op: &'static str,
        seg: &[&str],
        query: Vec<(String, String)>,
    ) -> OctaviaResult<()> {
        self.write(Call::new(op, Method::DELETE, seg).query(query))
            .await
            .map(|_| ())
    }

    /// One page of a collection (`marker` from the previous page's `next` link).
    async fn list_page_of<T: DeserializeOwned>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
        filter: &ListFilter,
        marker: Option<&str>,
    ) -> OctaviaResult<Page<T>> {
        let mut q = filter.to_pairs();
        if let Some(m) = marker {
            q.push(("marker".into(), m.to_owned()));
        }
        let reply = self.execute(Call::new(op, Method::GET, seg).query(q)).await?;
        let (items, next_marker) = reply.page(key)?;
        Ok(Page { items, next_marker })
    }

    async fn list_all_of<T: DeserializeOwned>(
        &self,
        op: &'static str,
        seg: &[&str],
        key: &str,
        filter: &ListFilter,
    ) -> OctaviaResult<Vec<T>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .list_page_of::<T>(op, seg, key, filter, marker.as_deref())
                .await?;
            let empty = page.items.is_empty();
            out.extend(page.items);
            match page.next_marker {
                Some(m) if !empty && marker.as_deref() != Some(m.as_str()) => marker = Some(m),
                _ => break,
            }
        }
        Ok(out)
    }

    // ------------------------------------------------------------ load balancers

    /// Create a load balancer; with `listeners`/`pools` set, the whole tree at once (fully populated create).
    pub async fn create_load_balancer(&self, req: &LoadBalancerCreate) -> OctaviaResult<LoadBalancer> {
        self.create_one(
            "create_load_balancer",
            &["lbaas", "loadbalancers"],
            "loadbalancer",
            req,
        )
        .await
    }
    pub async fn get_load_balancer(&self, id: &str) -> OctaviaResult<LoadBalancer> {
        self.get_one(
            "get_load_balancer",
            &["lbaas", "loadbalancers", id],
            "loadbalancer",
        )
        .await
    }
    /// Filters: `project_id`, `name`, `provisioning_status`, `vip_address`, `tags`, `tags-any`, `not-tags`, `limit`.
    pub async fn list_load_balancers(&self, filter: &ListFilter) -> OctaviaResult<Vec<LoadBalancer>> {
        self.list_all_of(
            "list_load_balancers",
            &["lbaas", "loadbalancers"],
            "loadbalancers",
            filter,
        )
        .await
    }
    pub async fn list_load_balancers_page(
        &self,
        filter: &ListFilter,
        marker: Option<&str>,
    ) -> OctaviaResult<Page<LoadBalancer>> {
        self.list_page_of(
            "list_load_balancers",
            &["lbaas", "loadbalancers"],
            "loadbalancers",
            filter,
            marker,
        )
        .await
    }
    pub async fn update_load_balancer(&self, id: &str, req: &ResourceUpdate) -> OctaviaResult<LoadBalancer> {
        self.update_one(
            "update_load_balancer",
            &["lbaas", "loadbalancers", id],
            "loadbalancer",
            req,
        )
        .await
    }
    /// Delete a load balancer; `cascade` deletes its listeners, pools, members and monitors with it (one call, one
    /// provisioning cycle) instead of refusing while it has children.
    pub async fn delete_load_balancer(&self, id: &str, cascade: bool) -> OctaviaResult<()> {
        let q = if cascade {
            vec![("cascade".to_owned(), "true".to_owned())]
        } else {
            Vec::new()
        };
        self.delete_at("delete_load_balancer", &["lbaas", "loadbalancers", id], q)
            .await
    }
    /// The status tree of a load balancer.
    pub async fn get_status_tree(&self, lb_id: &str) -> OctaviaResult<StatusTree> {
        self.get_one(
            "get_load_balancer_status",
            &["lbaas", "loadbalancers", lb_id, "status"],
            "statuses",
        )
        .await
    }

    // ------------------------------------------------------------ listeners

    pub async fn create_listener(&self, req: &ListenerCreate) -> OctaviaResult<Listener> {
        self.create_one("create_listener", &["lbaas", "listeners"], "listener", req)
            .await
    }
    pub async fn get_listener(&self, id: &str) -> OctaviaResult<Listener> {
        self.get_one("get_listener", &["lbaas", "listeners", id], "listener")
            .await
    }
    /// Filters: `loadbalancer_id`, `project_id`, `protocol_port`, `tags`, ...
    pub async fn list_listeners(&self, filter: &ListFilter) -> OctaviaResult<Vec<Listener>> {
        self.list_all_of("list_listeners", &["lbaas", "listeners"], "listeners", filter)
            .await
    }
    pub async fn update_listener(&self, id: &str, req: &ResourceUpdate) -> OctaviaResult<Listener> {
        self.update_one("update_listener", &["lbaas", "listeners", id], "listener", req)
            .await
    }
    pub async fn delete_listener(&self, id: &str) -> OctaviaResult<()> {
        self.delete_at("delete_listener", &["lbaas", "listeners", id], Vec::new())
            .await
    }

    // ------------------------------------------------------------ pools

    pub async fn create_pool(&self, req: &PoolCreate) -> OctaviaResult<Pool> {
        self.create_one("create_pool", &["lbaas", "pools"], "pool", req)
            .await
    }
    pub async fn get_pool(&self, id: &str) -> OctaviaResult<Pool> {
        self.get_one("get_pool", &["lbaas", "pools", id], "pool").await
    }
    pub async fn list_pools(&self, filter: &ListFilter) -> OctaviaResult<Vec<Pool>> {
        self.list_all_of("list_pools", &["lbaas", "pools"], "pools", filter)
            .await
    }
    pub async fn update_pool(&self, id: &str, req: &ResourceUpdate) -> OctaviaResult<Pool> {
        self.update_one("update_pool", &["lbaas", "pools", id], "pool", req)
            .await
    }
    pub async fn delete_pool(&self, id: &str) -> OctaviaResult<()> {
        self.delete_at("delete_pool", &["lbaas", "pools", id], Vec::new())
            .await
    }

    // ------------------------------------------------------------ members

    pub async fn create_member(&self, pool_id: &str, req: &MemberCreate) -> OctaviaResult<Member> {
        self.create_one(
            "create_member",
            &["lbaas", "pools", pool_id, "members"],
            "member",
            req,
        )
        .await
    }
    pub async fn get_member(&self, pool_id: &str, id: &str) -> OctaviaResult<Member> {
        self.get_one(
            "get_member",
            &["lbaas", "pools", pool_id, "members", id],
            "member",
        )
        .await
    }
    pub async fn list_members(&self, pool_id: &str, filter: &ListFilter) -> OctaviaResult<Vec<Member>> {
        self.list_all_of(
            "list_members",
            &["lbaas", "pools", pool_id, "members"],
            "members",
            filter,
        )
        .await
    }
    pub async fn update_member(
        &self,
        pool_id: &str,
        id: &str,
        req: &ResourceUpdate,
    ) -> OctaviaResult<Member> {
        self.update_one(
            "update_member",
            &["lbaas", "pools", pool_id, "members", id],
            "member",
            req,
        )
        .await
    }
    pub async fn delete_member(&self, pool_id: &str, id: &str) -> OctaviaResult<()> {
        self.delete_at(
            "delete_member",
            &["lbaas", "pools", pool_id, "members", id],
            Vec::new(),
        )
        .await
    }
    /// Batch member update: after it, the pool's members are exactly `members` (matched by address and
    /// protocol_port: new ones are created, missing ones deleted, the others updated), in one call and one
    /// provisioning cycle. With `additive_only`, members not listed are kept. Octavia answers 202 without a body.
    pub async fn batch_update_members(
        &self,
        pool_id: &str,
        members: &[MemberCreate],
        additive_only: bool,
    ) -> OctaviaResult<()> {
        let mut call = Call::new(
            "batch_update_members",
            Method::PUT,
            &["lbaas", "pools", pool_id, "members"],
        )
        .json(&json!({ "members": members }))?;
        if additive_only {
            call = call.query(vec![("additive_only".into(), "true".into())]);
        }
        self.write(call).await.map(|_| ())
    }

    // ------------------------------------------------------------ health monitors

    pub async fn create_health_monitor(&self, req: &HealthMonitorCreate) -> OctaviaResult<HealthMonitor> {
        self.create_one(
            "create_health_monitor",
            &["lbaas", "healthmonitors"],
            "healthmonitor",
            req,
        )
        .await
    }
    pub async fn get_health_monitor(&self, id: &str) -> OctaviaResult<HealthMonitor> {
        self.get_one(
            "get_health_monitor",
            &["lbaas", "healthmonitors", id],
            "healthmonitor",
        )
        .await
    }
    pub async fn list_health_monitors(&self, filter: &ListFilter) -> OctaviaResult<Vec<HealthMonitor>> {
        self.list_all_of(
            "list_health_monitors",
            &["lbaas", "healthmonitors"],
            "healthmonitors",
            filter,
        )
        .await
    }
    pub async fn update_health_monitor(
        &self,
        id: &str,
        req: &ResourceUpdate,
    ) -> OctaviaResult<HealthMonitor> {
        self.update_one(
            "update_health_monitor",
            &["lbaas", "healthmonitors", id],
            "healthmonitor",
            req,
        )
        .await
    }
    pub async fn delete_health_monitor(&self, id: &str) -> OctaviaResult<()> {
        self.delete_at(
            "delete_health_monitor",
            &["lbaas", "healthmonitors", id],
            Vec::new(),
        )
        .await
    }

    // ------------------------------------------------------------ providers, amphorae, quotas

    pub async fn list_providers(&self) -> OctaviaResult<Vec<Provider>> {
        Ok(self
            .execute(Call::new("list_providers", Method::GET, &["lbaas", "providers"]))
            .await?
            .unwrap("providers")?)
    }
    /// Amphora records (admin API `/v2/octavia/amphorae`). Filters: `loadbalancer_id`, `status`, ...
    pub async fn list_amphorae(&self, filter: &ListFilter) -> OctaviaResult<Vec<Amphora>> {
        self.list_all_of("list_amphorae", &["octavia", "amphorae"], "amphorae", filter)
            .await
    }
    pub async fn get_quota(&self, project_id: &str) -> OctaviaResult<Quota> {
        self.get_one("get_quota", &["lbaas", "quotas", project_id], "quota")
            .await
    }
    pub async fn update_quota(&self, project_id: &str, quota: &Quota) -> OctaviaResult<Quota> {
        self.update_one("update_quota", &["lbaas", "quotas", project_id], "quota", quota)
            .await
    }
    /// Back to Octavia's defaults.
    pub async fn reset_quota(&self, project_id: &str) -> OctaviaResult<()> {
        self.delete_at("reset_quota", &["lbaas", "quotas", project_id], Vec::new())
            .await
    }

    // ------------------------------------------------------------ waiting

    /// Poll `lb_id` until it reaches `target`: ACTIVE, or gone for [`Provisioning::Deleted`]. ERROR is
    /// [`OctaviaError::ProvisioningFailed`]; running out of [`WaitOptions::timeout`] is [`OctaviaError::WaitTimeout`].
    /// Returns the load balancer when ACTIVE, `None` when deleted.
    pub async fn wait_for_provisioning(
        &self,
        lb_id: &str,
        target: Provisioning,
    ) -> OctaviaResult<Option<LoadBalancer>> {
        self.wait_with(lb_id, target, self.wait).await
    }

    async fn wait_with(
        &self,
        lb_id: &str,
        target: Provisioning,
        opts: WaitOptions,
    ) -> OctaviaResult<Option<LoadBalancer>> {
        let started = Instant::now();
        let mut n = 0u32;
        loop {
            let status = match self.get_load_balancer(lb_id).await {
                Ok(lb) => match decide(target, Some(&lb.provisioning_status)) {
                    Decision::Done => return Ok(Some(lb)),
                    Decision::Failed => {
                        return Err(OctaviaError::ProvisioningFailed {
                            lb_id: lb_id.to_owned(),
                            target: target.as_str(),
                        });
                    }
                    Decision::Wait => lb.provisioning_status,
                },
                Err(e) if e.is_not_found() => match decide(target, None) {
                    Decision::Done => return Ok(None),
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            };
            n += 1;
            let waited = started.elapsed();
            if waited >= opts.timeout {
                return Err(OctaviaError::WaitTimeout {
                    lb_id: lb_id.to_owned(),
                    target: target.as_str(),
                    last_status: status,
                    waited,
                });
            }
            tokio::time::sleep(opts.interval(n).min(opts.timeout - waited)).await;
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Done,
    Failed,
    Wait,
}

/// One poll's verdict: `status` is the load balancer's provisioning_status, `None` when it answered 404.
fn decide(target: Provisioning, status: Option<&str>) -> Decision {
    match (target, status) {
        (Provisioning::Deleted, None | Some("DELETED")) => Decision::Done,
        (Provisioning::Active, Some("ACTIVE")) => Decision::Done,
        (_, Some("ERROR")) => Decision::Failed,
        // Waiting for ACTIVE and it is gone (or DELETED): the caller gets the 404.
        (Provisioning::Active, None) => Decision::Failed,
        (Provisioning::Active, Some("DELETED")) => Decision::Failed,
        _ => Decision::Wait,
    }
}

#[cfg(test)]
mod tests;
