//! Retiring bindings no namespace uses: a `KuryrProjectBinding` whose (project, group) no
//! namespace asks for any more is marked with the time it was first seen so
//! ([`annotations::UNUSED_SINCE`]), unmarked when a namespace asks for it again, and deleted once
//! `[pod_binding] unused_binding_retention` has passed with it unused. Without this every tenant a
//! cluster ever had keeps an object for ever. A pinned binding is the operator's and is kept.
//!
//! Deleting a binding moves nothing: every resource records the deployment it was made in and is
//! released there. A namespace of the project that comes later is bound afresh.
//!
//! Deciding ([`decide`]) is pure; a retirement deletes with the resourceVersion listed, and the
//! binder unmarks a marked binding as it reads it (`kube_store.rs`), so a namespace bound from it
//! after the listing - a claim, or a read of a binding that stays - keeps it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kuryr_crds::names::annotations;
use kuryr_crds::{KuryrNetwork, KuryrProjectBinding};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::kube_store::key_of;
use super::{BindingKey, group_of};
use crate::context::Platform;
use crate::error::Error;

/// One binding object as retiring reads it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub name: String,
    pub resource_version: Option<String>,
    pub key: BindingKey,
    pub pinned: bool,
    pub mark: Mark,
}

/// A binding's [`annotations::UNUSED_SINCE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    None,
    Since(Timestamp),
    /// Not a time (edited by hand): written again, so that the retention can run.
    Unreadable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Unused now: mark it.
    Mark(String),
    /// Used again (or pinned): unmark it.
    Unmark(String),
    /// Unused for the whole retention: delete it as read.
    Retire {
        name: String,
        resource_version: Option<String>,
    },
}

/// What to do with each binding, given the keys some namespace asks for.
pub fn decide(
    bindings: &[Seen],
    in_use: &BTreeSet<BindingKey>,
    now: Timestamp,
    retention: Duration,
) -> Vec<Action> {
    let mut out = Vec::new();
    for b in bindings {
        let unused = !b.pinned && !in_use.contains(&b.key);
        match (unused, b.mark) {
            (false, Mark::Since(_) | Mark::Unreadable) => out.push(Action::Unmark(b.name.clone())),
            (false, Mark::None) => {}
            (true, Mark::None | Mark::Unreadable) => out.push(Action::Mark(b.name.clone())),
            (true, Mark::Since(since)) => {
                let held = Duration::try_from(now.duration_since(since)).unwrap_or_default();
                if held >= retention {
                    out.push(Action::Retire {
                        name: b.name.clone(),
                        resource_version: b.resource_version.clone(),
                    });
                }
            }
        }
    }
    out
}

/// The keys the namespaces ask for. A namespace's project is whichever a project driver may give
/// it (its `openstack.org/kuryr-project` annotation, `[neutron_defaults] project`) or its
/// KuryrNetwork records: erring on the side of in use keeps a binding, never loses one. A
/// namespace whose zone or affinity annotation is malformed is bound to nothing.
pub fn keys_in_use(
    namespaces: &[Namespace],
    networks: &[KuryrNetwork],
    default_project: Option<&str>,
) -> BTreeSet<BindingKey> {
    let mut recorded: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for kn in networks {
        recorded
            .entry(kn.namespace().unwrap_or_default())
            .or_default()
            .insert(kn.spec.project_id.clone());
    }
    let mut out = BTreeSet::new();
    for ns in namespaces {
        let Ok(group) = group_of(ns.annotations()) else {
            continue;
        };
        let name = ns.name_any();
        let projects = crate::drivers::project::annotated_project(ns)
            .into_iter()
            .chain(default_project)
            .map(str::to_string)
            .chain(recorded.get(&name).into_iter().flatten().cloned())
            .filter(|p| !p.is_empty());
        for project in projects {
            out.insert(BindingKey {
                project,
                group: group.clone(),
            });
        }
    }
    out
}

fn seen(b: &KuryrProjectBinding) -> Seen {
    Seen {
        name: b.name_any(),
        resource_version: b.resource_version(),
        key: key_of(b),
        pinned: b.spec.pinned,
        mark: match b.annotations().get(annotations::UNUSED_SINCE) {
            None => Mark::None,
            Some(t) => t.parse().map_or(Mark::Unreadable, Mark::Since),
        },
    }
}

