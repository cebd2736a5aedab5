//! The claim of `[kubernetes] cluster_id` in each OpenStack deployment.
//!
//! Every resource kuryr-rs creates carries the cluster tag, and the orphan sweeps and pool
//! recovery act on whatever carries it. Two Kubernetes clusters left at the same `cluster_id`
//! (the default is `kubernetes`) whose credentials see the same resources would adopt and delete
//! each other's ports, load balancers and groups. So the first cluster to lead claims the id in
//! each deployment: a security group named `kuryr-rs-cluster:<cluster_id>` whose description
//! names the uid of its `kube-system` namespace (a cluster's identity; a restored etcd keeps it).
//!
//! - A controller finding the id claimed by another cluster refuses to lead: it exits naming the
//!   group, before any handler ran in that term.
//! - Two clusters claiming at once are told apart by the claim's `created_at`, then its id: the
//!   later one deletes its own claim and refuses. Neutron's timestamps have whole seconds, so two
//!   claims made in the same second could each have looked alone; the periodic re-check finds it.
//! - Until a deployment's claim is confirmed, its sweeps skip it and pool recovery waits for it
//!   (`Deployments::claimed_names`). Handlers do not wait: what they create is their own.
//! - The claim outlives the controller on purpose (an uninstall deletes it, docs/install.md).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kuryr_crds::names::neutron::TAG_MANAGED;
use kuryr_neutron::{ListFilter, SecurityGroup, SecurityGroupCreate, Taggable};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::context::Platform;
use crate::error::Error;

/// The claim group's name is this followed by the `cluster_id`.
pub const GROUP_PREFIX: &str = "kuryr-rs-cluster:";
/// The claim group's description is this followed by the claiming cluster's kube-system uid.
pub const DESCRIPTION_PREFIX: &str =
    "kuryr-rs cluster_id claim of the Kubernetes cluster whose kube-system uid is ";
/// How often a held claim is checked again (and a failed check retried at most).
pub const RECHECK_PERIOD: Duration = Duration::from_secs(300);
const FIRST_RETRY: Duration = Duration::from_secs(2);

pub fn group_name(cluster_id: &str) -> String {
    format!("{GROUP_PREFIX}{cluster_id}")
}

/// One claim group as Neutron lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub group: String,
    /// The claiming cluster's kube-system uid; `None` when the description was edited.
    pub uid: Option<String>,
    pub created_at: Option<String>,
    pub tagged: bool,
}

impl Claim {
    pub fn of(sg: &SecurityGroup) -> Self {
        Self {
            group: sg.id.clone(),
            uid: sg
                .description
                .strip_prefix(DESCRIPTION_PREFIX)
                .filter(|u| !u.is_empty())
                .map(str::to_string),
            created_at: sg.created_at.clone(),
            tagged: sg.tags.iter().any(|t| t == TAG_MANAGED),
        }
    }
}

/// What the claims of one deployment mean for the cluster whose kube-system uid is given.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No claim: make one.
    Unclaimed,
    /// The earliest claim is this cluster's; `duplicates` are its later ones (two replicas or
    /// two attempts after a lost reply), to delete.
    Held { own: Claim, duplicates: Vec<String> },
    /// Another cluster's (or an unreadable) claim is the earliest; `own` are this cluster's, to
    /// delete before refusing.
    Taken { holder: Claim, own: Vec<String> },
}

/// Decides on the claims listed (pure: tested without servers).
pub fn judge(claims: &[Claim], uid: &str) -> Verdict {
    let mut sorted: Vec<&Claim> = claims.iter().collect();
    sorted.sort_by(|a, b| (&a.created_at, &a.group).cmp(&(&b.created_at, &b.group)));
    let Some(first) = sorted.first() else {
        return Verdict::Unclaimed;
    };
    let mut own = sorted
        .iter()
        .filter(|c| c.uid.as_deref() == Some(uid))
        .map(|c| c.group.clone());
    if first.uid.as_deref() == Some(uid) {
        own.next();
        Verdict::Held {
            own: (*first).clone(),
            duplicates: own.collect(),
        }
    } else {
        Verdict::Taken {
            holder: (*first).clone(),
            own: own.collect(),
        }
    }
}

/// What one check of one deployment found.
#[derive(Debug)]
pub enum Outcome {
    Held,
    /// Another cluster holds the id: the controller must not lead (the message says what to do).
    Taken(Error),
    /// The check could not be made (Neutron or the Kubernetes API unreachable): try again.
    Failed(Error),
}

