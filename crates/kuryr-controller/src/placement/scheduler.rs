//! The binding scheduler (pure) and the Binder that applies it with the store and usage figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kuryr_config::PodBindingSection;
use rand::Rng;
use tokio::sync::{Mutex, RwLock};

use super::filters::{self, Filter};
use super::store::BindingStore;
use super::weighers::{self, Weigher};
use super::{BindingRequest, Candidate};
use crate::error::Error;

/// Usage added to a deployment each time this controller binds a project to it, until the next
/// measurement replaces the figure: later picks in the same period see it as fuller.
const VIRTUAL_CONSUMPTION: f64 = 0.01;

pub struct Scheduler {
    filters: Vec<Box<dyn Filter>>,
    weighers: Vec<(Box<dyn Weigher>, f64)>,
    subset_size: usize,
}

impl Scheduler {
    pub fn new(cfg: &PodBindingSection) -> Self {
        Self {
            filters: filters::build(&cfg.filters, cfg.usage_threshold),
            weighers: weighers::build(&cfg.weighers, &cfg.weigher_multipliers),
            subset_size: usize::try_from(cfg.subset_size.get()).unwrap_or(1),
        }
    }

    /// Two-phase selection: keep `current` while it still passes every filter; otherwise schedule
    /// among all candidates. None when nothing passes.
    pub fn select(&self, cands: &[Candidate], req: &BindingRequest, current: Option<&str>) -> Option<String> {
        if let Some(cur) = current
            && let Some(c) = cands.iter().find(|c| c.name == cur)
            && self.filters.iter().all(|f| f.passes(c, req))
        {
            return Some(cur.to_string());
        }
        let passing = filters::apply(&self.filters, cands.iter().collect(), req);
        if passing.is_empty() {
            return None;
        }
        let scores = weighers::scores(&self.weighers, &passing);
        let mut ranked: Vec<(f64, &Candidate)> = scores.into_iter().zip(passing).collect();
        // Best first; ties by declaration order so the choice is deterministic with subset 1.
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.order.cmp(&b.1.order)));
        let top = ranked.len().min(self.subset_size.max(1));
        let pick = if top > 1 {
            rand::rng().random_range(0..top)
        } else {
            0
        };
        ranked.get(pick).map(|(_, c)| c.name.clone())
    }
}

/// Binds projects to deployments: reads and claims bindings in the store, schedules when needed.
pub struct Binder {
    scheduler: Scheduler,
    candidates: RwLock<Vec<Candidate>>,
    store: Arc<dyn BindingStore>,
    cache: Mutex<HashMap<String, String>>,
}

impl Binder {
    pub fn new(scheduler: Scheduler, candidates: Vec<Candidate>, store: Arc<dyn BindingStore>) -> Self {
        Self {
            scheduler,
            candidates: RwLock::new(candidates),
            store,
            cache: Mutex::default(),
        }
    }

    /// Replaces measured usage (from the usage task).
    pub async fn set_usage(&self, usage: &BTreeMap<String, f64>) {
        for c in self.candidates.write().await.iter_mut() {
            if let Some(u) = usage.get(&c.name) {
                c.usage = Some(*u);
            }
        }
    }

    pub async fn candidates(&self) -> Vec<Candidate> {
        self.candidates.read().await.clone()
    }

    /// The deployment `project` is bound to now, without (re)scheduling: where its existing
    /// resources live, for releasing them.
    pub async fn current(&self, project: &str) -> Result<Option<String>, Error> {
        if let Some(d) = self.cache.lock().await.get(project) {
            return Ok(Some(d.clone()));
        }
        self.store.current(project).await
    }

