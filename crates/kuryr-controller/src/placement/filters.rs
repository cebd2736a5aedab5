//! Binding filters: each keeps the candidates that may serve a request.

use kuryr_config::BindingFilter;

use super::{BindingRequest, Candidate};

pub trait Filter: Send + Sync {
    fn name(&self) -> &'static str;
    fn passes(&self, c: &Candidate, req: &BindingRequest) -> bool;
}

/// `all`: every deployment not under maintenance.
pub struct AllFilter;
impl Filter for AllFilter {
    fn name(&self) -> &'static str {
        "all"
    }
    fn passes(&self, c: &Candidate, _: &BindingRequest) -> bool {
        c.enabled
    }
}

/// `availability_zone`: the requested zone, when one is requested.
pub struct AvailabilityZoneFilter;
impl Filter for AvailabilityZoneFilter {
    fn name(&self) -> &'static str {
        "availability_zone"
    }
    fn passes(&self, c: &Candidate, req: &BindingRequest) -> bool {
        req.availability_zone
            .as_ref()
            .is_none_or(|az| c.availability_zone.as_ref() == Some(az))
    }
}

/// `resource_affinity`: every requested key=value (Trio2o's PodAffinityTag semantics).
pub struct ResourceAffinityFilter;
impl Filter for ResourceAffinityFilter {
    fn name(&self) -> &'static str {
        "resource_affinity"
    }
    fn passes(&self, c: &Candidate, req: &BindingRequest) -> bool {
        req.resource_affinity
            .iter()
            .all(|(k, v)| c.resource_affinity.get(k) == Some(v))
    }
}

/// `usage_threshold`: drops deployments above the threshold; unmeasured ones pass.
pub struct UsageThresholdFilter(pub f64);
impl Filter for UsageThresholdFilter {
    fn name(&self) -> &'static str {
        "usage_threshold"
    }
    fn passes(&self, c: &Candidate, _: &BindingRequest) -> bool {
        c.usage.is_none_or(|u| u < self.0)
    }
}

pub fn build(names: &[BindingFilter], usage_threshold: f64) -> Vec<Box<dyn Filter>> {
    let mut out: Vec<Box<dyn Filter>> = names
        .iter()
        .map(|n| -> Box<dyn Filter> {
            match n {
                BindingFilter::All => Box::new(AllFilter),
                BindingFilter::AvailabilityZone => Box::new(AvailabilityZoneFilter),
                BindingFilter::ResourceAffinity => Box::new(ResourceAffinityFilter),
                BindingFilter::UsageThreshold => Box::new(UsageThresholdFilter(usage_threshold)),
            }
        })
        .collect();
    // Maintenance is never optional: a disabled deployment gets no new bindings.
    if !names.contains(&BindingFilter::All) {
        out.insert(0, Box::new(AllFilter));
    }
    out
}

/// Runs the filters in order; logs how many candidates each removed.
pub fn apply<'a>(
    filters: &[Box<dyn Filter>],
    cands: Vec<&'a Candidate>,
    req: &BindingRequest,
) -> Vec<&'a Candidate> {
    let mut left = cands;
    for f in filters {
        let before = left.len();
        left.retain(|c| f.passes(c, req));
        tracing::debug!(filter = f.name(), removed = before - left.len(), left = left.len(), project = %req.project, "binding filter");
    }
    left
}
