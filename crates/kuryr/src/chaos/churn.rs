//! The soak's workload: pods created, deleted and relabelled, namespaces created and deleted,
//! Services and NetworkPolicies coming and going, at a set rate, all through the API server.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rand::Rng as _;
use rand::rngs::StdRng;
use serde_json::json;

/// Label every soak namespace carries (the teardown deletes them by it).
pub const NAMESPACE_LABEL: &str = "kuryr-chaos";

/// Operations done and refused, by kind.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub done: BTreeMap<&'static str, u64>,
    /// Refused by the API server (an outage, a namespace being deleted).
    pub refused: BTreeMap<&'static str, u64>,
}

impl Counts {
    pub fn pod_operations(&self) -> u64 {
        ["pod create", "pod delete", "pod relabel"]
            .iter()
            .map(|k| self.done.get(k).copied().unwrap_or(0))
            .sum()
    }
}

pub struct Churn {
    kube: kube::Client,
    pub rng: StdRng,
    max_pods: usize,
    max_namespaces: usize,
    services: usize,
    policies: usize,
    /// namespace -> pod names.
    pods: BTreeMap<String, BTreeSet<String>>,
    svcs: BTreeSet<(String, String)>,
    nps: BTreeSet<(String, String)>,
    next: u64,
    pub counts: Counts,
}

