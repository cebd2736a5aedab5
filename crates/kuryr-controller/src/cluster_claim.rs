//! The claim of `[kubernetes] cluster_id` in each OpenStack deployment.
//!
//! Every resource kuryr-rs creates carries the cluster tag, and the orphan sweeps and pool
//! recovery act on whatever carries it. Two Kubernetes clusters left at the same `cluster_id`
//! (the default is `kubernetes`) whose credentials see the same resources would adopt and delete
//! each other's ports, load balancers and groups. So the first cluster to lead claims the id in
//! each deployment: a security group named `kuryr-rs-cluster:<cluster_id>` whose description
//! names the uid of its `kube-system` namespace (a cluster's identity; a restored etcd keeps it).
//!
//! - The earliest claim holds (`created_at`, then id). A controller meeting another cluster's
//!   earlier claim withdraws its own claims (in every deployment) and stops, naming the group;
//!   at the start of a term that is before any handler ran.
//! - A claim just made is confirmed by the next check (2 s later), not by the listing after the
//!   create: Neutron's timestamps have whole seconds, and two claims made in the same second
//!   could each have looked alone.
//! - A later claim of another cluster that stays (its credentials cannot see ours: another
//!   project's scope) makes the id contested there: sweeps stop in that deployment and an error
//!   is logged at every check until an operator resolves it. Nothing stops the earlier cluster.
//! - Until a deployment's claim is confirmed, its sweeps skip it and pool recovery waits for it
//!   (`Deployments::claimed_names`). Handlers do not wait to create (what they create is their
//!   own), only to adopt what they find by the cluster tag (a namespace's group or network, an
//!   allow-all group; `Deployments::adoptable`), which a contested claim does not stop.
//! - The claim outlives the controller on purpose (an uninstall deletes it, docs/install.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kuryr_crds::names::neutron::TAG_MANAGED;
use kuryr_neutron::{ListFilter, NeutronClient, SecurityGroup, SecurityGroupCreate, Taggable};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::Platform;
use crate::error::Error;
use crate::locked::Locked;

/// The claim group's name is this followed by the `cluster_id`.
pub const GROUP_PREFIX: &str = "kuryr-rs-cluster:";
/// The claim group's description is this followed by the claiming cluster's kube-system uid.
pub const DESCRIPTION_PREFIX: &str =
    "kuryr-rs cluster_id claim of the Kubernetes cluster whose kube-system uid is ";
/// How often a held claim is checked again (and a failed check retried at most).
pub const RECHECK_PERIOD: Duration = Duration::from_secs(300);
/// The first retry of a check that did not confirm the claim (doubling up to the period).
const FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between checks while a deployment's claim is not confirmed (a check that
/// failed, a claim just made).
const UNCONFIRMED_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long another cluster's later claim may stay before it is reported as a conflict (a
/// cluster that lost a race deletes its own within a check or two).
const CONTEST_GRACE: Duration = Duration::from_secs(10);

pub fn group_name(cluster_id: &str) -> String {
    format!("{GROUP_PREFIX}{cluster_id}")
}

/// The kube-system namespace's uid: the cluster's identity in its claims.
pub async fn cluster_uid(kube: &kube::Client) -> Result<String, Error> {
    Api::<Namespace>::all(kube.clone())
        .get("kube-system")
        .await?
        .metadata
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| Error::not_ready("the kube-system namespace has no uid"))
}

/// Every claim of `cluster_id` that `client`'s credentials can see.
pub async fn read_claims(
    client: &NeutronClient,
    cluster_id: &str,
) -> Result<Vec<Claim>, kuryr_neutron::Error> {
    Ok(client
        .list_security_groups(&ListFilter::new().name(group_name(cluster_id)))
        .await?
        .iter()
        .map(Claim::of)
        .collect())
}

/// One claim group as Neutron lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub group: String,
    pub project_id: String,
    /// The claiming cluster's kube-system uid; `None` when the description was edited.
    pub uid: Option<String>,
    pub created_at: Option<String>,
    pub tagged: bool,
}

