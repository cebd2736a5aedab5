//! Placement: which OpenStack deployment serves a tenant (Neutron project). This is the "dynamic
//! binding of tenants to deployments" of [docs/placement.md](../../../../docs/placement.md); it is
//! called placement here so that it is never confused with plugging an interface (the daemon's
//! `binding/`) or with a Neutron port's host binding.
//!
//! A binding is kept per (project, group): the group is what a namespace asks for (availability
//! zone and resource affinity), so one tenant can be bound to a general-purpose deployment and to a
//! "CAD modeling" one at once, and two namespaces asking for different groups never move each
//! other's binding. Deciding is pure ([`scheduler::decide`]); acting (claims in the store, Events,
//! the usage figures) is the [`Binder`]'s.
//!
//! - [`filters`]: run in configured order; each says why it removed a candidate
//! - [`weighers`]: raw values min-max normalised to 0..1 over the candidates, score = sum of
//!   multiplier x normalised value (multipliers may be negative), pick among the best
//!   `subset_size`, and the pick is "virtually consumed" until the next measurement
//! - [`store`]: bindings with bounded history, claimed with preconditions; [`kube_store`] keeps
//!   them as `KuryrProjectBinding` objects
//! - [`candidates`]: the deployments from `kuryr.conf` and the `KuryrOpenStackDeployment` objects
//! - [`usage`]: per-deployment usage measured off the request path, in parallel, with a timeout

pub mod candidates;
pub mod filters;
pub mod kube_store;
pub mod record;
pub mod retire;
pub mod scheduler;
pub mod store;
pub mod usage;
pub mod watch;
pub mod weighers;

use std::collections::BTreeMap;
use std::fmt;

pub use scheduler::{Binder, Decision, Placed, Scheduler};

/// How full a deployment is, as the scheduler may use it.
#[derive(Clone, Debug, PartialEq)]
pub enum UsageFigure {
    /// Never measured: treated as plenty left (a new deployment is usable at once).
    Unmeasured,
    /// A recent measurement (fraction 0..1 of what runs out first).
    Fresh(f64),
    /// The last measurement failed or is too old; `last` is the last good fraction, if any. A
    /// stale deployment keeps the bindings it has (a measurement outage never moves tenants) but
    /// gets no new ones (nobody can tell whether it has room).
    Stale { last: Option<f64>, why: String },
}

impl UsageFigure {
    pub fn fraction(&self) -> Option<f64> {
        match self {
            UsageFigure::Unmeasured => None,
            UsageFigure::Fresh(f) => Some(*f),
            UsageFigure::Stale { last, .. } => *last,
        }
    }
}

/// One deployment as the scheduler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub name: String,
    /// Lower first: the `creation_order` weigher of docs/placement.md (declaration order or the
    /// operator's weight).
    pub order: i64,
    pub availability_zone: Option<String>,
    pub resource_affinity: BTreeMap<String, String>,
    /// Under maintenance: no new bindings; existing ones move only if `move_existing`.
    pub maintenance: bool,
    pub move_existing: bool,
    /// Fraction at which existing bindings leave this deployment.
    pub threshold: f64,
    /// New bindings need `usage < threshold - hysteresis`, so a deployment a binding just left is
    /// not picked again right away.
    pub hysteresis: f64,
    /// As measured: only a measured figure moves existing bindings.
    pub usage: UsageFigure,
    /// Usage added by the bindings this controller made since `usage` was measured (each
    /// counts a little): new bindings see it, so a burst does not land entirely on the one
    /// deployment that had room for a few; existing bindings never leave for it.
    pub pending: f64,
    /// Port quota fraction per (cluster) project id: a project whose quota is nearly used up here
    /// is full here, whatever the deployment-wide figure says.
    pub project_usage: ProjectUsage,
    /// Project id in this deployment's Keystone for a cluster-level project id; absent = same id.
    pub project_ids: BTreeMap<String, String>,
}

/// The port quota fractions of the projects a deployment's usage round measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProjectUsage {
    pub fractions: BTreeMap<String, f64>,
    /// Carried over from an earlier round (the last one could not list the bindings, so read no
    /// quota): such a fraction still keeps new bindings out, as a stale figure does, but never
    /// moves a bound project - only a measured figure does.
    pub carried: bool,
}

impl Candidate {
    /// The figure a bound project leaves on: the fuller of the deployment's and its port quota,
    /// as measured.
    pub fn usage_for(&self, project: &str) -> UsageFigure {
        if self.project_usage.carried {
            return self.usage.clone();
        }
        self.with_quota(project)
    }

    fn with_quota(&self, project: &str) -> UsageFigure {
        match (&self.usage, self.project_usage.fractions.get(project)) {
            (UsageFigure::Fresh(u), Some(p)) => UsageFigure::Fresh(u.max(*p)),
            (other, _) => other.clone(),
        }
    }

    /// The figure a new binding is admitted (and weighed) on: the fuller of the deployment's
    /// and its port quota (also one carried over), with what this controller bound here since
    /// it was measured.
    pub fn admission_usage_for(&self, project: &str) -> UsageFigure {
        self.with_pending(self.with_quota(project))
    }

    /// The deployment-wide figure new bindings are weighed on ([`Self::admission_usage_for`]).
    pub fn admission_usage(&self) -> UsageFigure {
        self.with_pending(self.usage.clone())
    }

    fn with_pending(&self, figure: UsageFigure) -> UsageFigure {
        match figure {
            UsageFigure::Fresh(u) => UsageFigure::Fresh(u + self.pending),
            other => other,
        }
    }

