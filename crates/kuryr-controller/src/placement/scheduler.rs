//! The binding scheduler: [`Scheduler::decide`] is pure (candidates, request, current binding in;
//! a [`Decision`] out); the [`Binder`] acts on it with the store and the usage figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kuryr_config::{BindingFilter, BindingWeigher, PodBindingSection};
use rand::Rng;
use tokio::sync::{Mutex, RwLock};

use super::filters::{self, Elimination, Filter};
use super::store::{BindingState, BindingStore};
use super::weighers::{self, Weigher};
use super::{BindingKey, BindingRequest, Candidate, ProjectUsage, UsageFigure};
use crate::error::Error;

/// Usage added to a deployment's pending figure ([`Candidate::pending`]) each time this
/// controller binds a project to it, until the next measurement: later picks in the same period
/// see it as fuller. Only a fresh figure counts it; an unmeasured or stale one never does.
const VIRTUAL_CONSUMPTION: f64 = 0.01;

/// The binding a request has now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    pub deployment: String,
    /// Set by an operator: stays whatever the filters say, unless the deployment is removed.
    pub pinned: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The current binding stays. `stuck` says why it should have left and what every filter
    /// removed, when no other deployment could take it.
    Stay {
        deployment: String,
        stuck: Option<(String, Vec<Elimination>)>,
    },
    /// Bind (`from` = None) or rebind to `to`; `why` goes into the history.
    Bind {
        to: String,
        from: Option<String>,
        why: String,
    },
    /// No deployment passes: what each filter removed.
    NoneFits {
        from: Option<String>,
        eliminations: Vec<Elimination>,
    },
}

pub struct Scheduler {
    filters: Vec<Box<dyn Filter>>,
    weighers: Vec<(Box<dyn Weigher>, f64)>,
    subset_size: usize,
    usage_filter: bool,
    /// Whether any decision reads usage figures (the `usage_threshold` filter, the
    /// `idle_capacity` weigher).
    uses_usage: bool,
    /// How long a decision waits for a term's first usage round: the round's own timeout
    /// (`[pod_binding] usage_timeout`, every deployment measured at once) and a margin for the
    /// reads before it.
    first_usage_wait: std::time::Duration,
}

impl Scheduler {
    pub fn new(cfg: &PodBindingSection) -> Self {
        Self {
            filters: filters::build(&cfg.filters),
            weighers: weighers::build(&cfg.weighers, &cfg.weigher_multipliers),
            subset_size: usize::try_from(cfg.subset_size.get()).unwrap_or(1),
            usage_filter: cfg.filters.contains(&BindingFilter::UsageThreshold),
            uses_usage: cfg.filters.contains(&BindingFilter::UsageThreshold)
                || cfg.weighers.contains(&BindingWeigher::IdleCapacity),
            first_usage_wait: std::time::Duration::from_secs(cfg.usage_timeout.max(1).saturating_add(10)),
        }
    }

    pub fn uses_usage(&self) -> bool {
        self.uses_usage
    }

    pub fn first_usage_wait(&self) -> std::time::Duration {
        self.first_usage_wait
    }

    /// Why the current binding must leave its deployment, or None if it stays. A binding stays
    /// until its deployment is removed, is in maintenance with `move_existing`, reaches its usage
    /// threshold (a fresh figure: a stale one moves nobody), or no longer matches the group (an
    /// operator changed the deployment's zone or affinity). A pinned binding only leaves a removed
    /// deployment.
    pub fn must_leave(&self, cands: &[Candidate], req: &BindingRequest, cur: &Current) -> Option<String> {
        let Some(c) = cands.iter().find(|c| c.name == cur.deployment) else {
            return Some(format!("deployment {} is no longer configured", cur.deployment));
        };
        if cur.pinned {
            return None;
        }
        if c.maintenance && c.move_existing {
            return Some(format!(
                "deployment {} is in maintenance and moves existing bindings",
                c.name
            ));
        }
        if self.usage_filter
            && let UsageFigure::Fresh(u) = c.usage_for(&req.project)
            && u >= c.threshold
        {
            return Some(format!(
                "deployment {} usage {u:.3} reached its threshold {:.3}",
                c.name, c.threshold
            ));
        }
        for f in &self.filters {
            if matches!(f.name(), "availability_zone" | "resource_affinity")
                && let Err(why) = f.check(c, req)
            {
                return Some(format!("deployment {} no longer matches: {why}", c.name));
            }
        }
        None
    }