    /// The deployment serving `req.project`, binding (or re-binding) it when needed.
    pub async fn bind(&self, req: &BindingRequest) -> Result<String, Error> {
        if let Some(d) = self.cache.lock().await.get(&req.project).cloned() {
            let cands = self.candidates.read().await;
            if self.scheduler.select(&cands, req, Some(&d)).as_deref() == Some(d.as_str()) {
                return Ok(d);
            }
        }
        for _ in 0..5 {
            let current = self.store.current(&req.project).await?;
            let cands = self.candidates.read().await.clone();
            let chosen = self.scheduler.select(&cands, req, current.as_deref()).ok_or_else(|| {
                Error::invalid(
                    format!("binding of project {}", req.project),
                    "no OpenStack deployment passes the binding filters (all in maintenance, over the usage \
                     threshold, or none matches the requested zone/affinity)",
                )
            })?;
            if current.as_deref() != Some(chosen.as_str()) {
                // Claim with a precondition: a concurrent controller makes one of us re-read.
                if !self
                    .store
                    .claim(&req.project, current.as_deref(), &chosen)
                    .await?
                {
                    continue;
                }
                tracing::info!(project = %req.project, from = ?current, to = %chosen, "project bound to deployment");
                if let Some(c) = self
                    .candidates
                    .write()
                    .await
                    .iter_mut()
                    .find(|c| c.name == chosen)
                {
                    c.usage = Some(c.usage.unwrap_or(0.0) + VIRTUAL_CONSUMPTION);
                }
            }
            self.cache
                .lock()
                .await
                .insert(req.project.clone(), chosen.clone());
            return Ok(chosen);
        }
        Err(Error::not_ready(format!(
            "binding of project {} kept conflicting",
            req.project
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use kuryr_config::{BindingFilter, BindingWeigher};

    use super::*;
    use crate::placement::store::MemoryStore;

    fn cand(name: &str, order: usize, usage: Option<f64>) -> Candidate {
        Candidate {
            name: name.into(),
            order,
            availability_zone: Some(if order < 2 { "az1" } else { "az2" }.into()),
            resource_affinity: BTreeMap::from([(
                "resource".into(),
                if order.is_multiple_of(2) { "general" } else { "cad" }.into(),
            )]),
            enabled: true,
            usage,
        }
    }

    fn cfg(filters: &[BindingFilter], weighers: &[BindingWeigher]) -> PodBindingSection {
        PodBindingSection {
            enabled: true,
            filters: filters.to_vec(),
            weighers: weighers.to_vec(),
            usage_threshold: 0.8,
            subset_size: NonZeroU32::MIN,
            ..PodBindingSection::default()
        }
    }

    fn req(project: &str) -> BindingRequest {
        BindingRequest {
            project: project.into(),
            ..Default::default()
        }
    }

    #[test]
    fn creation_order_picks_the_first_declared_and_skips_maintenance() {
        let s = Scheduler::new(&cfg(&[BindingFilter::All], &[BindingWeigher::CreationOrder]));
        let mut c = vec![
            cand("pod1", 0, None),
            cand("pod2", 1, None),
            cand("pod3", 2, None),
        ];
        assert_eq!(s.select(&c, &req("t"), None).as_deref(), Some("pod1"));
        c[0].enabled = false;
        assert_eq!(s.select(&c, &req("t"), None).as_deref(), Some("pod2"));
        // The current binding is kept even if another would now score better.
        c[0].enabled = true;
        assert_eq!(s.select(&c, &req("t"), Some("pod2")).as_deref(), Some("pod2"));
        // ...unless it stops passing the filters (maintenance).
        c[1].enabled = false;
        assert_eq!(s.select(&c, &req("t"), Some("pod2")).as_deref(), Some("pod1"));
    }

    #[test]
    fn every_weigher_counts_and_multipliers_may_be_negative() {
        // Trio2o applied only the first weigher: here idle capacity (x2) must beat creation order.
        let mut conf = cfg(
            &[BindingFilter::All],
            &[BindingWeigher::CreationOrder, BindingWeigher::IdleCapacity],
        );
        conf.weigher_multipliers = BTreeMap::from([(BindingWeigher::IdleCapacity, 2.0)]);
        let s = Scheduler::new(&conf);
        let c = vec![cand("pod1", 0, Some(0.7)), cand("pod2", 1, Some(0.1))];
        assert_eq!(s.select(&c, &req("t"), None).as_deref(), Some("pod2"));
        // A negative multiplier turns "most idle" into "most packed".
        conf.weigher_multipliers = BTreeMap::from([(BindingWeigher::IdleCapacity, -2.0)]);
        let s = Scheduler::new(&conf);
        assert_eq!(s.select(&c, &req("t"), None).as_deref(), Some("pod1"));
    }

    #[test]
    fn zone_affinity_and_usage_filters() {
        let s = Scheduler::new(&cfg(
            &[
                BindingFilter::All,
                BindingFilter::AvailabilityZone,
                BindingFilter::ResourceAffinity,
                BindingFilter::UsageThreshold,
            ],
            &[BindingWeigher::CreationOrder],
        ));
        let c = vec![
            cand("pod1", 0, Some(0.95)),
            cand("pod2", 1, None),
            cand("pod3", 2, None),
            cand("pod4", 3, None),
        ];
        let mut r = req("t");
        r.availability_zone = Some("az2".into());
        r.resource_affinity = BTreeMap::from([("resource".into(), "cad".into())]);
        assert_eq!(s.select(&c, &r, None).as_deref(), Some("pod4"));
        // pod1 is over the 0.8 threshold, pod2 is the next general-purpose... but cad in az1 is pod2.
        let mut r = req("t");
        r.resource_affinity = BTreeMap::from([("resource".into(), "general".into())]);
        assert_eq!(s.select(&c, &r, None).as_deref(), Some("pod3"));
        r.availability_zone = Some("az9".into());
        assert_eq!(s.select(&c, &r, None), None);
    }

    #[tokio::test]
    async fn binder_keeps_history_and_rebinds_after_maintenance() {
        let store = Arc::new(MemoryStore::default());
        let s = Scheduler::new(&cfg(&[BindingFilter::All], &[BindingWeigher::CreationOrder]));
        let binder = Binder::new(
            s,
            vec![cand("pod1", 0, None), cand("pod2", 1, None)],
            store.clone(),
        );
        assert_eq!(binder.bind(&req("t1")).await.unwrap(), "pod1");
        assert_eq!(binder.bind(&req("t1")).await.unwrap(), "pod1");
        binder.candidates.write().await[0].enabled = false;
        assert_eq!(binder.bind(&req("t1")).await.unwrap(), "pod2");
        // Re-binding to an earlier deployment is allowed (Tricircle's unique key forbade it).
        binder.candidates.write().await[0].enabled = true;
        binder.candidates.write().await[1].enabled = false;
        assert_eq!(binder.bind(&req("t1")).await.unwrap(), "pod1");
        let history = store.history("t1").await.unwrap();
        let names: Vec<&str> = history.iter().map(|b| b.deployment.as_str()).collect();
        assert_eq!(names, ["pod1", "pod2", "pod1"]);
        assert!(history[0].end.is_some() && history[1].end.is_some() && history[2].end.is_none());
    }
}
