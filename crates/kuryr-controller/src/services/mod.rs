//! Services on Octavia load balancers.
//!
//! - [`spec`]: a Service (and the resolved project, subnet, security groups) -> KuryrLoadBalancer spec,
//!   or why the Service is not one kuryr serves (headless, ExternalName, the API server's own).
//! - [`endpoints`]: a Service's EndpointSlices -> `spec.endpointSlices` (ready endpoints only).
//! - [`desired`]: a KuryrLoadBalancer spec -> the Octavia tree it asks for (load balancer, one listener and
//!   pool per port, members).
//! - [`recorded`]: the tree as the KuryrLoadBalancer `status` records it.
//! - [`plan`]: recorded vs desired -> the fewest Octavia writes (a new Service is one fully populated
//!   create; an endpoints change one batch member update per pool; nothing when nothing changed).
//! - [`octavia`]: carries a plan out against Octavia and reads back what it made.
//! - [`provisioning`]: the shared, batched waits for load balancers to leave PENDING_*.
//! - [`public_ip`]: the floating IP of a `type: LoadBalancer` Service (what to do, pure; and doing it).
//! - [`reconcile`]: the periodic check of every load balancer against Octavia and the orphan sweep.
//! - the deployment a load balancer lives in is recorded on its KuryrLoadBalancer (`crate::placement::record`).
//!
//! Deciding (the first four, pure and unit-tested) is kept apart from acting (the last two), as in the pod
//! path. The handlers (`service`, `endpoints`, `kuryrloadbalancer`) are in `crate::handlers`.

pub mod acls;
pub mod desired;
pub mod endpoints;
pub mod octavia;
pub mod plan;
pub mod provisioning;
pub mod public_ip;
pub mod reconcile;
pub mod recorded;
pub mod security;
pub mod spec;

/// Octavia name of a Service's load balancer (upstream's, so upstream-made load balancers are found).
pub fn lb_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Tag naming the Service a load balancer serves, so the orphan sweep can tell whose it is without parsing
/// names.
pub fn service_tag(namespace: &str, name: &str) -> String {
    format!("{SERVICE_TAG_PREFIX}{namespace}/{name}")
}

/// Every tag a Service's load balancer carries: the deployment-wide ownership tags (`resource_tags`,
/// managed, cluster) and its [`service_tag`].
pub fn lb_tags(ctx: &crate::context::Context, namespace: &str, name: &str) -> Vec<String> {
    let mut t = ctx.resource_tags();
    t.push(service_tag(namespace, name));
    t
}

/// What every [`service_tag`] starts with.
pub const SERVICE_TAG_PREFIX: &str = "kuryr-rs.service=";