    /// Pure decision for `req` given its current binding.
    pub fn decide(&self, cands: &[Candidate], req: &BindingRequest, current: Option<&Current>) -> Decision {
        let leaving = match current {
            Some(cur) => match self.must_leave(cands, req, cur) {
                None => {
                    return Decision::Stay {
                        deployment: cur.deployment.clone(),
                        stuck: None,
                    };
                }
                Some(why) => Some((cur, why)),
            },
            None => None,
        };
        let others: Vec<&Candidate> = cands
            .iter()
            .filter(|c| leaving.as_ref().is_none_or(|(cur, _)| c.name != cur.deployment))
            .collect();
        let (passing, eliminations) = filters::apply(&self.filters, others, req);
        match (self.pick(&passing), leaving) {
            (Some(to), leaving) => Decision::Bind {
                to,
                from: leaving.as_ref().map(|(cur, _)| cur.deployment.clone()),
                why: leaving.map_or_else(|| "new binding".to_string(), |(_, why)| why),
            },
            // Leaving a deployment that still exists, with nowhere to go: staying serves the
            // tenant better than failing it.
            (None, Some((cur, why))) if cands.iter().any(|c| c.name == cur.deployment) => Decision::Stay {
                deployment: cur.deployment.clone(),
                stuck: Some((why, eliminations)),
            },
            (None, leaving) => Decision::NoneFits {
                from: leaving.map(|(cur, _)| cur.deployment.clone()),
                eliminations,
            },
        }
    }

    fn pick(&self, passing: &[&Candidate]) -> Option<String> {
        if passing.is_empty() {
            return None;
        }
        let scores = weighers::scores(&self.weighers, passing);
        let mut ranked: Vec<(f64, &&Candidate)> = scores.into_iter().zip(passing).collect();
        // Best first; ties by order then name so the choice is deterministic with subset 1.
        ranked.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(a.1.order.cmp(&b.1.order))
                .then(a.1.name.cmp(&b.1.name))
        });
        let top = ranked.len().min(self.subset_size.max(1));
        let pick = if top > 1 {
            rand::rng().random_range(0..top)
        } else {
            0
        };
        ranked.get(pick).map(|(_, c)| c.name.clone())
    }
}

/// Where a request was placed.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub deployment: String,
    /// The project's id in that deployment's Keystone.
    pub project_id: String,
    /// Set when this call (re)bound: (from, why).
    pub rebound: Option<(Option<String>, String)>,
    /// Set when the binding should have left its deployment but nothing else passes.
    pub stuck: Option<String>,
}

/// Binds (project, group) keys to deployments: reads and claims bindings in the store, decides
/// with the [`Scheduler`]. The cache only saves store reads: it is emptied whenever the
/// candidates change and on leadership changes, and every hit is re-decided.
pub struct Binder {
    scheduler: Scheduler,
    candidates: RwLock<Vec<Candidate>>,
    store: Arc<dyn BindingStore>,
    cache: Mutex<HashMap<BindingKey, Current>>,
    /// Bumped by every [`Binder::forget`]: a decision made on a store read from before the last
    /// one is not cached (an operator's move or pin landing between the read and the insert
    /// would otherwise stay cached until the next forget).
    epoch: std::sync::atomic::AtomicU64,
    /// Held from deciding a new binding (or a move) to counting it in the target's pending
    /// usage: concurrent requests (a term's first round waking every waiter at once, a burst of
    /// namespaces) each see the ones admitted before them.
    admission: Mutex<()>,
    /// Whether the candidates hold what the operator set on the KuryrOpenStackDeployment objects
    /// (maintenance, zone, affinity, weight, project ids), not `kuryr.conf` alone.
    loaded: tokio::sync::watch::Sender<bool>,
    /// Whether the usage figures were measured in this process' current term (see
    /// [`Binder::expect_usage`]).
    usage_known: tokio::sync::watch::Sender<bool>,
}