/// One pass: reads the bindings, namespaces and KuryrNetworks, marks, unmarks and retires.
/// Returns the bindings retired.
pub async fn pass(platform: &Platform, retention: Duration) -> Result<Vec<String>, Error> {
    let lp = ListParams::default();
    let api = Api::<KuryrProjectBinding>::all(platform.kube.clone());
    let bindings = api.list(&lp).await?.items;
    if bindings.is_empty() {
        return Ok(Vec::new());
    }
    let namespaces = Api::<Namespace>::all(platform.kube.clone())
        .list(&lp)
        .await?
        .items;
    let networks = Api::<KuryrNetwork>::all(platform.kube.clone())
        .list(&lp)
        .await?
        .items;
    let now = Timestamp::now();
    let in_use = keys_in_use(
        &namespaces,
        &networks,
        platform.config.neutron_defaults.project.as_deref(),
    );
    let seen: Vec<Seen> = bindings.iter().map(seen).collect();
    let mut retired = Vec::new();
    // One binding failing (a write refused) does not hold the others up: its error is logged.
    for action in decide(&seen, &in_use, now, retention) {
        let result = match &action {
            Action::Mark(name) => set_mark(&api, name, now.to_string().into()).await,
            Action::Unmark(name) => set_mark(&api, name, serde_json::Value::Null).await,
            Action::Retire {
                name,
                resource_version,
            } => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: resource_version.clone(),
                        uid: None,
                    }),
                    ..Default::default()
                };
                match api.delete(name, &dp).await {
                    Ok(_) => {
                        tracing::info!(binding = %name, retention_secs = retention.as_secs(),
                            "binding no namespace used for the retention deleted");
                        retired.push(name.clone());
                        Ok(())
                    }
                    // Read (so unmarked) or edited since listed (a namespace bound again): kept.
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
                    Err(e) => Err(Error::from(e)),
                }
            }
        };
        if let Err(e) = result {
            tracing::warn!(action = ?action, error = %e, "unused binding not handled; tried at the next pass");
        }
    }
    Ok(retired)
}

/// Sets (a time) or removes (null) the mark of binding `name`.
async fn set_mark(api: &Api<KuryrProjectBinding>, name: &str, value: serde_json::Value) -> Result<(), Error> {
    let patch = json!({"metadata": {"annotations": {annotations::UNUSED_SINCE: value}}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Retires unused bindings until `stop`, every quarter of the retention (at most hourly).
pub async fn run(platform: Arc<Platform>, retention: Duration, stop: CancellationToken) {
    let every = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = pass(&platform, retention).await {
            tracing::warn!(error = %e, "unused bindings not looked at this round; tried again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Group;

    fn key(project: &str, zone: Option<&str>) -> BindingKey {
        BindingKey {
            project: project.into(),
            group: Group {
                availability_zone: zone.map(str::to_string),
                resource_affinity: BTreeMap::new(),
            },
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn binding(name: &str, key: BindingKey, pinned: bool, since: Option<&str>) -> Seen {
        Seen {
            name: name.into(),
            resource_version: Some("7".into()),
            key,
            pinned,
            mark: match since {
                None => Mark::None,
                Some("garbage") => Mark::Unreadable,
                Some(t) => Mark::Since(at(t)),
            },
        }
    }

    #[test]
    fn unused_bindings_are_marked_then_retired_and_used_or_pinned_ones_unmarked() {
        let week = Duration::from_secs(7 * 24 * 3600);
        let now = at("2026-12-08T00:00:00Z");
        let in_use = BTreeSet::from([key("used", None), key("back", None)]);
        let all = [
            binding("used", key("used", None), false, None),
            binding("back", key("back", None), false, Some("2026-12-01T00:00:00Z")),
            binding("new", key("gone", None), false, None),
            binding(
                "young",
                key("gone", Some("az1")),
                false,
                Some("2026-12-02T00:00:00Z"),
            ),
            binding(
                "old",
                key("gone", Some("az2")),
                false,
                Some("2026-12-01T00:00:00Z"),
            ),
            binding(
                "pinned",
                key("gone", Some("az3")),
                true,
                Some("2026-11-01T00:00:00Z"),
            ),
            binding("pinned-unmarked", key("gone", Some("az4")), true, None),
            // The zone's binding is not the general one's: another group of a used project.
            binding("other-group", key("used", Some("az9")), false, None),
            binding("edited", key("gone", Some("az5")), false, Some("garbage")),
            binding("edited-used", key("back", None), false, Some("garbage")),
        ];
        assert_eq!(
            decide(&all, &in_use, now, week),
            [
                Action::Unmark("back".into()),
                Action::Mark("new".into()),
                Action::Retire {
                    name: "old".into(),
                    resource_version: Some("7".into())
                },
                Action::Unmark("pinned".into()),
                Action::Mark("other-group".into()),
                Action::Mark("edited".into()),
                Action::Unmark("edited-used".into()),
            ]
        );
    }

    #[test]
    fn a_namespace_uses_the_keys_of_every_project_it_may_be_given() {
        let ns = |name: &str, annotations: serde_json::Value| -> Namespace {
            serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let namespaces = [
            ns("a", json!({})),
            ns(
                "b",
                json!({"openstack.org/kuryr-project": "pb", "openstack.org/kuryr-availability-zone": "az1"}),
            ),
            ns(
                "bad",
                json!({"openstack.org/kuryr-project": "px", "openstack.org/kuryr-availability-zone": ""}),
            ),
        ];
        let kn: KuryrNetwork = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "a"},
            "spec": {"nsName": "a", "projectId": "recorded", "nsLabels": {}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let keys = keys_in_use(&namespaces, &[kn], Some("dflt"));
        assert_eq!(
            keys,
            BTreeSet::from([
                key("dflt", None),
                key("recorded", None),
                key("pb", Some("az1")),
                key("dflt", Some("az1")),
            ]),
            "a malformed zone binds nothing"
        );
    }
}