impl Churn {
    pub fn new(
        kube: kube::Client,
        rng: StdRng,
        max_pods: usize,
        namespaces: usize,
        services: usize,
        policies: usize,
    ) -> Self {
        Self {
            kube,
            rng,
            max_pods,
            max_namespaces: namespaces.max(1),
            services,
            policies,
            pods: BTreeMap::new(),
            svcs: BTreeSet::new(),
            nps: BTreeSet::new(),
            next: 0,
            counts: Counts::default(),
        }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}-{}", self.next)
    }

    fn pod_count(&self) -> usize {
        self.pods.values().map(BTreeSet::len).sum()
    }

    fn record(&mut self, what: &'static str, ok: bool) {
        let map = if ok {
            &mut self.counts.done
        } else {
            &mut self.counts.refused
        };
        *map.entry(what).or_default() += 1;
    }

    /// The starting namespaces.
    pub async fn setup(&mut self) {
        for _ in 0..self.max_namespaces {
            self.create_namespace().await;
        }
    }

    /// One operation, chosen at random with weights that keep the cluster near its sizes.
    pub async fn step(&mut self) {
        // One in ten is about namespaces, Services or policies.
        if self.rng.random_range(0..10) == 0 {
            match self.rng.random_range(0..3) {
                0 => self.namespace_op().await,
                1 if self.services > 0 => self.service_op().await,
                _ if self.policies > 0 => self.policy_op().await,
                _ => self.namespace_op().await,
            }
            return;
        }
        let n = self.pod_count();
        let roll = self.rng.random_range(0..10);
        if n == 0 || (n < self.max_pods && roll < 5) {
            self.create_pod().await;
        } else if roll < 8 {
            self.delete_pod().await;
        } else {
            self.relabel_pod().await;
        }
    }

    /// `count` pods at once (more than the pools hold: refills start).
    pub async fn burst(&mut self, count: usize) {
        for _ in 0..count {
            self.create_pod().await;
        }
    }

    /// Deletes up to `count` pods at once (ports are released and recycled).
    pub async fn mass_delete(&mut self, count: usize) {
        for _ in 0..count {
            self.delete_pod().await;
        }
    }

    fn random_namespace(&mut self) -> Option<String> {
        if self.pods.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.pods.len());
        self.pods.keys().nth(i).cloned()
    }

    async fn create_pod(&mut self) {
        let Some(ns) = self.random_namespace() else {
            return;
        };
        let name = self.fresh("pod");
        let tier = if self.rng.random_bool(0.5) { "a" } else { "b" };
        let pod: Result<Pod, _> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": "chaos", "tier": tier}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]}
        }));
        let ok = match pod {
            Ok(pod) => Api::<Pod>::namespaced(self.kube.clone(), &ns)
                .create(&PostParams::default(), &pod)
                .await
                .is_ok(),
            Err(_) => false,
        };
        if ok && let Some(set) = self.pods.get_mut(&ns) {
            set.insert(name);
        }
        self.record("pod create", ok);
    }

    fn random_pod(&mut self) -> Option<(String, String)> {
        let all: Vec<(String, String)> = self
            .pods
            .iter()
            .flat_map(|(ns, names)| names.iter().map(move |n| (ns.clone(), n.clone())))
            .collect();
        if all.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..all.len());
        all.into_iter().nth(i)
    }

    async fn delete_pod(&mut self) {
        let Some((ns, name)) = self.random_pod() else {
            return;
        };
        let r = Api::<Pod>::namespaced(self.kube.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await;
        // Already gone counts as deleted.
        let ok = match r {
            Ok(_) => true,
            Err(kube::Error::Api(e)) => e.code == 404,
            Err(_) => false,
        };
        if ok && let Some(set) = self.pods.get_mut(&ns) {
            set.remove(&name);
        }
        self.record("pod delete", ok);
    }

    async fn relabel_pod(&mut self) {
        let Some((ns, name)) = self.random_pod() else {
            return;
        };
        let tier = if self.rng.random_bool(0.5) { "a" } else { "b" };
        let ok = Api::<Pod>::namespaced(self.kube.clone(), &ns)
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"tier": tier}}})),
            )
            .await
            .is_ok();
        self.record("pod relabel", ok);
    }

    async fn namespace_op(&mut self) {
        if self.pods.len() < self.max_namespaces
            || (self.pods.len() < 2 * self.max_namespaces && self.rng.random_bool(0.5))
        {
            self.create_namespace().await;
        } else {
            self.delete_namespace().await;
        }
    }

    async fn create_namespace(&mut self) {
        let name = self.fresh("chaos-ns");
        let ns: Result<Namespace, _> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {NAMESPACE_LABEL: "yes", "ns": name}}
        }));
        let ok = match ns {
            Ok(ns) => Api::<Namespace>::all(self.kube.clone())
                .create(&PostParams::default(), &ns)
                .await
                .is_ok(),
            Err(_) => false,
        };
        if ok {
            self.pods.insert(name, BTreeSet::new());
        }
        self.record("namespace create", ok);
    }

    async fn delete_namespace(&mut self) {
        let Some(ns) = self.random_namespace() else {
            return;
        };
        let ok = Api::<Namespace>::all(self.kube.clone())
            .delete(&ns, &DeleteParams::default())
            .await
            .is_ok();
        if ok {
            // Its pods, Services and policies go with it.
            self.pods.remove(&ns);
            self.svcs.retain(|(n, _)| *n != ns);
            self.nps.retain(|(n, _)| *n != ns);
        }
        self.record("namespace delete", ok);
    }

    async fn service_op(&mut self) {
        if self.svcs.len() < self.services {
            let Some(ns) = self.random_namespace() else {
                return;
            };
            let name = self.fresh("svc");
            let svc: Result<Service, _> = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {"app": "chaos"},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
            }));
            let ok = match svc {
                Ok(svc) => Api::<Service>::namespaced(self.kube.clone(), &ns)
                    .create(&PostParams::default(), &svc)
                    .await
                    .is_ok(),
                Err(_) => false,
            };
            if ok {
                self.svcs.insert((ns, name));
            }
            self.record("service create", ok);
        } else {
            let i = self.rng.random_range(0..self.svcs.len());
            let Some((ns, name)) = self.svcs.iter().nth(i).cloned() else {
                return;
            };
            let ok = Api::<Service>::namespaced(self.kube.clone(), &ns)
                .delete(&name, &DeleteParams::default())
                .await
                .is_ok();
            if ok {
                self.svcs.remove(&(ns, name));
            }
            self.record("service delete", ok);
        }
    }

    async fn policy_op(&mut self) {
        if self.nps.len() < self.policies {
            let Some(ns) = self.random_namespace() else {
                return;
            };
            let name = self.fresh("np");
            let np: Result<NetworkPolicy, _> = serde_json::from_value(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"podSelector": {"matchLabels": {"tier": "a"}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "chaos"}}}],
                                      "ports": [{"protocol": "TCP", "port": 8080}]}]}
            }));
            let ok = match np {
                Ok(np) => Api::<NetworkPolicy>::namespaced(self.kube.clone(), &ns)
                    .create(&PostParams::default(), &np)
                    .await
                    .is_ok(),
                Err(_) => false,
            };
            if ok {
                self.nps.insert((ns, name));
            }
            self.record("policy create", ok);
        } else {
            let i = self.rng.random_range(0..self.nps.len());
            let Some((ns, name)) = self.nps.iter().nth(i).cloned() else {
                return;
            };
            let ok = Api::<NetworkPolicy>::namespaced(self.kube.clone(), &ns)
                .delete(&name, &DeleteParams::default())
                .await
                .is_ok();
            if ok {
                self.nps.remove(&(ns, name));
            }
            self.record("policy delete", ok);
        }
    }

    /// Deletes every soak namespace (with their pods, Services and policies).
    pub async fn delete_everything(&mut self) {
        let names: Vec<String> = self.pods.keys().cloned().collect();
        for ns in names {
            let _ = Api::<Namespace>::all(self.kube.clone())
                .delete(&ns, &DeleteParams::default())
                .await;
        }
        self.pods.clear();
        self.svcs.clear();
        self.nps.clear();
    }
}
