//! Resource event handlers, selected by `[kubernetes] enabled_handlers` with upstream's names.
//!
//! - `vif` ([`vif::VifHandler`], Pods): finalizer + KuryrPort per scheduled pod
//! - `kuryrport` ([`kuryrport::KuryrPortHandler`]): VIFs through the drivers into `status.vifs`
//! - `namespace` ([`namespace::NamespaceHandler`]): a KuryrNetwork per namespace holding pods on the pods' network (namespace subnets)
//! - `kuryrnetwork` ([`kuryrnetwork::KuryrNetworkHandler`]): network, subnet, router interface
//! - `service` ([`service::ServiceHandler`]): a KuryrLoadBalancer per served Service
//! - `endpoints` ([`endpoints::EndpointsHandler`], EndpointSlices): its `spec.endpointSlices`
//! - `kuryrloadbalancer` ([`kuryrloadbalancer::KuryrLoadBalancerHandler`]): the Octavia load balancer
//! - `policy` ([`policy::PolicyHandler`]): NetworkPolicy -> KuryrNetworkPolicy
//! - `kuryrnetworkpolicy` ([`kuryrnetworkpolicy::KuryrNetworkPolicyHandler`]): security groups,
//!   rules, address groups, status, ports
//! - `pod_label` ([`pod_label::PodLabelHandler`], with the namespace-, Service- and EndpointSlice-label
//!   companions): membership
//!
//! A library user adds a handler with [`HandlerRegistry::register`]; the pipeline is unchanged.

pub mod endpoints;
pub mod kuryrloadbalancer;
pub mod kuryrnetwork;
pub mod kuryrnetworkpolicy;
pub mod kuryrport;
pub mod namespace;
pub mod pod_label;
pub mod policy;
pub mod service;
pub mod vif;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::context::Context;
use crate::error::Error;
use crate::pipeline::RegisteredHandler;

/// Builds a handler from the shared context (which holds the drivers).
pub type HandlerFactory = Box<dyn Fn(&Arc<Context>) -> RegisteredHandler + Send + Sync>;

/// Upstream handler names kuryr-rs does not provide: accepted in `enabled_handlers` so upstream
/// configs load, and skipped with a warning.
pub const NOT_PROVIDED: &[&str] = &["lb", "lbaasspec", "openshift_machine", "kuryrnetwork_population"];

pub struct HandlerRegistry {
    factories: BTreeMap<String, HandlerFactory>,
    /// Handlers of other kinds built together with a name (upstream's `pod_label` also covers
    /// namespace label changes).
    companions: BTreeMap<String, Vec<HandlerFactory>>,
}

impl Default for HandlerRegistry {
    fn default() -> Self {
        Self::with_builtin()
    }
}

impl HandlerRegistry {
    pub fn empty() -> Self {
        Self {
            factories: BTreeMap::new(),
            companions: BTreeMap::new(),
        }
    }

    /// The handlers kuryr-rs ships.
    pub fn with_builtin() -> Self {
        let mut r = Self::empty();
        r.register("vif", |ctx| {
            RegisteredHandler::telling(vif::VifHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("kuryrport", |ctx| {
            RegisteredHandler::telling(kuryrport::KuryrPortHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("namespace", |ctx| {
            RegisteredHandler::telling(namespace::NamespaceHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("kuryrnetwork", |ctx| {
            RegisteredHandler::telling(
                kuryrnetwork::KuryrNetworkHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r.register("service", |ctx| {
            RegisteredHandler::telling(service::ServiceHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("endpoints", |ctx| {
            RegisteredHandler::telling(endpoints::EndpointsHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("kuryrloadbalancer", |ctx| {
            RegisteredHandler::telling(
                kuryrloadbalancer::KuryrLoadBalancerHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r.register("policy", |ctx| {
            RegisteredHandler::telling(policy::PolicyHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register("kuryrnetworkpolicy", |ctx| {
            RegisteredHandler::telling(
                kuryrnetworkpolicy::KuryrNetworkPolicyHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r.register("pod_label", |ctx| {
            RegisteredHandler::telling(pod_label::PodLabelHandler::new(ctx.clone()), ctx.events.clone())
        });
        r.register_companion("pod_label", |ctx| {
            RegisteredHandler::telling(
                pod_label::NamespaceLabelHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r.register_companion("pod_label", |ctx| {
            RegisteredHandler::telling(
                pod_label::ServiceLabelHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r.register_companion("pod_label", |ctx| {
            RegisteredHandler::telling(
                pod_label::EndpointSliceLabelHandler::new(ctx.clone()),
                ctx.events.clone(),
            )
        });
        r
    }

    /// Builds `factory` too whenever `name` is enabled.
    pub fn register_companion(
        &mut self,
        name: &str,
        factory: impl Fn(&Arc<Context>) -> RegisteredHandler + Send + Sync + 'static,
    ) {
        self.companions
            .entry(name.to_string())
            .or_default()
            .push(Box::new(factory));
    }

    pub fn register(
        &mut self,
        name: &str,
        factory: impl Fn(&Arc<Context>) -> RegisteredHandler + Send + Sync + 'static,
    ) {
        self.factories.insert(name.to_string(), Box::new(factory));
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Instantiates the enabled handlers. An unknown name stops start-up with the valid ones listed.
    pub fn build(&self, enabled: &[String], ctx: &Arc<Context>) -> Result<Vec<RegisteredHandler>, Error> {
        let mut out = vec![];
        for name in enabled {
            if let Some(f) = self.factories.get(name) {
                out.push(f(ctx));
                out.extend(self.companions.get(name).into_iter().flatten().map(|c| c(ctx)));
            } else if NOT_PROVIDED.contains(&name.as_str()) {
                tracing::warn!(handler = %name, "upstream handler not provided by kuryr-rs; skipped");
            } else {
                let valid: Vec<&str> = self.names().collect();
                return Err(Error::Config(format!(
                    "[kubernetes] enabled_handlers: unknown handler {name:?}; valid handlers: {}",
                    valid.join(", ")
                )));
            }
        }
        Ok(out)
    }
}
