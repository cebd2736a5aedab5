//! Keeps the scheduler's candidates in step with the `KuryrOpenStackDeployment` objects: an edit
//! (maintenance, threshold, weight...) takes effect on the next binding decision, no restart. At
//! start every deployment of `kuryr.conf` without an object gets one (its spec from the file), so
//! `kubectl get kosd` lists them all; an object without credentials in `kuryr.conf` gets a
//! `Configured=False` condition naming the missing section.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kuryr_crds::{DeploymentCondition, KuryrOpenStackDeployment, KuryrOpenStackDeploymentSpec, Maintenance};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Binder;
use super::candidates::{self, Unconfigured};
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

/// The `Configured` condition each object should carry.
fn condition(obj: &KuryrOpenStackDeployment, problems: &[Unconfigured]) -> (String, String, String) {
    match problems.iter().find(|p| p.object == obj.name_any()) {
        Some(p) => ("False".into(), "NoCredentials".into(), p.message.clone()),
        None => (
            "True".into(),
            "InKuryrConf".into(),
            "credentials are in kuryr.conf".into(),
        ),
    }
}

/// Records on `obj` what the scheduler now follows: its `Configured` condition and the
/// generation of its spec (`status.observedGeneration`), in one patch, only when either changed.
async fn set_followed(
    api: &Api<KuryrOpenStackDeployment>,
    obj: &KuryrOpenStackDeployment,
    problems: &[Unconfigured],
) {
    let (status, reason, message) = condition(obj, problems);
    let current = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Configured"));
    let same_condition =
        current.is_some_and(|c| c.status == status && c.reason == reason && c.message == message);
    let observed = obj.status.as_ref().and_then(|s| s.observed_generation);
    let generation = obj.metadata.generation;
    if same_condition && (generation.is_none() || observed == generation) {
        return;
    }
    let mut patch = json!({"status": {}});
    if let Some(g) = generation {
        patch["status"]["observedGeneration"] = g.into();
    }
    if !same_condition {
        if status == "False" {
            tracing::warn!(deployment = %obj.name_any(), "{message}");
        }
        let cond = DeploymentCondition {
            type_: "Configured".into(),
            status,
            reason,
            message,
            last_transition_time: super::store::now(),
        };
        patch["status"]["conditions"] = json!([cond]);
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
    let mut objects: BTreeMap<String, KuryrOpenStackDeployment> = BTreeMap::new();
    let mut init: BTreeMap<String, KuryrOpenStackDeployment> = BTreeMap::new();
    let stream = watcher::watcher(api.clone(), watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = stream.next() => ev,
        };
        let changed: Vec<KuryrOpenStackDeployment> = match ev {
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
                objects.remove(&o.name_any());
                vec![]
            }
        };
        let all: Vec<KuryrOpenStackDeployment> = objects.values().cloned().collect();
        let (cands, problems) = candidates::build(&platform.config, &all);
        binder.set_candidates(cands).await;
        for o in &changed {
            set_followed(&api, o, &problems).await;
        }
    }
}
