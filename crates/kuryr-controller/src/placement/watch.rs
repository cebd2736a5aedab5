//! Keeps the scheduler's candidates in step with the `KuryrOpenStackDeployment` objects: an edit
//! (maintenance, threshold, weight...) takes effect on the next binding decision, no restart. At
//! start every deployment of `kuryr.conf` without an object gets one (its spec from the file), so
//! `kubectl get kosd` lists them all; an object without credentials in `kuryr.conf` gets a
//! `Configured=False` condition naming the missing section, one whose spec cannot be followed as
//! written a `Valid=False` condition naming the field. A maintenance window with an `until` ends
//! by itself then (`status.inMaintenance` says which holds now). Changes to the binding objects
//! (an operator's move or pin) empty the binder's cache, so they take effect on the next decision.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kuryr_crds::{
    DeploymentCondition, KuryrOpenStackDeployment, KuryrOpenStackDeploymentSpec, KuryrProjectBinding,
    Maintenance,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::candidates::{self, Unconfigured};
use super::{Binder, Candidate};
use crate::context::Platform;

/// The object `kuryr.conf` implies for a deployment without one.
fn from_config(platform: &Platform, name: &str) -> Option<KuryrOpenStackDeployment> {
    let s = platform.config.deployment(name)?;
    Some(KuryrOpenStackDeployment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: KuryrOpenStackDeploymentSpec {
            availability_zone: s.availability_zone.clone(),
            resource_affinity: s.resource_affinity.clone(),
            maintenance: (!s.binding_enabled).then(|| Maintenance {
                enabled: true,
                reason: Some("binding_enabled = False in kuryr.conf".into()),
                until: None,
            }),
            ..Default::default()
        },
        status: None,
    })
}

/// The status fields the controller owns on a deployment object, as they should be now: its
/// conditions (`Configured`, `Valid`) and whether it is in maintenance. Pure.
fn followed_status(
    obj: &KuryrOpenStackDeployment,
    problems: &[Unconfigured],
    invalid: &[String],
    now: Timestamp,
) -> (Vec<(String, String, String, String)>, bool) {
    let configured = match problems.iter().find(|p| p.object == obj.name_any()) {
        Some(p) => ("False", "NoCredentials", p.message.clone()),
        None => ("True", "InKuryrConf", "credentials are in kuryr.conf".to_string()),
    };
    let valid = if invalid.is_empty() {
        (
            "True",
            "SpecFollowed",
            "the spec is followed as written".to_string(),
        )
    } else {
        ("False", "InvalidSpec", invalid.join("; "))
    };
    let conditions = [("Configured", configured), ("Valid", valid)]
        .into_iter()
        .map(|(t, (s, r, m))| (t.to_string(), s.to_string(), r.to_string(), m))
        .collect();
    let in_maintenance = obj
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| candidates::in_maintenance(m, now));
    (conditions, in_maintenance)
}

/// Records on `obj` what the scheduler now follows: its conditions, whether it is in maintenance,
/// the threshold and headroom it decides with and the generation of its spec
/// (`status.observedGeneration`), in one patch, only when any of them changed. A condition keeps its transition time while its status stays.
async fn set_followed(
    api: &Api<KuryrOpenStackDeployment>,
    obj: &KuryrOpenStackDeployment,
    cands: &[Candidate],
    problems: &[Unconfigured],
    defaults: (f64, f64),
    now: Timestamp,
) {
    let invalid = candidates::spec_problems(obj, defaults.0, defaults.1);
    let (wanted, in_maintenance) = followed_status(obj, problems, &invalid, now);
    // What the scheduler follows: an object without `spec.maintenance` leaves it to kuryr.conf
    // (`binding_enabled = False`), which the status must show too.
    let cand = cands.iter().find(|c| c.name == obj.name_any());
    let in_maintenance = cand.map_or(in_maintenance, |c| c.maintenance);
    let (threshold, headroom) = (cand.map(|c| c.threshold), cand.map(|c| c.hysteresis));
    let status = obj.status.clone().unwrap_or_default();
    let same_conditions = wanted.len() == status.conditions.len()
        && wanted.iter().all(|(t, s, r, m)| {
            status
                .conditions
                .iter()
                .any(|c| &c.type_ == t && &c.status == s && &c.reason == r && &c.message == m)
        });
    let generation = obj.metadata.generation;
    if same_conditions
        && status.in_maintenance == in_maintenance
        && status.usage_threshold == threshold
        && status.headroom == headroom
        && (generation.is_none() || status.observed_generation == generation)
    {
        return;
    }
    let mut patch = json!({"status": {
        "inMaintenance": in_maintenance,
        "usageThreshold": threshold,
        "headroom": headroom,
    }});
    if let Some(g) = generation {
        patch["status"]["observedGeneration"] = g.into();
    }
    if !same_conditions {
        let conditions: Vec<DeploymentCondition> = wanted
            .into_iter()
            .map(|(type_, st, reason, message)| {
                let old = status.conditions.iter().find(|c| c.type_ == type_);
                if st == "False" && old.is_none_or(|c| c.message != message) {
                    tracing::warn!(deployment = %obj.name_any(), condition = %type_, "{message}");
                }
                let last_transition_time = old
                    .filter(|c| c.status == st)
                    .map_or_else(super::store::now, |c| c.last_transition_time.clone());
                DeploymentCondition {
                    type_,
                    status: st,
                    reason,
                    message,
                    last_transition_time,
                }
            })
            .collect();
        patch["status"]["conditions"] = json!(conditions);
    }
    if let Err(e) = api
        .patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(deployment = %obj.name_any(), error = %e, "cannot record the followed spec");
    }
}

