//! Binding weighers, Nova style: raw values are min-max normalised over the candidates to 0..1,
//! multiplied, and summed.

use std::collections::BTreeMap;

use kuryr_config::BindingWeigher;

use super::Candidate;

pub trait Weigher: Send + Sync {
    fn name(&self) -> &'static str;
    /// Raw value; higher is better before the multiplier.
    fn raw(&self, c: &Candidate) -> f64;
}

/// `creation_order`: lower `order` first (declaration order, or the operator's weight).
pub struct CreationOrder;
impl Weigher for CreationOrder {
    fn name(&self) -> &'static str {
        "creation_order"
    }
    fn raw(&self, c: &Candidate) -> f64 {
        -(c.order as f64)
    }
}

/// `idle_capacity`: more free capacity first; unmeasured counts as empty.
pub struct IdleCapacity;
impl Weigher for IdleCapacity {
    fn name(&self) -> &'static str {
        "idle_capacity"
    }
    fn raw(&self, c: &Candidate) -> f64 {
        1.0 - c.admission_usage().fraction().unwrap_or(0.0)
    }
}

pub fn build(
    names: &[BindingWeigher],
    multipliers: &BTreeMap<BindingWeigher, f64>,
) -> Vec<(Box<dyn Weigher>, f64)> {
    names
        .iter()
        .map(|n| -> (Box<dyn Weigher>, f64) {
            let w: Box<dyn Weigher> = match n {
                BindingWeigher::CreationOrder => Box::new(CreationOrder),
                BindingWeigher::IdleCapacity => Box::new(IdleCapacity),
            };
            (w, multipliers.get(n).copied().unwrap_or(1.0))
        })
        .collect()
}

/// Scores of `cands` (same order). Every weigher contributes; a weigher whose values are all
/// equal contributes 0 to everyone (nothing to tell them apart).
pub fn scores(weighers: &[(Box<dyn Weigher>, f64)], cands: &[&Candidate]) -> Vec<f64> {
    let mut total = vec![0.0; cands.len()];
    for (w, mult) in weighers {
        let raw: Vec<f64> = cands.iter().map(|c| w.raw(c)).collect();
        let (lo, hi) = raw
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        let span = hi - lo;
        for (t, v) in total.iter_mut().zip(&raw) {
            let norm = if span > 0.0 { (v - lo) / span } else { 0.0 };
            *t += mult * norm;
        }
    }
    total
}
