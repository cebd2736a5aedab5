//! `service` handler: a Service kuryr serves (ClusterIP or LoadBalancer, not headless) gets a finalizer and a
//! KuryrLoadBalancer of the same name whose spec carries the VIP, ports, subnet, project, security groups and
//! provider; the `kuryrloadbalancer` handler makes it real in Octavia.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrLoadBalancer, KuryrLoadBalancerSpec};
use serde_json::Value;

use crate::context::Context;
use crate::drivers::security_groups::{NamespaceSecurityGroups, SecurityGroupsDriver};
use crate::error::{Error, is_not_found};
use crate::k8s::{add_finalizer, publish_event, remove_finalizer, surface_user_error};
use crate::pipeline::ResourceEventHandler;
use crate::services::endpoints::{SERVICE_NAME_LABEL, from_slices};
use crate::services::placement::{self, recorded_deployment};
use crate::services::spec::{self, Resolved};

/// What the `service` handler cannot run without: checked before the controller starts, so a
/// missing option stops start-up naming it instead of failing every Service at ERROR. A deployment
/// without a `service_subnet` of its own is only an error for the Services placed there (a Warning
/// Event naming the option): it may serve pods only.
pub fn check_config(config: &kuryr_config::KuryrConfig) -> Result<(), Error> {
    let (with, without): (Vec<_>, Vec<_>) = config
        .deployments()
        .into_iter()
        .map(|(name, _)| (name, config.service_options(name)))
        .partition(|(_, o)| o.service_subnet.is_some());
    if with.is_empty() {
        return Err(Error::Config(
            "[neutron_defaults] service_subnet (or service_subnet in a [deployment:<name>] section) is \
             required by the service handler ([kubernetes] enabled_handlers names it): every Service's VIP \
             is an address on that subnet"
                .into(),
        ));
    }
    for (name, o) in without {
        tracing::warn!(
            deployment = name,
            "[{}] service_subnet is not set: Services placed in deployment {name:?} will not be served",
            o.section
        );
    }
    Ok(())
}

pub struct ServiceHandler {
    ctx: Arc<Context>,
    /// What each Service (by uid) was last warned about, so that a Warning Event is published when the
    /// Service starts asking for something Octavia cannot do, not on every event.
    warned: Mutex<HashMap<String, Vec<spec::Unhonoured>>>,
    /// `service_security_groups_driver = namespace` (finds, or makes, each namespace's group).
    namespace_groups: NamespaceSecurityGroups,
}