/// Creates the missing objects, then follows every change until `stop`.
pub async fn run(platform: Arc<Platform>, binder: Arc<Binder>, stop: CancellationToken) {
    let api: Api<KuryrOpenStackDeployment> = Api::all(platform.kube.clone());
    for name in platform.deployments.names() {
        if let Some(obj) = from_config(&platform, name) {
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => tracing::info!(
                    deployment = name,
                    "KuryrOpenStackDeployment created from kuryr.conf"
                ),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(deployment = name, error = %e, "cannot create KuryrOpenStackDeployment")
                }
            }
        }
    }
    let defaults = (
        platform.config.pod_binding.usage_threshold,
        platform.config.pod_binding.usage_hysteresis,
    );
    let mut objects: BTreeMap<String, KuryrOpenStackDeployment> = BTreeMap::new();
    let mut init: BTreeMap<String, KuryrOpenStackDeployment> = BTreeMap::new();
    let stream = watcher::watcher(api.clone(), watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    // Binding objects change under the binder when an operator moves, pins or unpins one (`kuryr
    // bindings`): its cache must not keep the old deployment until the next usage round.
    let binding_api = Api::<KuryrProjectBinding>::all(platform.kube.clone());
    let bindings = watcher::watcher(binding_api.clone(), watcher::Config::default());
    let mut bindings = std::pin::pin!(bindings);
    // When a maintenance window ends by itself (`spec.maintenance.until`): no event says so.
    let mut window_ends: Option<Timestamp> = None;
    loop {
        let until_window_end = async {
            match window_ends {
                Some(end) => {
                    let wait = end.duration_since(Timestamp::now());
                    let wait = std::time::Duration::try_from(wait).unwrap_or_default();
                    // A little after the end, so that the rebuild sees it passed.
                    tokio::time::sleep(wait + std::time::Duration::from_millis(50)).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let changed: Vec<KuryrOpenStackDeployment> = tokio::select! {
            _ = stop.cancelled() => return,
            () = until_window_end => objects.values().cloned().collect(),
            ev = bindings.next() => {
                match ev {
                    Some(Ok(Event::InitApply(b))) => move_to_own_name(&binding_api, &b).await,
                    Some(Ok(Event::Apply(b))) => {
                        move_to_own_name(&binding_api, &b).await;
                        // Only that binding's cache entry: marking a thousand unused
                        // bindings must not empty the cache of the ones in use each time.
                        binder.forget_key(&super::kube_store::key_of(&b)).await
                    }
                    Some(Ok(Event::Delete(b))) => binder.forget_key(&super::kube_store::key_of(&b)).await,
                    Some(Ok(Event::InitDone)) => binder.forget().await,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "KuryrProjectBinding watch failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    None => return,
                    Some(Ok(_)) => {}
                }
                continue;
            }
            ev = stream.next() => match ev {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "KuryrOpenStackDeployment watch failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
                Some(Ok(Event::Init)) => {
                    init.clear();
                    continue;
                }
                Some(Ok(Event::InitApply(o))) => {
                    init.insert(o.name_any(), o);
                    continue;
                }
                Some(Ok(Event::InitDone)) => {
                    objects = std::mem::take(&mut init);
                    objects.values().cloned().collect()
                }
                Some(Ok(Event::Apply(o))) => {
                    objects.insert(o.name_any(), o.clone());
                    vec![o]
                }
                Some(Ok(Event::Delete(o))) => {
                    let name = o.name_any();
                    objects.remove(&name);
                    // A configured deployment always has its object, for the operator to edit:
                    // made again from kuryr.conf at once (its watch event follows), not at the
                    // next leadership term. What the deleted one said (maintenance) is gone.
                    if platform.deployments.names().any(|n| n == name)
                        && let Some(obj) = from_config(&platform, &name)
                    {
                        match api.create(&PostParams::default(), &obj).await {
                            Ok(_) => tracing::info!(
                                deployment = %name,
                                "KuryrOpenStackDeployment deleted: created again from kuryr.conf"
                            ),
                            Err(kube::Error::Api(s)) if s.code == 409 => {}
                            Err(e) => tracing::warn!(deployment = %name, error = %e, "cannot create KuryrOpenStackDeployment again"),
                        }
                    }
                    vec![]
                }
            },
        };
        let now = Timestamp::now();
        let all: Vec<KuryrOpenStackDeployment> = objects.values().cloned().collect();
        let (cands, problems) = candidates::build(&platform.config, &all, now);
        binder.set_candidates(cands.clone()).await;
        window_ends = candidates::next_change(&all, now);
        for o in &changed {
            set_followed(&api, o, &cands, &problems, defaults, now).await;
        }
    }
}

/// A binding an older controller kept under the name its group shares with a zone's: moved to
/// its own ([`super::kube_store::move_to_own_name`]); a failure is tried again at its next event.
async fn move_to_own_name(api: &Api<KuryrProjectBinding>, b: &KuryrProjectBinding) {
    match super::kube_store::move_to_own_name(api, b).await {
        Ok(true) => tracing::info!(binding = %b.name_any(), "binding moved to its own name"),
        Ok(false) => {}
        Err(e) => tracing::warn!(binding = %b.name_any(), error = %e,
            "cannot move the binding to its own name; retried at its next event"),
    }
}