/// Claims `cluster_id` in every deployment and keeps checking it while leading.
pub struct ClusterClaim {
    platform: Arc<Platform>,
    uid: OnceCell<String>,
}

impl ClusterClaim {
    pub fn new(platform: Arc<Platform>) -> Self {
        Self {
            platform,
            uid: OnceCell::new(),
        }
    }

    /// The kube-system namespace's uid.
    async fn uid(&self) -> Result<&str, Error> {
        self.uid
            .get_or_try_init(|| async {
                let ns = Api::<Namespace>::all(self.platform.kube.clone())
                    .get("kube-system")
                    .await?;
                ns.metadata
                    .uid
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| Error::not_ready("the kube-system namespace has no uid"))
            })
            .await
            .map(String::as_str)
    }

    /// Checks every deployment at once; records each outcome in `Deployments`.
    pub async fn check_all(&self) -> Vec<(String, Outcome)> {
        let names: Vec<String> = self.platform.deployments.names().map(str::to_string).collect();
        let checks = names.iter().map(|d| self.check(d));
        let outcomes = futures::future::join_all(checks).await;
        names.into_iter().zip(outcomes).collect()
    }

    /// Claims (or confirms the claim of) `cluster_id` in `deployment`.
    pub async fn check(&self, deployment: &str) -> Outcome {
        let outcome = match self.try_check(deployment).await {
            Ok(None) => Outcome::Held,
            Ok(Some(taken)) => Outcome::Taken(taken),
            Err(e) => Outcome::Failed(e),
        };
        match &outcome {
            Outcome::Held => self.platform.deployments.set_claimed(deployment, true),
            Outcome::Taken(_) => self.platform.deployments.set_claimed(deployment, false),
            // A held claim stays held through an outage: nobody else can take it meanwhile.
            Outcome::Failed(_) => {}
        }
        outcome
    }

    /// `Ok(None)` once held; `Ok(Some(why))` when another cluster holds it.
    async fn try_check(&self, deployment: &str) -> Result<Option<Error>, Error> {
        let uid = self.uid().await?.to_string();
        let cluster_id = &self.platform.cluster_id;
        let client = self.platform.deployments.client(deployment)?;
        let name = group_name(cluster_id);
        let context = |what: &str| format!("cluster_id claim in deployment {deployment}: {what}");
        // Twice at most: a first listing finding none, then the one after this cluster's create.
        for _ in 0..2 {
            let claims: Vec<Claim> = client
                .list_security_groups(&ListFilter::new().name(&name))
                .await
                .map_err(|e| Error::openstack(context("listing claims"), e))?
                .iter()
                .map(Claim::of)
                .collect();
            match judge(&claims, &uid) {
                Verdict::Unclaimed => {
                    let project = match self.platform.config.neutron_defaults.project.as_deref() {
                        None | Some("") => None,
                        Some(p) => Some(self.platform.project_in(deployment, p).await),
                    };
                    let req = SecurityGroupCreate {
                        name: name.clone(),
                        project_id: project,
                        description: Some(format!("{DESCRIPTION_PREFIX}{uid}")),
                        ..Default::default()
                    };
                    let sg = client
                        .create_security_group(&req)
                        .await
                        .map_err(|e| Error::openstack(context("creating the claim"), e))?;
                    tracing::info!(%deployment, cluster_id, group = %sg.id, "claimed cluster_id");
                }
                Verdict::Held { own, duplicates } => {
                    for id in duplicates {
                        delete_ignoring_gone(client, &id)
                            .await
                            .map_err(|e| Error::openstack(context("deleting a duplicate claim"), e))?;
                    }
                    if !own.tagged {
                        // Tags cannot be given in a security group's POST; a crash between the two
                        // calls is mended here.
                        client
                            .replace_tags(
                                Taggable::SecurityGroup,
                                &own.group,
                                &self.platform.resource_tags(),
                            )
                            .await
                            .map_err(|e| Error::openstack(context("tagging the claim"), e))?;
                    }
                    return Ok(None);
                }
                Verdict::Taken { holder, own } => {
                    for id in own {
                        delete_ignoring_gone(client, &id).await.map_err(|e| {
                            Error::openstack(context("deleting this cluster's later claim"), e)
                        })?;
                    }
                    let by = holder.uid.map_or_else(
                        || "an unreadable description".to_string(),
                        |u| format!("kube-system uid {u}"),
                    );
                    return Ok(Some(Error::Config(format!(
                        "[kubernetes] cluster_id {cluster_id:?} is claimed in OpenStack deployment {deployment:?} \
                         by another Kubernetes cluster (security group {} named {name:?}, {by}; this cluster's \
                         kube-system uid is {uid}): both clusters' resources would carry the same tags and each \
                         controller would sweep the other's as orphans. Give this cluster its own cluster_id; if \
                         the other cluster is gone for good, delete that security group and this cluster adopts \
                         (and sweeps) what it left.",
                        holder.group
                    ))));
                }
            }
        }
        Err(Error::not_ready(context(
            "the claim just created is not listed yet",
        )))
    }

    /// Re-checks every deployment every [`RECHECK_PERIOD`] while leading, a failed one sooner
    /// (from 2 s, doubling). A claim found taken is sent to `fatal` and the task ends.
    pub async fn run(
        self: Arc<Self>,
        failed_first: bool,
        fatal: tokio::sync::mpsc::Sender<Error>,
        stop: CancellationToken,
    ) {
        let mut retry = FIRST_RETRY;
        let mut wait = if failed_first { retry } else { RECHECK_PERIOD };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let mut failed = false;
            for (deployment, outcome) in self.check_all().await {
                match outcome {
                    Outcome::Held => {}
                    Outcome::Taken(e) => {
                        let _ = fatal.send(e).await;
                        return;
                    }
                    Outcome::Failed(e) => {
                        failed = true;
                        tracing::warn!(%deployment, error = %e, retry_in = ?retry, "cluster_id claim check failed");
                    }
                }
            }
            (wait, retry) = match failed {
                true => (retry, (retry * 2).min(RECHECK_PERIOD)),
                false => (RECHECK_PERIOD, FIRST_RETRY),
            };
        }
    }
}