impl Claim {
    pub fn of(sg: &SecurityGroup) -> Self {
        Self {
            group: sg.id.clone(),
            project_id: sg.project_id.clone(),
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
    /// The earliest claim is this cluster's. `duplicates`: its later ones in the same project
    /// (two replicas, or a retry after a lost reply), to delete; `contested`: later claims of
    /// other clusters.
    Held {
        own: Claim,
        duplicates: Vec<String>,
        contested: Vec<Claim>,
    },
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
    let is_own = |c: &&&Claim| c.uid.as_deref() == Some(uid);
    if is_own(&first) {
        Verdict::Held {
            own: (*first).clone(),
            // Another project's copy is another scope's (a deployment section with other
            // credentials on the same Neutron): its own checks keep it.
            duplicates: sorted[1..]
                .iter()
                .filter(|c| is_own(c) && c.project_id == first.project_id)
                .map(|c| c.group.clone())
                .collect(),
            contested: sorted[1..]
                .iter()
                .filter(|c| !is_own(c))
                .map(|c| (*c).clone())
                .collect(),
        }
    } else {
        Verdict::Taken {
            holder: (*first).clone(),
            own: sorted.iter().filter(is_own).map(|c| c.group.clone()).collect(),
        }
    }
}

/// What one check of one deployment found.
#[derive(Debug)]
pub enum Outcome {
    Held,
    /// Claimed by this check, or another cluster's later claim is within its grace: a later
    /// check confirms it.
    Unconfirmed,
    /// Another cluster claims the id later and keeps its claim: sweeps stop here.
    Contested(Error),
    /// Another cluster holds the id: the controller must not lead (the message says what to do).
    Taken(Error),
    /// The check could not be made (Neutron or the Kubernetes API unreachable, forbidden).
    Failed(Error),
}

impl Outcome {
    /// Logs what is not a confirmed claim.
    pub fn log(&self, deployment: &str) {
        match self {
            Outcome::Held | Outcome::Unconfirmed | Outcome::Taken(_) => {}
            Outcome::Contested(e) => {
                tracing::error!(%deployment, error = %e, "cluster_id contested; its sweeps stop")
            }
            // Retrying cannot mend a refused permission or a bad configuration.
            Outcome::Failed(e) if !e.is_retryable() => {
                tracing::error!(%deployment, error = %e, "cluster_id claim check failed; its sweeps wait for it")
            }
            Outcome::Failed(e) => {
                tracing::warn!(%deployment, error = %e, "cluster_id claim check failed; its sweeps wait for it")
            }
        }
    }
}

/// Claims `cluster_id` in every deployment and keeps checking it while leading.
pub struct ClusterClaim {
    platform: Arc<Platform>,
    uid: OnceCell<String>,
    /// (deployment, group) of other clusters' later claims -> when first seen.
    contested: std::sync::Mutex<HashMap<(String, String), Instant>>,
}

impl ClusterClaim {
    pub fn new(platform: Arc<Platform>) -> Self {
        Self {
            platform,
            uid: OnceCell::new(),
            contested: std::sync::Mutex::default(),
        }
    }

    /// The kube-system namespace's uid.
    async fn uid(&self) -> Result<&str, Error> {
        self.uid
            .get_or_try_init(|| cluster_uid(&self.platform.kube))
            .await
            .map(String::as_str)
    }

    /// Checks every deployment at once; each outcome is recorded in `Deployments` and logged.
    /// Returns whether every deployment is confirmed, or the first refusal. After `patience`
    /// the checks still running are given up (not confirmed; a later check makes them) - unless
    /// one was refused: then all are let finish, so that no claim create is left in flight
    /// behind the withdrawal that follows.
    pub async fn check_all_within(&self, patience: Duration) -> Result<bool, Error> {
        let mut checks: FuturesUnordered<_> = self
            .platform
            .deployments
            .names()
            .map(|d| async move { (d, self.check(d).await) })
            .collect();
        let deadline = tokio::time::sleep(patience);
        tokio::pin!(deadline);
        let mut all_held = true;
        let mut taken = None;
        loop {
            let next = tokio::select! {
                next = checks.next() => next,
                _ = &mut deadline, if taken.is_none() => {
                    tracing::warn!(waited = ?patience, "cluster_id claim checks unfinished; their sweeps wait for a later one");
                    return Ok(false);
                }
            };
            let Some((deployment, outcome)) = next else { break };
            outcome.log(deployment);
            match outcome {
                Outcome::Held => {}
                Outcome::Taken(e) => {
                    taken.get_or_insert(e);
                }
                Outcome::Unconfirmed | Outcome::Contested(_) | Outcome::Failed(_) => all_held = false,
            }
        }
        taken.map_or(Ok(all_held), Err)
    }

    /// [`ClusterClaim::check_all_within`] with the time the checks' own timeouts take.
    pub async fn check_all(&self) -> Result<bool, Error> {
        self.check_all_within(Duration::MAX).await
    }

    /// Claims (or confirms the claim of) `cluster_id` in `deployment`.
    pub async fn check(&self, deployment: &str) -> Outcome {
        let outcome = match self.try_check(deployment).await {
            Ok(o) => o,
            Err(e) => Outcome::Failed(e),
        };
        match &outcome {
            Outcome::Held => self.platform.deployments.set_claimed(deployment, true),
            Outcome::Contested(_) => self.platform.deployments.set_contested(deployment),
            Outcome::Unconfirmed | Outcome::Taken(_) => {
                self.platform.deployments.set_claimed(deployment, false);
            }
            // A held claim stays held through an outage: nobody else can take it meanwhile.
            Outcome::Failed(_) => {}
        }
        outcome
    }

    async fn claims(&self, client: &NeutronClient, context: &str) -> Result<Vec<Claim>, Error> {
        read_claims(client, &self.platform.cluster_id)
            .await
            .map_err(|e| Error::openstack(format!("{context}: listing claims"), e))
    }

    async fn try_check(&self, deployment: &str) -> Result<Outcome, Error> {
        let uid = self.uid().await?.to_string();
        let cluster_id = &self.platform.cluster_id;
        let client = self.platform.deployments.client(deployment)?;
        let context = format!("cluster_id claim in deployment {deployment}");
        let claims = self.claims(client, &context).await?;
        match judge(&claims, &uid) {
            Verdict::Unclaimed => {
                let project = match self.platform.config.neutron_defaults.project.as_deref() {
                    None | Some("") => None,
                    Some(p) => Some(self.platform.project_in(deployment, p).await?),
                };
                let req = SecurityGroupCreate {
                    name: group_name(cluster_id),
                    project_id: project,
                    description: Some(format!("{DESCRIPTION_PREFIX}{uid}")),
                    ..Default::default()
                };
                let sg = client
                    .create_security_group(&req)
                    .await
                    .map_err(|e| Error::openstack(format!("{context}: creating the claim"), e))?;
                // Tags cannot be given in a security group's POST; a failure here is mended by
                // the next check.
                client
                    .replace_tags(Taggable::SecurityGroup, &sg.id, &self.platform.resource_tags())
                    .await
                    .map_err(|e| Error::openstack(format!("{context}: tagging the claim"), e))?;
                tracing::info!(%deployment, cluster_id, group = %sg.id, "claimed cluster_id; confirming at the next check");
                Ok(Outcome::Unconfirmed)
            }
            Verdict::Held {
                own,
                duplicates,
                contested,
            } => {
                for id in duplicates {
                    delete_ignoring_gone(client, &id)
                        .await
                        .map_err(|e| Error::openstack(format!("{context}: deleting a duplicate claim"), e))?;
                }
                if !own.tagged {
                    client
                        .replace_tags(
                            Taggable::SecurityGroup,
                            &own.group,
                            &self.platform.resource_tags(),
                        )
                        .await
                        .map_err(|e| Error::openstack(format!("{context}: tagging the claim"), e))?;
                }
                Ok(self.contest(deployment, &own, &contested, &uid))
            }
            Verdict::Taken { holder, own } => {
                for id in own {
                    delete_ignoring_gone(client, &id).await.map_err(|e| {
                        Error::openstack(format!("{context}: deleting this cluster's later claim"), e)
                    })?;
                }
                Ok(Outcome::Taken(Error::Config(format!(
                    "[kubernetes] cluster_id {cluster_id:?} is claimed in OpenStack deployment {deployment:?} \
                     by another Kubernetes cluster (security group {} named {:?}, {}; this cluster's \
                     kube-system uid is {uid}): both clusters' resources would carry the same tags and each \
                     controller would sweep the other's as orphans. Give this cluster its own cluster_id; if \
                     the other cluster is gone for good, delete that security group and this cluster adopts \
                     (and sweeps) what it left.",
                    holder.group,
                    group_name(cluster_id),
                    describe(&holder)
                ))))
            }
        }
    }

    /// Held, unless another cluster's later claim has stayed past [`CONTEST_GRACE`] (or is
    /// still within it: then not confirmed yet either).
    fn contest(&self, deployment: &str, own: &Claim, contested: &[Claim], uid: &str) -> Outcome {
        let now = Instant::now();
        let mut seen = self.contested.locked();
        seen.retain(|(d, g), _| d != deployment || contested.iter().any(|c| &c.group == g));
        let Some(oldest) = contested
            .iter()
            .map(|c| {
                let first = *seen
                    .entry((deployment.to_string(), c.group.clone()))
                    .or_insert(now);
                (first, c)
            })
            .min_by_key(|(first, _)| *first)
        else {
            return Outcome::Held;
        };
        if now.duration_since(oldest.0) < CONTEST_GRACE {
            return Outcome::Unconfirmed;
        }
        let other = oldest.1;
        Outcome::Contested(Error::Config(format!(
            "[kubernetes] cluster_id {:?} is claimed in OpenStack deployment {deployment:?} by this cluster \
             (security group {}, kube-system uid {uid}) and later by another (security group {} in project {}, {}), \
             which keeps its claim: its credentials cannot see this one (another project's scope). Until one \
             of the two clusters gets another cluster_id and its claim is deleted, neither may sweep here; this \
             controller does not.",
            self.platform.cluster_id,
            own.group,
            other.group,
            other.project_id,
            describe(other)
        )))
    }

    /// Deletes this cluster's claims in every deployment (it is refused somewhere: a claim it
    /// keeps elsewhere would later refuse the cluster that holds the id there). Best effort.
    pub async fn withdraw(&self) {
        let Ok(uid) = self.uid().await.map(str::to_string) else {
            return;
        };
        for deployment in self.platform.deployments.names() {
            let Ok(client) = self.platform.deployments.client(deployment) else {
                continue;
            };
            let claims = match self.claims(client, "withdrawing the cluster_id claim").await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%deployment, error = %e, "cannot withdraw the cluster_id claim");
                    continue;
                }
            };
            for c in claims.iter().filter(|c| c.uid.as_deref() == Some(uid.as_str())) {
                match delete_ignoring_gone(client, &c.group).await {
                    Ok(()) => {
                        tracing::info!(%deployment, group = %c.group, "withdrew this cluster's cluster_id claim")
                    }
                    Err(e) => {
                        tracing::warn!(%deployment, group = %c.group, error = %e, "cannot withdraw the cluster_id claim")
                    }
                }
            }
            self.platform.deployments.set_claimed(deployment, false);
        }
    }

    /// Re-checks every deployment every [`RECHECK_PERIOD`] while leading; one not confirmed
    /// sooner (from 2 s, doubling up to [`UNCONFIRMED_RETRY_MAX`], or to the period once only
    /// contested ones are left). A claim found taken is withdrawn everywhere and sent to
    /// `fatal`, and the task ends.
    pub async fn run(
        self: Arc<Self>,
        all_held: bool,
        fatal: tokio::sync::mpsc::Sender<Error>,
        stop: CancellationToken,
    ) {
        let mut retry = FIRST_RETRY;
        let mut wait = if all_held { RECHECK_PERIOD } else { retry };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let checked = tokio::select! {
                _ = stop.cancelled() => return,
                c = self.check_all() => c,
            };
            match checked {
                Ok(true) => (wait, retry) = (RECHECK_PERIOD, FIRST_RETRY),
                // Handlers wait for a claim to adopt what they find by tag (`adoptable`): a
                // deployment not checked or not confirmed yet is retried within seconds, one
                // only contested (sweeps stopped, adoption going on) at the period.
                Ok(false) => {
                    (wait, retry) = after_unconfirmed(retry, self.platform.deployments.all_adoptable());
                }
                Err(taken) => {
                    self.withdraw().await;
                    let _ = fatal.send(taken).await;
                    return;
                }
            }
        }
    }
}

