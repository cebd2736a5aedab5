//! Carries a [`plan`](super::plan) out against Octavia and reads back what it made.
//!
//! Every write is followed by a wait for the load balancer to be ACTIVE again (Octavia refuses changes to a
//! load balancer that is PENDING_*); the waits are the deployment's shared ones (`provisioning.rs`: one
//! list call per poll for all pending load balancers) and give the handler's worker slot to other Services. What was
//! made is read back with ONE status-tree call and written into the record by name and (address, port).

use std::collections::BTreeMap;

use kuryr_neutron::ListFilter;
use kuryr_neutron::octavia::{
    ListenerCreate, LoadBalancer, MemberCreate, OctaviaClient, OctaviaError, OctaviaErrorKind, PoolCreate,
    ResourceUpdate, StatusTree,
};
use serde_json::{Value, json};

use super::desired::{DesiredLb, DesiredListener, DesiredPool};
use super::plan::{ListenerKey, Step};
use super::provisioning::LbWaits;
use super::recorded::{RecordedLb, RecordedListener, RecordedMember, RecordedPool};
use crate::error::Error;
use crate::pipeline::parked;

/// A port whose listener or pool Octavia (its provider) refused, with what it refused and why
/// (`its listener: <Octavia's reason>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub key: ListenerKey,
    pub reason: String,
}

/// What an [`LbActor::apply`] left in Octavia.
#[derive(Debug)]
pub struct Applied {
    pub recorded: RecordedLb,
    /// Pools whose session persistence change the provider refused: they keep what they had.
    pub kept_persistence: Vec<Refused>,
    /// Whether a load balancer was created (for the Event).
    pub created: bool,
}

pub struct LbActor<'a> {
    pub client: &'a OctaviaClient,
    /// The deployment's shared provisioning waits.
    pub waits: LbWaits,
    /// Ownership tags put on everything created.
    pub tags: Vec<String>,
}

/// A provider refusing an option (501) or Octavia refusing the request (400): not worth retrying as is.
fn is_refusal(e: &OctaviaError) -> bool {
    matches!(
        e.kind(),
        Some(
            OctaviaErrorKind::Validation
                | OctaviaErrorKind::UnsupportedProviderOption
                | OctaviaErrorKind::NotImplemented
        )
    )
}

/// A create whose answer was lost (timeout or reset after the request was sent), or that a proxy in front of
/// the API gave up on (502, 504), may still be carried out: an overloaded Octavia API commits it after the
/// client stopped waiting, so a lookup right away finds nothing and creating again made duplicates (the real
/// Octavia under 100 concurrent creates: 105 creates). Octavia's own errors (500, 503) roll the create back.
fn maybe_created(e: &OctaviaError) -> bool {
    e.outcome_unknown() || matches!(e.status(), Some(502 | 504))
}

/// Busy answers (409) a write is resent after, each after a wait for ACTIVE: more means another writer keeps
/// the load balancer busy, and the pipeline's retry (with its backoff) takes over.
const MAX_BUSY_RESENDS: u32 = 8;

/// How long a create of unknown outcome is looked for by name and VIP before it counts as not made.
const UNKNOWN_OUTCOME_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

fn persistence(p: &DesiredPool) -> Option<Value> {
    p.persistence.as_ref().map(|t| json!({ "type": t }))
}