async fn delete_ignoring_gone(
    client: &kuryr_neutron::NeutronClient,
    id: &str,
) -> Result<(), kuryr_neutron::Error> {
    match client.delete_security_group(id).await {
        Err(e) if e.is_not_found() => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(group: &str, uid: Option<&str>, at: &str) -> Claim {
        Claim {
            group: group.into(),
            uid: uid.map(str::to_string),
            created_at: Some(at.into()),
            tagged: true,
        }
    }

    #[test]
    fn none_is_unclaimed() {
        assert_eq!(judge(&[], "me"), Verdict::Unclaimed);
    }

    #[test]
    fn the_earliest_claim_holds_and_later_copies_of_it_go() {
        let mine = claim("b", Some("me"), "2026-11-30T04:00:00Z");
        let later_mine = claim("a", Some("me"), "2026-11-30T04:00:05Z");
        let later_other = claim("c", Some("other"), "2026-11-30T04:00:01Z");
        assert_eq!(
            judge(&[later_mine.clone(), later_other.clone(), mine.clone()], "me"),
            Verdict::Held {
                own: mine.clone(),
                duplicates: vec!["a".into()]
            }
        );
        // The other cluster sees the same listing: it is the later one and deletes its own.
        assert_eq!(
            judge(&[later_mine, later_other, mine.clone()], "other"),
            Verdict::Taken {
                holder: mine,
                own: vec!["c".into()]
            }
        );
    }

    #[test]
    fn claims_of_one_second_are_ordered_by_id() {
        let x = claim("x", Some("me"), "2026-11-30T04:00:00Z");
        let y = claim("y", Some("other"), "2026-11-30T04:00:00Z");
        assert!(matches!(
            judge(&[y.clone(), x.clone()], "me"),
            Verdict::Held { .. }
        ));
        assert!(matches!(judge(&[x, y], "other"), Verdict::Taken { .. }));
    }

    #[test]
    fn an_unreadable_claim_is_nobody_s_to_ignore() {
        let edited = claim("e", None, "2026-11-30T04:00:00Z");
        let mine = claim("m", Some("me"), "2026-11-30T04:00:09Z");
        assert_eq!(
            judge(&[mine, edited.clone()], "me"),
            Verdict::Taken {
                holder: edited,
                own: vec!["m".into()]
            }
        );
    }

    #[test]
    fn a_group_description_names_its_cluster() {
        let sg = SecurityGroup {
            id: "g".into(),
            description: format!("{DESCRIPTION_PREFIX}1234"),
            tags: vec![TAG_MANAGED.into()],
            ..Default::default()
        };
        assert_eq!(Claim::of(&sg).uid.as_deref(), Some("1234"));
        assert!(Claim::of(&sg).tagged);
        let blank = SecurityGroup {
            description: DESCRIPTION_PREFIX.into(),
            ..Default::default()
        };
        assert_eq!(Claim::of(&blank).uid, None);
    }
}
