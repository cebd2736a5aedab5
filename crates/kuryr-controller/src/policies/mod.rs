//! NetworkPolicy as Neutron security groups: the pure model (no servers).
//!
//! - [`spec`]: a NetworkPolicy validated into the model's terms; bad content names its field
//! - [`selector`]: label selectors (`matchLabels`, `matchExpressions`)
//! - [`index`]: what the model reads about the cluster (namespaces, pods, Services)
//! - [`cidr`]: IP prefixes and the exact `ipBlock.except` difference
//! - [`desired`]: policy + index -> security groups, rules and address groups; which groups a
//!   pod gets
//! - [`diff`]: desired vs actual -> the fewest Neutron operations, in a safe order
//! - [`tracker`]: the index and policies fed by watches; which policies a change affects
//!
//! Deciding lives here; acting (Neutron calls, KuryrNetworkPolicy status) is the handlers' job.
//! Design notes: docs/network-policy.md.

pub mod cidr;
pub mod desired;
pub mod diff;
pub mod index;
pub mod selector;
pub mod spec;
#[cfg(test)]
mod tests;
pub mod tracker;

pub use cidr::Cidr;
pub use desired::{
    AgKey, DesiredPolicy, Direction, EtherType, Options, PodSecurity, Remote, Rule, desired, pod_security,
};
pub use diff::{ActualGroup, ActualPolicy, Op, diff};
pub use index::{ClusterIndex, PodInfo, PodKey, ServiceInfo};
pub use selector::{Labels, Selector};
pub use spec::{PolicyError, PolicyKey, PolicySpec, Protocol};
pub use tracker::PolicyTracker;

/// FNV-1a: a hash that is the same in every build and process, for names stored in Neutron.
pub fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
