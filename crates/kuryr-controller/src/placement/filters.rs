//! Binding filters: each keeps the candidates that may serve a new binding and says why it
//! removed the others, so that "no deployment passes" can list what every filter removed.

use kuryr_config::BindingFilter;

use super::{BindingRequest, Candidate, UsageFigure};

pub trait Filter: Send + Sync {
    fn name(&self) -> &'static str;
    /// `Err(why)` removes the candidate.
    fn check(&self, c: &Candidate, req: &BindingRequest) -> Result<(), String>;
}

/// `all`: every deployment not under maintenance.
pub struct AllFilter;
impl Filter for AllFilter {
    fn name(&self) -> &'static str {
        "all"
    }
    fn check(&self, c: &Candidate, _: &BindingRequest) -> Result<(), String> {
        if c.maintenance {
            Err("in maintenance".into())
        } else {
            Ok(())
        }
    }
}

/// `availability_zone`: the requested zone, when one is requested.
pub struct AvailabilityZoneFilter;
impl Filter for AvailabilityZoneFilter {
    fn name(&self) -> &'static str {
        "availability_zone"
    }
    fn check(&self, c: &Candidate, req: &BindingRequest) -> Result<(), String> {
        match &req.group.availability_zone {
            Some(az) if c.availability_zone.as_ref() != Some(az) => Err(format!(
                "zone {} is not {az}",
                c.availability_zone.as_deref().unwrap_or("(none)")
            )),
            _ => Ok(()),
        }
    }
}

/// `resource_affinity`: every requested key=value (Trio2o's PodAffinityTag semantics).
pub struct ResourceAffinityFilter;
impl Filter for ResourceAffinityFilter {
    fn name(&self) -> &'static str {
        "resource_affinity"
    }
    fn check(&self, c: &Candidate, req: &BindingRequest) -> Result<(), String> {
        match req
            .group
            .resource_affinity
            .iter()
            .find(|(k, v)| c.resource_affinity.get(*k) != Some(*v))
        {
            Some((k, v)) => Err(format!("has no {k}={v}")),
            None => Ok(()),
        }
    }
}

/// `usage_threshold`: new bindings only where usage is below the deployment's threshold minus its
/// hysteresis. Unmeasured passes (a new deployment is usable at once); stale does not.
pub struct UsageThresholdFilter;
impl Filter for UsageThresholdFilter {
    fn name(&self) -> &'static str {
        "usage_threshold"
    }
    fn check(&self, c: &Candidate, req: &BindingRequest) -> Result<(), String> {
        match &c.admission_usage_for(&req.project) {
            UsageFigure::Unmeasured => Ok(()),
            UsageFigure::Fresh(u) if *u < c.threshold - c.hysteresis => Ok(()),
            UsageFigure::Fresh(u) => Err(format!(
                "usage {u:.3} is not below threshold {:.3} - hysteresis {:.3}",
                c.threshold, c.hysteresis
            )),
            UsageFigure::Stale { why, .. } => Err(format!("usage figure is stale ({why})")),
        }
    }
}

/// The configured filters in order; `all` (maintenance) always runs first, listed or not, and
/// `availability_zone` and `resource_affinity` always run, after it when not listed: a namespace
/// that asks for a zone or an affinity is never placed where it asked not to be (the default
/// filters are `all` only), and both pass a request that asks for none.
pub fn build(names: &[BindingFilter]) -> Vec<Box<dyn Filter>> {
    let out: Vec<Box<dyn Filter>> = names
        .iter()
        .map(|n| -> Box<dyn Filter> {
            match n {
                BindingFilter::All => Box::new(AllFilter),
                BindingFilter::AvailabilityZone => Box::new(AvailabilityZoneFilter),
                BindingFilter::ResourceAffinity => Box::new(ResourceAffinityFilter),
                BindingFilter::UsageThreshold => Box::new(UsageThresholdFilter),
            }
        })
        .collect();
    let mut first: Vec<Box<dyn Filter>> = Vec::new();
    if !names.contains(&BindingFilter::All) {
        first.push(Box::new(AllFilter));
    }
    if !names.contains(&BindingFilter::AvailabilityZone) {
        first.push(Box::new(AvailabilityZoneFilter));
    }
    if !names.contains(&BindingFilter::ResourceAffinity) {
        first.push(Box::new(ResourceAffinityFilter));
    }
    first.extend(out);
    first
}

/// What one filter removed: (deployment, why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Elimination {
    pub filter: &'static str,
    pub removed: Vec<(String, String)>,
}

impl std::fmt::Display for Elimination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} removed ", self.filter)?;
        if self.removed.is_empty() {
            return f.write_str("none");
        }
        let list: Vec<String> = self
            .removed
            .iter()
            .map(|(n, why)| format!("{n} ({why})"))
            .collect();
        f.write_str(&list.join(", "))
    }
}

/// Runs the filters in order: the candidates left and what each filter removed.
pub fn apply<'a>(
    filters: &[Box<dyn Filter>],
    cands: Vec<&'a Candidate>,
    req: &BindingRequest,
) -> (Vec<&'a Candidate>, Vec<Elimination>) {
    let mut left = cands;
    let mut log = Vec::with_capacity(filters.len());
    for f in filters {
        let mut removed = Vec::new();
        left.retain(|c| match f.check(c, req) {
            Ok(()) => true,
            Err(why) => {
                removed.push((c.name.clone(), why));
                false
            }
        });
        log.push(Elimination {
            filter: f.name(),
            removed,
        });
    }
    (left, log)
}