/// How long a project id lookup waits for the deployment objects before it answers not-ready.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Binder {
    /// A binder whose `candidates` are complete.
    pub fn new(scheduler: Scheduler, candidates: Vec<Candidate>, store: Arc<dyn BindingStore>) -> Self {
        Self {
            scheduler,
            candidates: RwLock::new(candidates),
            store,
            cache: Mutex::default(),
            epoch: std::sync::atomic::AtomicU64::new(0),
            admission: Mutex::default(),
            loaded: tokio::sync::watch::Sender::new(true),
            usage_known: tokio::sync::watch::Sender::new(true),
        }
    }

    /// A binder whose `candidates` come from `kuryr.conf` and wait for the deployment objects
    /// ([`Binder::set_candidates`]): until then it binds nothing (a controller just started would
    /// bind to a deployment the operator put in maintenance).
    pub fn awaiting_objects(
        scheduler: Scheduler,
        candidates: Vec<Candidate>,
        store: Arc<dyn BindingStore>,
    ) -> Self {
        let b = Self::new(scheduler, candidates, store);
        b.loaded.send_replace(false);
        b
    }

    pub fn store(&self) -> &Arc<dyn BindingStore> {
        &self.store
    }

    /// Replaces the usage figures (from the usage task); deployments not in `usage` keep theirs.
    pub async fn set_usage(&self, usage: &BTreeMap<String, (UsageFigure, ProjectUsage)>) {
        // After an admission in flight (see `set_candidates`).
        let _turn = self.admission.lock().await;
        for c in self.candidates.write().await.iter_mut() {
            if let Some((u, projects)) = usage.get(&c.name) {
                c.usage = u.clone();
                c.project_usage = projects.clone();
                c.pending = 0.0;
            }
        }
        self.usage_known.send_replace(true);
        self.forget().await;
    }

    /// A usage task starts (a leadership term): decisions that read usage wait for its first
    /// round. Without this, a controller just started would take every deployment for
    /// unmeasured, which passes `usage_threshold`, and bind new projects to a full one.
    pub fn expect_usage(&self) {
        self.usage_known.send_replace(false);
    }

    /// Waits for the term's first usage round when a decision reads usage and it has not come;
    /// true when it waited (decide again). A round that does not come within the wait is not
    /// waited for again this term: decisions go on with the figures there are.
    async fn await_first_usage(&self, req: &BindingRequest) -> bool {
        if !self.scheduler.uses_usage() || *self.usage_known.borrow() {
            return false;
        }
        let wait = self.scheduler.first_usage_wait();
        if tokio::time::timeout(wait, self.usage_known.subscribe().wait_for(|known| *known))
            .await
            .is_err()
        {
            tracing::warn!(%req, waited = ?wait, "no usage round finished: deciding on the figures there are");
            self.usage_known.send_replace(true);
        }
        true
    }

    /// Replaces the candidates (an operator edited a deployment); usage figures are kept. Waits
    /// for an admission in flight, which decided on the old ones: once this returns (and the
    /// object's `observedGeneration` says so) no new binding goes where the edit says not to,
    /// such as a deployment just put into maintenance.
    pub async fn set_candidates(&self, mut cands: Vec<Candidate>) {
        let _turn = self.admission.lock().await;
        let mut cur = self.candidates.write().await;
        for c in &mut cands {
            if let Some(old) = cur.iter().find(|o| o.name == c.name) {
                c.usage = old.usage.clone();
                c.project_usage = old.project_usage.clone();
                c.pending = old.pending;
            }
        }
        *cur = cands;
        drop(cur);
        self.loaded.send_replace(true);
        self.forget().await;
    }

    /// A leadership term starts: what this replica knew of the deployment objects (maintenance,
    /// zones, weights, project ids) and of the bindings may have been changed under another
    /// leader, so nothing is bound until the term's watch of the objects has listed them again
    /// ([`Binder::set_candidates`]), and decisions that read usage wait for its first round.
    pub async fn begin_term(&self) {
        self.loaded.send_replace(false);
        self.expect_usage();
        self.forget().await;
    }

    /// Empties the cache (candidates changed, leadership changed).
    pub async fn forget(&self) {
        let mut cache = self.cache.lock().await;
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        cache.clear();
    }

    /// Forgets what is cached of `key` alone (its binding object changed). A decision in flight
    /// on any key is still not cached (the epoch moves as for [`Self::forget`]): it may have
    /// read `key`'s object before the change.
    pub async fn forget_key(&self, key: &BindingKey) {
        let mut cache = self.cache.lock().await;
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        cache.remove(key);
    }

    pub async fn candidates(&self) -> Vec<Candidate> {
        self.candidates.read().await.clone()
    }

    /// `project`'s id in `deployment` (a deployment object can map it), once the objects are
    /// loaded; not-ready (retried with backoff) when they are not within [`LOAD_WAIT`]: the
    /// ids of `kuryr.conf` alone may not be the ones an operator mapped on the object, and a
    /// resource made in the wrong project is one nobody cleans up.
    pub async fn project_id(&self, deployment: &str, project: &str) -> Result<String, Error> {
        // Loaded at once after start-up: no receiver on the pod path then.
        if !*self.loaded.borrow()
            && tokio::time::timeout(LOAD_WAIT, self.loaded.subscribe().wait_for(|l| *l))
                .await
                .is_err()
        {
            return Err(Error::not_ready(format!(
                "project {project}'s id in deployment {deployment}: the KuryrOpenStackDeployment objects are not loaded yet"
            )));
        }
        Ok(self
            .candidates
            .read()
            .await
            .iter()
            .find(|c| c.name == deployment)
            .map_or(project, |c| c.project_id(project))
            .to_string())
    }

    /// The deployment `key` is bound to now, without (re)scheduling.
    pub async fn current(&self, key: &BindingKey) -> Result<Option<String>, Error> {
        if let Some(c) = self.cache.lock().await.get(key) {
            return Ok(Some(c.deployment.clone()));
        }
        Ok(self.store.get(key).await?.and_then(|s| s.current()))
    }

    /// The deployment serving `req`, binding (or rebinding) it when needed.
    pub async fn bind(&self, req: &BindingRequest) -> Result<Placed, Error> {
        if !*self.loaded.borrow() {
            return Err(Error::not_ready(
                "the KuryrOpenStackDeployment objects are not loaded yet (maintenance, zones, weights)",
            ));
        }
        let cached = self.cache.lock().await.get(req).cloned();
        if let Some(cur) = cached {
            let cands = self.candidates.read().await;
            if let Decision::Stay {
                deployment,
                stuck: None,
            } = self.scheduler.decide(&cands, req, Some(&cur))
            {
                let project_id = project_in(&cands, &deployment, &req.project);
                return Ok(Placed {
                    deployment,
                    project_id,
                    rebound: None,
                    stuck: None,
                });
            }
        }
        for _ in 0..5 {
            let epoch = self.epoch.load(std::sync::atomic::Ordering::Acquire);
            let state = self.store.get(req).await?;
            let current = state.as_ref().and_then(BindingState::current_binding);
            let mut cands = self.candidates.read().await.clone();
            let mut decision = self.scheduler.decide(&cands, req, current.as_ref());
            // A binding that stays needs no figure (an unmeasured one moves nobody); a new one
            // or a refusal is decided again on the term's first round.
            if !matches!(decision, Decision::Stay { .. }) && self.await_first_usage(req).await {
                continue;
            }
            // A new binding or a move: decided again in turn, on the candidates as the ones
            // admitted before it left them.
            let _admitted = match decision {
                Decision::Stay { .. } => None,
                _ => {
                    let turn = self.admission.lock().await;
                    cands = self.candidates.read().await.clone();
                    decision = self.scheduler.decide(&cands, req, current.as_ref());
                    Some(turn)
                }
            };
            let (deployment, rebound, stuck) = match decision {
                Decision::Stay { deployment, stuck } => {
                    let stuck = stuck.map(|(why, elims)| {
                        log_eliminations(req, &elims);
                        format!("{why}, but no other deployment passes: {}", join(&elims))
                    });
                    (deployment, None, stuck)
                }
                Decision::NoneFits { from, eliminations } => {
                    log_eliminations(req, &eliminations);
                    return Err(Error::exhausted(
                        "NoDeploymentPasses",
                        format!(
                            "no OpenStack deployment passes the binding filters for project {} group {}{}: {}",
                            req.project,
                            req.group,
                            from.map(|f| format!(" (leaving {f})")).unwrap_or_default(),
                            join(&eliminations)
                        ),
                    ));
                }
                Decision::Bind { to, from, why } => {
                    // Claim with a precondition: a concurrent controller makes one of us re-read.
                    // A binding being moved must still be pinned as decided; a new one (no
                    // current deployment, maybe a restored object pinned with no status yet)
                    // is claimed whatever its pin says.
                    let pinned = current.as_ref().map(|c| c.pinned);
                    if !self.store.claim(req, from.as_deref(), pinned, &to, &why).await? {
                        continue;
                    }
                    tracing::info!(project = %req.project, group = %req.group, from = ?from, to = %to, why = %why,
                        "binding moved");
                    if let Some(c) = self.candidates.write().await.iter_mut().find(|c| c.name == to)
                        && matches!(c.usage, UsageFigure::Fresh(_))
                    {
                        c.pending += VIRTUAL_CONSUMPTION;
                    }
                    (to, Some((from, why)), None)
                }
            };
            let pinned = current
                .as_ref()
                .is_some_and(|c| c.pinned && c.deployment == deployment);
            let mut cache = self.cache.lock().await;
            if self.epoch.load(std::sync::atomic::Ordering::Acquire) == epoch {
                cache.insert(
                    req.clone(),
                    Current {
                        deployment: deployment.clone(),
                        pinned,
                    },
                );
            }
            drop(cache);
            let project_id = project_in(&cands, &deployment, &req.project);
            return Ok(Placed {
                deployment,
                project_id,
                rebound,
                stuck,
            });
        }
        Err(Error::not_ready(format!("binding of {req} kept conflicting")))
    }
}

fn project_in(cands: &[Candidate], deployment: &str, project: &str) -> String {
    cands
        .iter()
        .find(|c| c.name == deployment)
        .map_or(project, |c| c.project_id(project))
        .to_string()
}

fn join(elims: &[Elimination]) -> String {
    elims
        .iter()
        .filter(|e| !e.removed.is_empty())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The per-filter elimination log of a request that found no deployment.
fn log_eliminations(req: &BindingRequest, elims: &[Elimination]) {
    for e in elims {
        tracing::info!(project = %req.project, group = %req.group, filter = e.filter, removed = ?e.removed,
            "binding filter");
    }
}

#[cfg(test)]
mod tests;