    /// `project`'s id in this deployment.
    pub fn project_id<'a>(&'a self, project: &'a str) -> &'a str {
        self.project_ids.get(project).map_or(project, String::as_str)
    }
}

/// What a namespace asks for: a binding is kept per (project, group).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Group {
    pub availability_zone: Option<String>,
    pub resource_affinity: BTreeMap<String, String>,
}

impl Group {
    /// Canonical text form: `az=<zone>` then the affinity pairs in key order, comma separated;
    /// empty for "general" (no zone, no affinity).
    pub fn id(&self) -> String {
        let mut parts = Vec::new();
        if let Some(z) = &self.availability_zone {
            parts.push(format!("az={z}"));
        }
        parts.extend(self.resource_affinity.iter().map(|(k, v)| format!("{k}={v}")));
        parts.join(",")
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.id();
        f.write_str(if id.is_empty() { "general" } else { &id })
    }
}

/// The key of one binding.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BindingKey {
    pub project: String,
    pub group: Group,
}

impl fmt::Display for BindingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.project, self.group)
    }
}

/// What a project asks for (from its namespace's annotations).
pub type BindingRequest = BindingKey;

/// Namespace annotation asking for an availability zone.
pub const AZ_ANNOTATION: &str = "openstack.org/kuryr-availability-zone";
/// Namespace annotation asking for `key=value[,key=value]` resource affinity.
pub const AFFINITY_ANNOTATION: &str = "openstack.org/kuryr-resource-affinity";

/// Parses [`AZ_ANNOTATION`]: a zone name as Nova and Neutron accept it (1-255 printable
/// characters, no `:` or `,`, no blanks around). An empty or malformed value is refused naming the
/// annotation, never read as "no zone".
pub fn parse_zone(raw: &str) -> Result<String, crate::error::Error> {
    let bad = |why: &str| {
        crate::error::Error::invalid(
            AZ_ANNOTATION,
            format!("{:?} {why}", raw.chars().take(64).collect::<String>()),
        )
    };
    if raw.is_empty() {
        return Err(bad("is empty (remove the annotation to ask for no zone)"));
    }
    if raw.len() > 255 {
        return Err(bad("is longer than 255 characters"));
    }
    if raw.trim() != raw {
        return Err(bad("has blanks around it"));
    }
    if raw.chars().any(|c| c.is_control() || c == ':' || c == ',') {
        return Err(bad("has a control character, ':' or ','"));
    }
    Ok(raw.to_string())
}

/// Parses [`AFFINITY_ANNOTATION`]: `key=value` entries separated by commas, blanks around them
/// ignored. An entry without `=` or with an empty key is refused naming the annotation and the
/// entry, rather than silently asking for less affinity than the user wrote.
pub fn parse_affinity(raw: &str) -> Result<BTreeMap<String, String>, crate::error::Error> {
    let mut out = BTreeMap::new();
    for (i, entry) in raw.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        match entry.split_once('=') {
            // The value is what a binding object records: the schema's rule (non-empty, no `=`).
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() && !v.contains('=') => {
                let k = k.trim().to_string();
                let v = v.trim().to_string();
                if let Some(prev) = out.get(&k)
                    && prev != &v
                {
                    return Err(crate::error::Error::invalid(
                        format!("{AFFINITY_ANNOTATION}[{i}]"),
                        format!("key {k:?} is given twice with different values"),
                    ));
                }
                out.insert(k, v);
            }
            _ => {
                return Err(crate::error::Error::invalid(
                    format!("{AFFINITY_ANNOTATION}[{i}]"),
                    format!(
                        "{:?} is not key=value (a non-empty value without '=')",
                        entry.chars().take(64).collect::<String>()
                    ),
                ));
            }
        }
    }
    if out.is_empty() && !raw.trim().is_empty() {
        return Err(crate::error::Error::invalid(
            AFFINITY_ANNOTATION,
            "has no key=value entry",
        ));
    }
    Ok(out)
}

/// The group a namespace asks for, from its annotations.
pub fn group_of(annotations: &BTreeMap<String, String>) -> Result<Group, crate::error::Error> {
    Ok(Group {
        availability_zone: annotations
            .get(AZ_ANNOTATION)
            .map(|z| parse_zone(z))
            .transpose()?,
        resource_affinity: annotations
            .get(AFFINITY_ANNOTATION)
            .map(|a| parse_affinity(a))
            .transpose()?
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_id_is_canonical_and_general_is_empty() {
        let a = Group {
            availability_zone: Some("az1".into()),
            resource_affinity: BTreeMap::from([("z".into(), "1".into()), ("a".into(), "2".into())]),
        };
        assert_eq!(a.id(), "az=az1,a=2,z=1");
        assert_eq!(Group::default().id(), "");
        assert_eq!(Group::default().to_string(), "general");
    }

    #[test]
    fn malformed_zone_and_affinity_name_the_annotation() {
        for bad in ["", " az1", "a:b", "a,b", "x\u{7}"] {
            let e = parse_zone(bad).expect_err(bad).to_string();
            assert!(e.contains(AZ_ANNOTATION), "{e}");
        }
        assert_eq!(parse_zone("nova").ok().as_deref(), Some("nova"));
        for bad in [",", "resource", "=x", "a=1,a=2", "a=", "a=b=c"] {
            let e = parse_affinity(bad).expect_err(bad).to_string();
            assert!(e.contains(AFFINITY_ANNOTATION), "{bad}: {e}");
        }
        let ann = BTreeMap::from([(AFFINITY_ANNOTATION.to_string(), "resource = cad ,".to_string())]);
        assert_eq!(
            group_of(&ann).ok().map(|g| g.id()).as_deref(),
            Some("resource=cad")
        );
    }
}