impl ServiceHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            namespace_groups: NamespaceSecurityGroups::new(
                ctx.deployments.clone(),
                ctx.config.clone(),
                ctx.resource_tags(),
            ),
            ctx,
            warned: Mutex::default(),
        }
    }

    /// `[kubernetes] service_security_groups_driver` (upstream's, default `default`): the groups a Service's
    /// load balancer records. `default`: `[neutron_defaults] pod_security_groups`; `namespace`: those plus
    /// the namespace's isolation group; `policy`: the groups of the network policies selecting the Service's
    /// backends (the defaults without a selector or without selected pods).
    async fn service_groups(
        &self,
        svc: &Service,
        deployment: &str,
        project_id: &str,
        ns: &str,
    ) -> Result<Vec<String>, Error> {
        use kuryr_config::SecurityGroupsDriver as Driver;
        match self.ctx.config.kubernetes.service_security_groups_driver {
            Driver::Default => Ok(self
                .ctx
                .config
                .deployment_defaults(deployment)
                .pod_security_groups),
            Driver::Namespace => {
                self.namespace_groups
                    .security_groups(deployment, project_id, ns)
                    .await
            }
            Driver::Policy => {
                let selector: BTreeMap<String, String> = svc
                    .spec
                    .as_ref()
                    .and_then(|s| s.selector.clone())
                    .unwrap_or_default();
                self.ctx
                    .drivers
                    .network_policy
                    .service_groups(deployment, ns, &selector)
                    .await
            }
        }
    }

    /// A Warning Event for each traffic policy of `svc` its load balancer cannot honour (once per change).
    async fn warn_unhonoured(&self, svc: &Service, provider: Option<&str>) {
        let now = spec::unhonoured(svc, provider);
        let uid = svc.uid().unwrap_or_default();
        let fresh: Vec<spec::Unhonoured> = {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            let before = warned.get(&uid).cloned().unwrap_or_default();
            let fresh = now.iter().filter(|u| !before.contains(u)).cloned().collect();
            if now.is_empty() {
                warned.remove(&uid);
            } else {
                warned.insert(uid, now);
            }
            fresh
        };
        for u in fresh {
            tracing::warn!(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any()), reason = u.reason, "{}", u.message);
            publish_event(&self.ctx.events, svc, true, u.reason, &u.message).await;
        }
    }

    /// The Octavia provider of `deployment` (its `octavia_provider`, else `[kubernetes]
    /// endpoints_driver_octavia_provider`): `default` is upstream's `amphora`.
    fn provider(&self, deployment: &str) -> Option<String> {
        match self
            .ctx
            .config
            .service_options(deployment)
            .octavia_provider
            .as_str()
        {
            "" => None,
            "default" => Some("amphora".to_string()),
            p => Some(p.to_string()),
        }
    }

    /// Where a new Service's load balancer goes: with its namespace's pods, since its members must be
    /// reachable from it. That is the namespace's own network when the subnets driver gives it one,
    /// else the project's binding for the namespace's group. There is no fallback: a project no
    /// deployment can take (every one in maintenance, say) gets the scheduler's error, a Warning Event
    /// on the Service, and the handler retries.
    async fn place(&self, ns: &str, project: &str) -> Result<String, Error> {
        match self.ctx.drivers.subnets.deployment_of_namespace(ns).await {
            Ok(Some(deployment)) => Ok(deployment),
            Ok(None) => Ok(self.ctx.bind(project, ns).await?.deployment),
            Err(not_placed) if not_placed.is_retryable() => {
                // The namespace's network is not placed yet (it follows the same binding): binding
                // here tells whether it can be, so that "no deployment passes" reaches the Service too.
                self.ctx.bind(project, ns).await?;
                Err(not_placed)
            }
            Err(e) => Err(e),
        }
    }

    /// The KuryrLoadBalancer spec's OpenStack part in `deployment`: the project's id there, the VIP
    /// subnet of that deployment and the groups.
    async fn resolve(
        &self,
        svc: &Service,
        ip: IpAddr,
        deployment: &str,
        project: &str,
    ) -> Result<Resolved, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let project_id = self.ctx.project_in(deployment, project).await;
        let options = self.ctx.config.service_options(deployment);
        let subnet_id = options.service_subnet.clone().ok_or_else(|| {
            Error::invalid(
                format!("[{}] service_subnet", options.section),
                format!(
                    "not set, and the Service is placed in OpenStack deployment {deployment:?}: its VIP \
                     needs a subnet of that deployment (an id of another cloud's is never used)"
                ),
            )
        })?;
        let info = self
            .ctx
            .drivers
            .subnet_cache
            .network_of_subnet(deployment, &subnet_id)
            .await?;
        let inside = info
            .subnets
            .iter()
            .any(|s| s.cidr.parse::<ipnet::IpNet>().is_ok_and(|net| net.contains(&ip)));
        if !inside {
            return Err(Error::invalid(
                "spec.clusterIP",
                format!(
                    "{ip} is not in [{}] service_subnet {subnet_id} ({}) of deployment {deployment:?}: the VIP \
                     cannot be created",
                    options.section,
                    info.subnets
                        .iter()
                        .map(|s| s.cidr.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let security_groups = self.service_groups(svc, deployment, &project_id, &ns).await?;
        let od = &self.ctx.config.octavia_defaults;
        Ok(Resolved {
            project_id,
            subnet_id,
            security_groups,
            provider: self.provider(deployment),
            timeout_client_data: od.timeout_client_data,
            timeout_member_data: od.timeout_member_data,
        })
    }
}

/// The spec as a merge patch that also clears the optional fields the new spec no longer has.
fn spec_patch(spec: &KuryrLoadBalancerSpec) -> Result<Value, Error> {
    let mut v = serde_json::to_value(spec).map_err(|e| Error::serialization("KuryrLoadBalancer spec", e))?;
    if let Some(map) = v.as_object_mut() {
        for key in [
            "ip",
            "lb_ip",
            "project_id",
            "subnet_id",
            "type",
            "provider",
            "timeout_client_data",
            "timeout_member_data",
            "session_affinity",
            "security_groups_ids",
            "ports",
        ] {
            map.entry(key).or_insert(Value::Null);
        }
        // Owned by the endpoints handler.
        map.remove("endpointSlices");
    }
    Ok(serde_json::json!({ "spec": v }))
}

#[async_trait]
impl ResourceEventHandler for ServiceHandler {
    type Object = Service;

    fn name(&self) -> &'static str {
        "service"
    }

    async fn on_present(&self, svc: &Service) -> Result<(), Error> {
        let result = self.present(svc).await;
        surface_user_error(&self.ctx.events, &svc.object_ref(&()), result).await
    }

    async fn on_finalize(&self, svc: &Service) -> Result<(), Error> {
        self.warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&svc.uid().unwrap_or_default());
        let ns = svc.namespace().unwrap_or_default();
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        // The KuryrLoadBalancer's own finalizer releases the load balancer and then this Service's.
        match api.delete(&svc.name_any(), &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => remove_finalizer(&self.ctx.kube, svc, finalizers::SERVICE).await,
            Err(e) => Err(e.into()),
        }
    }
}

impl ServiceHandler {
    async fn present(&self, svc: &Service) -> Result<(), Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        if let Some(skip) = spec::skip_reason(svc) {
            tracing::debug!(service = %format!("{ns}/{name}"), ?skip, "service skipped");
            return Ok(());
        }
        let ip = spec::cluster_ip(
            svc.spec
                .as_ref()
                .and_then(|s| s.cluster_ip.as_deref())
                .unwrap_or_default(),
        )?;
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let existing = api.get_opt(&name).await?;
        let project = self.ctx.drivers.project.project_for_namespace(&ns).await?;
        // Placed once: an existing load balancer stays in its deployment, whatever the binding is now.
        let deployment = match &existing {
            Some(klb) => recorded_deployment(klb),
            None => self.place(&ns, &project).await?,
        };
        if existing.is_some() && self.ctx.deployments.client(&deployment).is_err() {
            // Its deployment left kuryr.conf: the kuryrloadbalancer handler drains it and says so.
            return Ok(());
        }
        let resolved = self.resolve(svc, ip, &deployment, &project).await?;
        let wanted = spec::build(svc, &resolved)?;
        self.warn_unhonoured(svc, resolved.provider.as_deref()).await;
        let svc = add_finalizer(&self.ctx.kube, svc, finalizers::SERVICE).await?;
        match existing {
            Some(klb) if klb.metadata.deletion_timestamp.is_some() => Err(Error::not_ready(format!(
                "KuryrLoadBalancer {ns}/{name} is being deleted"
            ))),
            Some(klb) if spec::service_part_differs(&klb.spec, &wanted) => {
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&spec_patch(&wanted)?),
                )
                .await?;
                Ok(())
            }
            Some(_) => Ok(()),
            None => {
                // The slices that exist already go in with the spec, so that a new Service is one fully
                // populated create in Octavia rather than a create and a member update.
                let slices = Api::<EndpointSlice>::namespaced(self.ctx.kube.clone(), &ns)
                    .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
                    .await?;
                let mut wanted = wanted;
                wanted.endpoint_slices = from_slices(&slices.items);
                let klb = KuryrLoadBalancer {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(ns.clone()),
                        annotations: Some(placement::annotations(&deployment)),
                        finalizers: Some(vec![finalizers::KURYRLOADBALANCER.to_string()]),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Service".into(),
                            name: name.clone(),
                            uid: svc.uid().unwrap_or_default(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: wanted,
                    status: None,
                };
                match api.create(&PostParams::default(), &klb).await {
                    Ok(_) => {
                        publish_event(
                            &self.ctx.events,
                            &svc,
                            false,
                            "KuryrEnsureLB",
                            "Provisioning a load balancer",
                        )
                        .await;
                        Ok(())
                    }
                    // Created meanwhile (by us before a restart, or by upstream): compare on the next event.
                    Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::not_ready(format!(
                        "KuryrLoadBalancer {ns}/{name} appeared meanwhile"
                    ))),
                    Err(e) if crate::k8s::is_namespace_terminating(&e) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> kuryr_config::KuryrConfig {
        let ini = format!(
            "[neutron]\nauth_type = noauth\nendpoint_override = http://a\n\
             [deployment:west]\nauth_type = noauth\nendpoint_override = http://b\n{extra}"
        );
        match kuryr_config::KuryrConfig::from_ini_str(&ini) {
            Ok(l) => l.config,
            Err(e) => panic!("test config: {e}"),
        }
    }

    #[test]
    fn start_up_needs_a_service_subnet_in_some_deployment_only() {
        let none = check_config(&config("")).expect_err("no deployment has one");
        assert!(none.to_string().contains("service_subnet"), "{none}");
        // One of west's own is enough: Services placed in default get an Event naming the option.
        assert!(check_config(&config("service_subnet = west-svc\n")).is_ok());
        assert!(check_config(&config("[neutron_defaults]\nservice_subnet = default-svc\n")).is_ok());
    }
}