impl LbActor<'_> {
    fn members(&self, p: &DesiredPool) -> Vec<MemberCreate> {
        p.members
            .values()
            .map(|m| MemberCreate {
                name: Some(m.name.clone()),
                subnet_id: m.subnet_id.clone(),
                tags: self.tags.clone(),
                ..MemberCreate::new(m.address.clone(), m.port)
            })
            .collect()
    }

    fn pool_create(&self, p: &DesiredPool) -> PoolCreate {
        PoolCreate {
            name: Some(p.name.clone()),
            session_persistence: persistence(p),
            members: self.members(p),
            tags: self.tags.clone(),
            ..PoolCreate::new(p.protocol.clone(), p.lb_algorithm.clone())
        }
    }

    /// A listener; inside a load balancer's fully populated create (no `lb_id`) with its pool and members.
    fn listener_create(&self, l: &DesiredListener, lb_id: Option<&str>) -> ListenerCreate {
        ListenerCreate {
            loadbalancer_id: lb_id.map(str::to_string),
            name: Some(l.name.clone()),
            timeout_client_data: l.timeout_client_data,
            timeout_member_data: l.timeout_member_data,
            allowed_cidrs: l.allowed_cidrs.clone().filter(|c| !c.is_empty()),
            // Admitting nobody: Octavia takes no empty list, so the listener is disabled (upstream).
            admin_state_up: (l.allowed_cidrs.as_ref().is_some_and(Vec::is_empty)).then_some(false),
            default_pool: lb_id.is_none().then(|| Box::new(self.pool_create(&l.pool))),
            tags: self.tags.clone(),
            ..ListenerCreate::new(l.protocol.clone(), l.port)
        }
    }

    /// The Service tag among the ownership tags: what the shared waits find the load balancer by.
    fn service_tag(&self) -> Option<&str> {
        self.tags
            .iter()
            .map(String::as_str)
            .find(|t| t.starts_with(super::SERVICE_TAG_PREFIX))
    }

    async fn wait_active(&self, lb_id: &str) -> Result<LoadBalancer, Error> {
        let lb = self
            .waits
            .active(lb_id, self.service_tag())
            .await
            .map_err(|e| Error::octavia(format!("waiting for load balancer {lb_id}"), e))?;
        lb.ok_or_else(|| Error::not_ready(format!("load balancer {lb_id} is gone")))
    }

    /// Sends a write to `lb_id`'s tree; when Octavia refuses it because the load balancer is busy (409
    /// while PENDING_*: someone else's write, a reconcile of another controller), waits on the shared,
    /// parked waits until it is ACTIVE and sends it again. The client itself does not wait (its clients
    /// are made without busy retry): its per-write poll would hold a worker and poll alone.
    async fn busy_write<T, F, Fut>(&self, lb_id: &str, mut call: F) -> Result<T, OctaviaError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, OctaviaError>>,
    {
        let mut busy = 0u32;
        loop {
            let e = match call().await {
                Err(e) if e.is_immutable() && busy < busy_resends(&e) => e,
                other => return other,
            };
            busy += 1;
            // A 409 names the load balancer, or the pool/listener of it that is locked with it.
            let waited = match e.kind() {
                Some(OctaviaErrorKind::Immutable {
                    resource,
                    id: Some(id),
                    ..
                }) if is_load_balancer(resource) && id != lb_id => self.waits.active(id, None).await,
                _ => self.waits.active(lb_id, self.service_tag()).await,
            };
            tracing::debug!(lb = lb_id, attempt = busy, error = %e, "load balancer busy; waited, resending");
            if waited?.is_none() {
                // Gone meanwhile: Octavia's answer to the resend (404) is the result.
                return call().await;
            }
        }
    }

    /// Deletes a load balancer with everything under it and waits until it is gone.
    pub async fn delete(&self, lb_id: &str) -> Result<(), Error> {
        match self
            .busy_write(lb_id, || self.client.delete_load_balancer(lb_id, true))
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(Error::octavia(format!("deleting load balancer {lb_id}"), e)),
        }
        self.waits
            .deleted(lb_id, self.service_tag())
            .await
            .map_err(|e| Error::octavia(format!("waiting for load balancer {lb_id} to go"), e))?;
        Ok(())
    }

    /// A load balancer for `d` that already exists (made before a crash, or by upstream): same name, VIP and
    /// subnet. One in ERROR is deleted rather than adopted; one being deleted is waited for.
    pub async fn find(&self, d: &DesiredLb) -> Result<Option<LoadBalancer>, Error> {
        let found = self
            .client
            .list_load_balancers(&ListFilter::new().name(d.name.clone()))
            .await
            .map_err(|e| Error::octavia(format!("looking up load balancer {}", d.name), e))?;
        for lb in found {
            if lb.vip_address.as_deref() != Some(d.vip_address.as_str())
                || lb.vip_subnet_id.as_deref() != Some(d.vip_subnet_id.as_str())
            {
                continue;
            }
            match lb.provisioning_status.as_str() {
                "ERROR" => {
                    tracing::warn!(lb = %lb.id, name = %d.name, "load balancer in ERROR: replacing it");
                    self.delete(&lb.id).await?;
                }
                "PENDING_DELETE" | "DELETED" => self.delete(&lb.id).await?,
                _ => return Ok(Some(lb)),
            }
        }
        Ok(None)
    }

    /// Deletes what Octavia put in ERROR under an ACTIVE load balancer (a provider whose child
    /// operation failed reverts the child to ERROR and the load balancer to ACTIVE, so no wait
    /// sees it): pools in ERROR or under a listener in ERROR with their members, members in ERROR,
    /// then listeners in ERROR. The handler's next plan makes them again. Returns how many.
    pub async fn delete_failed_parts(&self, lb_id: &str, tree: &StatusTree) -> Result<usize, Error> {
        const FAILED: &str = "ERROR";
        let mut deleted = 0;
        for l in &tree.loadbalancer.listeners {
            let listener_failed = l.provisioning_status == FAILED;
            for p in &l.pools {
                if listener_failed || p.provisioning_status == FAILED {
                    ignore_not_found(self.busy_write(lb_id, || self.client.delete_pool(&p.id)).await)
                        .map_err(|e| Error::octavia(format!("deleting pool {} in ERROR", p.id), e))?;
                    self.wait_active(lb_id).await?;
                    deleted += 1;
                    continue;
                }
                for m in p.members.iter().filter(|m| m.provisioning_status == FAILED) {
                    ignore_not_found(
                        self.busy_write(lb_id, || self.client.delete_member(&p.id, &m.id))
                            .await,
                    )
                    .map_err(|e| Error::octavia(format!("deleting member {} in ERROR", m.id), e))?;
                    self.wait_active(lb_id).await?;
                    deleted += 1;
                }
            }
            if listener_failed {
                ignore_not_found(
                    self.busy_write(lb_id, || self.client.delete_listener(&l.id))
                        .await,
                )
                .map_err(|e| Error::octavia(format!("deleting listener {} in ERROR", l.id), e))?;
                self.wait_active(lb_id).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// After a pass refused as immutable: the parts of `d`'s load balancer Octavia put in ERROR
    /// ([`Self::delete_failed_parts`]), deleted now rather than at the next periodic reconcile,
    /// so that the retry makes them again. Returns how many.
    pub async fn repair_failed_parts(&self, d: &DesiredLb) -> Result<usize, Error> {
        let Some(lb) = self.find(d).await? else {
            return Ok(0);
        };
        let tree = self
            .client
            .get_status_tree(&lb.id)
            .await
            .map_err(|e| Error::octavia(format!("reading the tree of load balancer {}", lb.id), e))?;
        self.delete_failed_parts(&lb.id, &tree).await
    }

    /// Carries out `steps` from `recorded` towards `d`. The ports the provider refuses go to
    /// `refused` as they are met, so that a pass failing later still tells them.
    pub async fn apply(
        &self,
        recorded: Option<RecordedLb>,
        d: &DesiredLb,
        steps: &[Step],
        refused: &mut Vec<Refused>,
    ) -> Result<Applied, Error> {
        let mut created = false;
        let mut lb_id = recorded.as_ref().map(|r| r.id.clone());
        let mut wrote = false;
        // Pools whose session persistence change Octavia refused: they keep what they had.
        let mut kept_persistence = Vec::new();
        for step in steps {
            match step {
                Step::Replace { lb_id: old, why } => {
                    tracing::info!(lb = %old, name = %d.name, %why, "replacing load balancer");
                    self.delete(old).await?;
                    lb_id = None;
                }
                Step::CreateTree => {
                    let (id, c) = self.create_tree(d, refused).await?;
                    lb_id = Some(id);
                    created = c;
                    wrote = true;
                }
                Step::DeleteListener {
                    listener_id, pool_id, ..
                } => {
                    let lb = lb_id.as_deref().unwrap_or_default();
                    // Pools belong to the load balancer, not the listener: deleting only the listener
                    // would leave its pool (and members) behind.
                    if let Some(pool) = pool_id {
                        ignore_not_found(self.busy_write(lb, || self.client.delete_pool(pool)).await)
                            .map_err(|e| Error::octavia(format!("deleting pool {pool}"), e))?;
                        self.wait_active(lb).await?;
                    }
                    ignore_not_found(
                        self.busy_write(lb, || self.client.delete_listener(listener_id))
                            .await,
                    )
                    .map_err(|e| Error::octavia(format!("deleting listener {listener_id}"), e))?;
                    self.wait_active(lb).await?;
                    wrote = true;
                }
                Step::CreateListener { key } => {
                    let (Some(lb), Some(l)) = (lb_id.as_deref(), d.listeners.get(key)) else {
                        continue;
                    };
                    // Outside a load balancer's fully populated create, Octavia ignores a listener's
                    // `default_pool`: listener, pool and members are three calls.
                    let req = self.listener_create(l, Some(lb));
                    let created = match self.busy_write(lb, || self.client.create_listener(&req)).await {
                        Ok(listener) => listener,
                        Err(e) if is_refusal(&e) => {
                            refused.push(Refused {
                                key: key.clone(),
                                reason: format!("its listener: {e}"),
                            });
                            continue;
                        }
                        Err(e) => return Err(Error::octavia(format!("creating listener {}", l.name), e)),
                    };
                    self.wait_active(lb).await?;
                    if let Some(reason) = self.add_pool(lb, &created.id, &l.pool).await? {
                        refused.push(Refused {
                            key: key.clone(),
                            reason,
                        });
                    }
                    wrote = true;
                }
                Step::UpdateListener { key, listener_id } => {
                    let (Some(lb), Some(l)) = (lb_id.as_deref(), d.listeners.get(key)) else {
                        continue;
                    };
                    let mut extra = serde_json::Map::new();
                    // Octavia's defaults are 50000 ms; null restores them.
                    extra.insert("timeout_client_data".into(), json!(l.timeout_client_data));
                    extra.insert("timeout_member_data".into(), json!(l.timeout_member_data));
                    // null admits everyone again; an empty list is refused, so nobody = disabled.
                    extra.insert(
                        "allowed_cidrs".into(),
                        json!(l.allowed_cidrs.clone().filter(|c| !c.is_empty())),
                    );
                    let req = ResourceUpdate {
                        admin_state_up: Some(!l.allowed_cidrs.as_ref().is_some_and(Vec::is_empty)),
                        extra,
                        ..Default::default()
                    };
                    self.busy_write(lb, || self.client.update_listener(listener_id, &req))
                        .await
                        .map_err(|e| Error::octavia(format!("updating listener {}", l.name), e))?;
                    self.wait_active(lb).await?;
                    wrote = true;
                }
                Step::CreatePool { key, listener_id } => {
                    let (Some(lb), Some(l)) = (lb_id.as_deref(), d.listeners.get(key)) else {
                        continue;
                    };
                    if let Some(reason) = self.add_pool(lb, listener_id, &l.pool).await? {
                        refused.push(Refused {
                            key: key.clone(),
                            reason,
                        });
                    }
                    wrote = true;
                }
                Step::UpdatePool { key, pool_id } => {
                    let (Some(lb), Some(l)) = (lb_id.as_deref(), d.listeners.get(key)) else {
                        continue;
                    };
                    let mut extra = serde_json::Map::new();
                    // null takes session persistence off.
                    extra.insert("session_persistence".into(), json!(persistence(&l.pool)));
                    let req = ResourceUpdate {
                        extra,
                        ..Default::default()
                    };
                    match self
                        .busy_write(lb, || self.client.update_pool(pool_id, &req))
                        .await
                    {
                        Ok(_) => {}
                        // A provider that cannot change it: the pool keeps what it has, and the
                        // members and the other ports are still carried out.
                        Err(e) if is_refusal(&e) => {
                            kept_persistence.push(Refused {
                                key: key.clone(),
                                reason: e.to_string(),
                            });
                            continue;
                        }
                        Err(e) => return Err(Error::octavia(format!("updating pool {}", l.pool.name), e)),
                    }
                    self.wait_active(lb).await?;
                    wrote = true;
                }
                Step::SetMembers { key, pool_id } => {
                    let (Some(lb), Some(l)) = (lb_id.as_deref(), d.listeners.get(key)) else {
                        continue;
                    };
                    let members = self.members(&l.pool);
                    self.busy_write(lb, || self.client.batch_update_members(pool_id, &members, false))
                        .await
                        .map_err(|e| {
                            Error::octavia(format!("updating the members of pool {}", l.pool.name), e)
                        })?;
                    self.wait_active(lb).await?;
                    wrote = true;
                }
            }
        }
        let Some(id) = lb_id else {
            return Err(Error::not_ready(format!("no load balancer for {}", d.name)));
        };
        let recorded = match (wrote, recorded) {
            (false, Some(r)) => r,
            (_, prev) => {
                let lb = self.wait_active(&id).await?;
                let mut read = self.read_back(&lb, d).await?;
                if let Some(prev) = &prev {
                    for k in &kept_persistence {
                        read.persistence_from(prev, &k.key);
                    }
                }
                read
            }
        };
        Ok(Applied {
            recorded,
            kept_persistence,
            created,
        })
    }

    /// A listener's pool, then its members in one batch (a pool create takes no members).
    /// The pool of listener `listener_id`, with its members. `Ok(Some(reason))` when the provider
    /// refused the pool (an algorithm it has not): the listener, which would serve nothing, is
    /// deleted again and the port is refused as a refused listener is, not retried for ever.
    async fn add_pool(&self, lb: &str, listener_id: &str, p: &DesiredPool) -> Result<Option<String>, Error> {
        let req = PoolCreate {
            listener_id: Some(listener_id.to_string()),
            members: Vec::new(),
            ..self.pool_create(p)
        };
        let pool = match self.busy_write(lb, || self.client.create_pool(&req)).await {
            Ok(pool) => pool,
            Err(e) if is_refusal(&e) => {
                ignore_not_found(
                    self.busy_write(lb, || self.client.delete_listener(listener_id))
                        .await,
                )
                .map_err(|e| {
                    Error::octavia(format!("deleting listener {listener_id} of a refused pool"), e)
                })?;
                self.wait_active(lb).await?;
                return Ok(Some(format!("its pool: {e}")));
            }
            Err(e) => return Err(Error::octavia(format!("creating pool {}", p.name), e)),
        };
        self.wait_active(lb).await?;
        if !p.members.is_empty() {
            let members = self.members(p);
            self.busy_write(lb, || self.client.batch_update_members(&pool.id, &members, false))
                .await
                .map_err(|e| Error::octavia(format!("adding the members of pool {}", p.name), e))?;
            self.wait_active(lb).await?;
        }
        Ok(None)
    }

    /// The whole tree in one fully populated create, or adopts the one a crash left behind. When Octavia
    /// refuses the tree, the load balancer is created alone and each listener after it, so one port the
    /// provider cannot serve does not take the others down with it.
    async fn create_tree(&self, d: &DesiredLb, refused: &mut Vec<Refused>) -> Result<(String, bool), Error> {
        if let Some(lb) = self.find(d).await? {
            tracing::info!(lb = %lb.id, name = %d.name, "adopting existing load balancer");
            let lb = self.wait_active(&lb.id).await?;
            // Bring the adopted tree to the desired one with the normal plan.
            let rec = self.read_found(&lb, d).await?;
            let steps = super::plan::plan(Some(&rec), d);
            Box::pin(self.apply(Some(rec), d, &steps, refused)).await?;
            return Ok((lb.id, false));
        }
        let mut req = kuryr_neutron::octavia::LoadBalancerCreate {
            name: Some(d.name.clone()),
            project_id: Some(d.project_id.clone()),
            vip_subnet_id: Some(d.vip_subnet_id.clone()),
            vip_address: Some(d.vip_address.clone()),
            provider: d.provider.clone(),
            tags: self.tags.clone(),
            listeners: d
                .listeners
                .values()
                .map(|l| self.listener_create(l, None))
                .collect(),
            ..Default::default()
        };
        match self.client.create_load_balancer(&req).await {
            Ok(lb) => {
                self.wait_active(&lb.id).await?;
                Ok((lb.id, true))
            }
            Err(e) if maybe_created(&e) => {
                tracing::info!(name = %d.name, error = %e, "load balancer create of unknown outcome; looking it up");
                let Some(lb) = self.find_after_unknown_create(d).await? else {
                    return Err(Error::octavia(format!("creating load balancer {}", d.name), e));
                };
                tracing::info!(lb = %lb.id, name = %d.name, "the create took effect; adopting it");
                let lb = self.wait_active(&lb.id).await?;
                let rec = self.read_back(&lb, d).await?;
                let steps = super::plan::plan(Some(&rec), d);
                Box::pin(self.apply(Some(rec), d, &steps, refused)).await?;
                Ok((lb.id, true))
            }
            Err(e) if is_refusal(&e) && !req.listeners.is_empty() => {
                tracing::info!(name = %d.name, error = %e, "tree refused; creating its listeners one by one");
                req.listeners.clear();
                let lb = self
                    .client
                    .create_load_balancer(&req)
                    .await
                    .map_err(|e| Error::octavia(format!("creating load balancer {}", d.name), e))?;
                self.wait_active(&lb.id).await?;
                let steps: Vec<Step> = d
                    .listeners
                    .keys()
                    .map(|k| Step::CreateListener { key: k.clone() })
                    .collect();
                let rec = RecordedLb {
                    id: lb.id.clone(),
                    ..Default::default()
                };
                Box::pin(self.apply(Some(rec), d, &steps, refused)).await?;
                Ok((lb.id, true))
            }
            Err(e) => Err(Error::octavia(format!("creating load balancer {}", d.name), e)),
        }
    }

    /// Looks for the load balancer a create of unknown outcome may still make, with backoff, for
    /// [`UNKNOWN_OUTCOME_GRACE`]. The wait gives the worker slot and the in-flight place to
    /// other objects.
    async fn find_after_unknown_create(&self, d: &DesiredLb) -> Result<Option<LoadBalancer>, Error> {
        let deadline = tokio::time::Instant::now() + UNKNOWN_OUTCOME_GRACE;
        let mut pause = std::time::Duration::from_millis(250);
        loop {
            if let Some(lb) = self.find(d).await? {
                return Ok(Some(lb));
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Ok(None);
            }
            parked(tokio::time::sleep(pause)).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// Reads the tree of `lb` back (one status-tree call) into a record: ids from Octavia, the attributes
    /// Octavia does not show there from `d` (what a pass just wrote).
    pub async fn read_back(&self, lb: &LoadBalancer, d: &DesiredLb) -> Result<RecordedLb, Error> {
        let tree = self
            .client
            .get_status_tree(&lb.id)
            .await
            .map_err(|e| Error::octavia(format!("reading load balancer {}", lb.id), e))?;
        Ok(record_from_tree(lb, &tree, d))
    }

    /// [`Self::read_back`] of a tree no pass of this spec wrote (adopted, or left by a failed
    /// pass): the timeouts, ACLs and session persistence the status tree does not show are read
    /// from its listeners and pools (a call each), so that the plan changes what it has of an
    /// older spec (a rolling restart while the Service's policies, annotations or affinity
    /// changed). Not after a pass's own writes: they are what `d` says.
    pub async fn read_found(&self, lb: &LoadBalancer, d: &DesiredLb) -> Result<RecordedLb, Error> {
        let mut rec = self.read_back(lb, d).await?;
        for l in rec.listeners.values_mut() {
            let got = self
                .client
                .get_listener(&l.id)
                .await
                .map_err(|e| Error::octavia(format!("reading listener {}", l.name), e))?;
            l.read_from(&got);
            if let Some(p) = &mut l.pool {
                let got = self
                    .client
                    .get_pool(&p.id)
                    .await
                    .map_err(|e| Error::octavia(format!("reading pool {}", p.name), e))?;
                p.persistence = Some(persistence_of(&got));
            }
        }
        Ok(rec)
    }
}

/// How often a write Octavia refuses as immutable is resent: a busy load balancer's (PENDING_*)
/// as it becomes ACTIVE again, up to [`MAX_BUSY_RESENDS`]; a pool's, listener's or member's once
/// (it may have been locked with its busy load balancer), as one in ERROR under an ACTIVE load
/// balancer stays immutable for good: the handler repairs it ([`LbActor::repair_failed_parts`]).
fn busy_resends(e: &OctaviaError) -> u32 {
    match e.kind() {
        Some(OctaviaErrorKind::Immutable { resource, .. }) if !is_load_balancer(resource) => 1,
        _ => MAX_BUSY_RESENDS,
    }
}

fn is_load_balancer(resource: &str) -> bool {
    resource.to_ascii_lowercase().replace(' ', "") == "loadbalancer"
}

fn ignore_not_found(r: Result<(), OctaviaError>) -> Result<(), OctaviaError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

/// `<lb name>:<PROTOCOL>:<port>` -> (PROTOCOL, port), the listener naming both upstream and kuryr-rs use.
fn key_of_listener_name(name: &str) -> Option<ListenerKey> {
    let mut it = name.rsplitn(3, ':');
    let port = it.next()?.parse().ok()?;
    let protocol = it.next()?.to_ascii_uppercase();
    it.next()?;
    Some((protocol, port))
}

/// Octavia's listener timeout when none is asked (ms): read as "none asked".
const DEFAULT_TIMEOUT_MS: u64 = 50_000;

impl RecordedListener {
    /// What Octavia says of the listener's timeouts and ACL, as a plan compares them with the
    /// desired tree: Octavia's default timeout is none asked, a disabled listener admits nobody
    /// (how an empty ACL is written), and an empty list from Octavia admits everyone.
    fn read_from(&mut self, got: &kuryr_neutron::octavia::Listener) {
        let asked = |t: Option<u64>| t.filter(|t| *t != DEFAULT_TIMEOUT_MS);
        self.timeout_client_data = asked(got.timeout_client_data);
        self.timeout_member_data = asked(got.timeout_member_data);
        self.allowed_cidrs = if got.admin_state_up {
            got.allowed_cidrs.clone().filter(|c| !c.is_empty())
        } else {
            Some(Vec::new())
        };
    }
}

/// The session persistence type of a pool as Octavia has it (`None`: none).
fn persistence_of(pool: &kuryr_neutron::octavia::Pool) -> Option<String> {
    pool.session_persistence
        .as_ref()
        .and_then(|p| p.get("type"))
        .and_then(|t| t.as_str())
        .map(str::to_string)
}

/// The record of what the status tree shows, completed from the desired tree.
pub fn record_from_tree(lb: &LoadBalancer, tree: &StatusTree, d: &DesiredLb) -> RecordedLb {
    let mut listeners = BTreeMap::new();
    for l in &tree.loadbalancer.listeners {
        let Some(key) = key_of_listener_name(&l.name) else {
            continue;
        };
        let want = d.listeners.get(&key);
        let pool = l.pools.first().map(|p| RecordedPool {
            id: p.id.clone(),
            name: p.name.clone(),
            protocol: key.0.clone(),
            // The status tree does not show it: what was asked (as for the listener's timeouts).
            persistence: want.map(|w| w.pool.persistence.clone()),
            members: p
                .members
                .iter()
                .map(|m| {
                    let mk = (m.address.clone(), m.protocol_port);
                    let subnet = want
                        .and_then(|w| w.pool.members.get(&mk))
                        .and_then(|dm| dm.subnet_id.clone())
                        .unwrap_or_default();
                    (
                        mk,
                        RecordedMember {
                            id: m.id.clone(),
                            name: m.name.clone(),
                            subnet_id: subnet,
                        },
                    )
                })
                .collect(),
        });
        listeners.insert(
            key,
            RecordedListener {
                id: l.id.clone(),
                name: l.name.clone(),
                timeout_client_data: want.and_then(|w| w.timeout_client_data),
                timeout_member_data: want.and_then(|w| w.timeout_member_data),
                allowed_cidrs: want.and_then(|w| w.allowed_cidrs.clone()),
                pool,
            },
        );
    }
    RecordedLb {
        id: lb.id.clone(),
        name: lb.name.clone(),
        ip: lb.vip_address.clone().unwrap_or_default(),
        subnet_id: lb.vip_subnet_id.clone().unwrap_or_default(),
        port_id: lb.vip_port_id.clone().unwrap_or_default(),
        project_id: lb.project_id.clone(),
        provider: lb.provider.clone().unwrap_or_default(),
        security_groups: d.security_groups.clone(),
        listeners,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_names_give_their_key() {
        assert_eq!(key_of_listener_name("demo/web:TCP:80"), Some(("TCP".into(), 80)));
        assert_eq!(key_of_listener_name("a:b/c:udp:53"), Some(("UDP".into(), 53)));
        assert_eq!(key_of_listener_name("demo/web"), None);
        assert_eq!(key_of_listener_name("demo/web:TCP:http"), None);
    }
}