/// The wait before the next check, and the retry after that one, after a check that left a
/// claim unconfirmed: doubling, up to [`UNCONFIRMED_RETRY_MAX`] while a deployment is not
/// adoptable, up to [`RECHECK_PERIOD`] once all are (contested ones left).
fn after_unconfirmed(retry: Duration, all_adoptable: bool) -> (Duration, Duration) {
    let cap = if all_adoptable {
        RECHECK_PERIOD
    } else {
        UNCONFIRMED_RETRY_MAX
    };
    (retry.min(cap), (retry * 2).min(cap))
}

fn describe(c: &Claim) -> String {
    c.uid.as_ref().map_or_else(
        || "an unreadable description".to_string(),
        |u| format!("kube-system uid {u}"),
    )
}

async fn delete_ignoring_gone(client: &NeutronClient, id: &str) -> Result<(), kuryr_neutron::Error> {
    match client.delete_security_group(id).await {
        Err(e) if e.is_not_found() => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unconfirmed_claim_is_checked_again_within_seconds_a_contested_one_at_the_period() {
        let mut retry = FIRST_RETRY;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let (wait, next) = after_unconfirmed(retry, false);
            waits.push(wait.as_secs());
            retry = next;
        }
        assert_eq!(
            waits,
            [2, 4, 8, 16, 30, 30, 30, 30],
            "not adoptable: handlers wait"
        );
        let (wait, next) = after_unconfirmed(retry, true);
        assert_eq!((wait.as_secs(), next.as_secs()), (30, 60));
        let (wait, _) = after_unconfirmed(Duration::from_secs(600), true);
        assert_eq!(wait, RECHECK_PERIOD);
    }

    fn claim(group: &str, uid: Option<&str>, at: &str) -> Claim {
        Claim {
            group: group.into(),
            project_id: "p".into(),
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
                duplicates: vec!["a".into()],
                contested: vec![later_other.clone()],
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
    fn a_copy_in_another_project_is_another_scope_s_to_keep() {
        let mine = claim("a", Some("me"), "2026-11-30T04:00:00Z");
        let mut scoped = claim("b", Some("me"), "2026-11-30T04:00:03Z");
        scoped.project_id = "q".into();
        assert_eq!(
            judge(&[scoped, mine.clone()], "me"),
            Verdict::Held {
                own: mine,
                duplicates: vec![],
                contested: vec![],
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
