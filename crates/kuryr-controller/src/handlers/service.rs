//! `service` handler: a Service kuryr serves (ClusterIP or LoadBalancer, not headless) gets a finalizer and a
//! KuryrLoadBalancer of the same name whose spec carries the VIP, ports, subnet, project, security groups and
//! provider; the `kuryrloadbalancer` handler makes it real in Octavia.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use kuryr_crds::names::finalizers;
use kuryr_crds::{KuryrLoadBalancer, KuryrLoadBalancerSpec, LbEndpointSlice, LbListenerAcl};
use serde_json::Value;

use crate::context::Context;
use crate::drivers::security_groups::SecurityGroupsDriver;
use crate::error::{Error, is_not_found};
use crate::k8s::{add_finalizer, publish_event, remove_finalizer, surface_user_error};
use crate::locked::Locked;
use crate::pipeline::ResourceEventHandler;
use crate::placement::record::{self, recorded_deployment};
use crate::policies::selector::Selector;
use crate::services::endpoints::{SERVICE_NAME_LABEL, from_slices};
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
    /// Why each skipped Service (by uid) was last said to be skipped, so the Event is published
    /// when the reason changes, not at every re-send.
    skipped: Mutex<HashMap<String, spec::Skip>>,
}

impl ServiceHandler {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            warned: Mutex::default(),
            skipped: Mutex::default(),
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
            // `Drivers::namespace_groups` is built whenever this driver is configured.
            Driver::Namespace => match &self.ctx.drivers.namespace_groups {
                Some(groups) => groups.security_groups(deployment, project_id, ns).await,
                None => Err(Error::Config(
                    "[kubernetes] service_security_groups_driver = namespace: no namespace groups driver"
                        .into(),
                )),
            },
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
            let mut warned = self.warned.locked();
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

    /// A `KuryrServiceSkipped` Event (upstream's) when a Service is skipped for a reason of its own
    /// spec, once per reason; none for the API server's Service or one without a cluster IP yet.
    async fn tell_skipped(&self, svc: &Service, skip: spec::Skip) {
        if matches!(skip, spec::Skip::ApiServer | spec::Skip::NoClusterIp) {
            return;
        }
        let fresh = {
            let mut skipped = self.skipped.locked();
            skipped
                .insert(svc.uid().unwrap_or_default(), skip.clone())
                .as_ref()
                != Some(&skip)
        };
        if fresh {
            let message = skip.message(&svc.namespace().unwrap_or_default(), &svc.name_any());
            publish_event(&self.ctx.events, svc, false, "KuryrServiceSkipped", &message).await;
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
        let project_id = self.ctx.project_in(deployment, project).await?;
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

    /// `[octavia_defaults] enforce_sg_rules` (upstream's, default true): the listeners admit only the
    /// sources the ingress rules of the load balancer's groups allow (`services/acls.rs`). Off, or with
    /// the `ovn` provider (which refuses listener ACLs and keeps the client's address, so the backends'
    /// own groups enforce the policies), every listener admits everyone.
    async fn listener_acls(
        &self,
        wanted: &KuryrLoadBalancerSpec,
        deployment: &str,
        ip: IpAddr,
        slices: &[LbEndpointSlice],
    ) -> Result<Vec<LbListenerAcl>, Error> {
        if !self.ctx.config.octavia_defaults.enforce_sg_rules
            || wanted.provider.as_deref() == Some(crate::services::desired::OVN_PROVIDER)
        {
            return Ok(Vec::new());
        }
        crate::services::security::listener_acls(
            self.ctx.deployments.client(deployment)?,
            &wanted.security_groups_ids,
            &self
                .ctx
                .config
                .deployment_defaults(deployment)
                .pod_security_groups,
            &wanted.ports,
            slices,
            ip,
        )
        .await
    }

    /// The spec `svc` asks for now (endpoint slices and listener ACLs excepted), `None` for a Service
    /// kuryr does not serve or whose deployment left kuryr.conf (the kuryrloadbalancer handler drains
    /// it). An existing load balancer (`existing`) stays in the deployment it records, whatever the
    /// binding is now; a new one is placed.
    async fn wanted(
        &self,
        svc: &Service,
        existing: Option<&KuryrLoadBalancer>,
    ) -> Result<Option<Wanted>, Error> {
        let ns = svc.namespace().unwrap_or_default();
        if let Some(skip) = spec::skip_reason(svc) {
            tracing::debug!(service = %format!("{ns}/{}", svc.name_any()), ?skip, "service skipped");
            return Ok(None);
        }
        let ip = spec::cluster_ip(
            svc.spec
                .as_ref()
                .and_then(|s| s.cluster_ip.as_deref())
                .unwrap_or_default(),
        )?;
        // Placed where the namespace's pods are (their project's binding), made in the Services' project.
        let project = self.ctx.drivers.project.project_for_namespace(&ns).await?;
        let deployment = match existing {
            Some(klb) => recorded_deployment(klb),
            None => self.place(&ns, &project).await?,
        };
        let project = if Arc::ptr_eq(&self.ctx.drivers.project, &self.ctx.drivers.service_project) {
            project
        } else {
            self.ctx
                .drivers
                .service_project
                .project_for_namespace(&ns)
                .await?
        };
        if existing.is_some() && self.ctx.deployments.client(&deployment).is_err() {
            return Ok(None);
        }
        let resolved = self.resolve(svc, ip, &deployment, &project).await?;
        Ok(Some(Wanted {
            spec: spec::build(svc, &resolved)?,
            provider: resolved.provider,
            deployment,
            ip,
        }))
    }

    /// Brings an existing KuryrLoadBalancer's spec to what `listed` asks for now (its groups and listener
    /// ACLs follow the network policies): what a policy change calls for each Service it affects. A Service
    /// without a KuryrLoadBalancer yet is left to its own handler. Returns whether the spec was patched.
    ///
    /// The listing may be older than a change of the Service this handler has applied since: the
    /// KuryrLoadBalancer then the Service are read again, and the spec written on condition that
    /// the KuryrLoadBalancer is still as read (both read and decided again when it is not), so that
    /// a spec made from an older Service (its old ports) is never put back over a newer one.
    pub async fn refresh(&self, listed: &Service) -> Result<bool, Error> {
        const TRIES: usize = 3;
        let ns = listed.namespace().unwrap_or_default();
        let services: Api<Service> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let mut tries = 0;
        loop {
            tries += 1;
            // The load balancer first: a write the service handler makes after the Service is
            // read then fails the condition.
            let Some(klb) = api.get_opt(&listed.name_any()).await? else {
                return Ok(false);
            };
            if klb.metadata.deletion_timestamp.is_some() {
                return Ok(false);
            }
            let Some(svc) = services.get_opt(&listed.name_any()).await? else {
                return Ok(false);
            };
            if svc.metadata.deletion_timestamp.is_some() {
                return Ok(false);
            }
            let Some(Wanted {
                spec: mut wanted,
                deployment,
                ip,
                ..
            }) = self.wanted(&svc, Some(&klb)).await?
            else {
                return Ok(false);
            };
            wanted.listener_acls = self
                .listener_acls(&wanted, &deployment, ip, &klb.spec.endpoint_slices)
                .await?;
            match self.patch_if_differs(&api, &klb, &wanted, true).await {
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 && tries < TRIES => continue,
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                    return Err(Error::not_ready(format!(
                        "KuryrLoadBalancer {ns}/{} kept changing while its groups were written",
                        svc.name_any()
                    )));
                }
                other => return other,
            }
        }
    }

    /// The listener ACLs of `klb` again from its spec as it is now (its endpoint slices just
    /// changed how a named target port resolves): only the ACLs are written, nothing else of the
    /// Service is looked at again.
    pub async fn refresh_listener_acls(&self, klb: &KuryrLoadBalancer) -> Result<(), Error> {
        let Some(ip) = klb.spec.ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()) else {
            return Ok(());
        };
        let deployment = recorded_deployment(klb);
        let acls = self
            .listener_acls(&klb.spec, &deployment, ip, &klb.spec.endpoint_slices)
            .await?;
        if acls == klb.spec.listener_acls {
            return Ok(());
        }
        let api: Api<KuryrLoadBalancer> =
            Api::namespaced(self.ctx.kube.clone(), &klb.namespace().unwrap_or_default());
        let patch = serde_json::json!({ "spec": { "listener_acls": acls } });
        api.patch(&klb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Writes `wanted` over `klb`'s Service part when it differs; `conditional`: only onto `klb` as
    /// read (409 when it changed since).
    async fn patch_if_differs(
        &self,
        api: &Api<KuryrLoadBalancer>,
        klb: &KuryrLoadBalancer,
        wanted: &KuryrLoadBalancerSpec,
        conditional: bool,
    ) -> Result<bool, Error> {
        if !spec::service_part_differs(&klb.spec, wanted) {
            return Ok(false);
        }
        let mut patch = spec_patch(wanted)?;
        if conditional {
            patch["metadata"] = serde_json::json!({"resourceVersion": klb.resource_version()});
        }
        api.patch(&klb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(true)
    }
}

/// What a Service asks for now, where it is served, and by which Octavia provider.
struct Wanted {
    spec: KuryrLoadBalancerSpec,
    deployment: String,
    ip: IpAddr,
    provider: Option<String>,
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
            "listener_acls",
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
        self.forget(svc);
        let ns = svc.namespace().unwrap_or_default();
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        // The KuryrLoadBalancer's own finalizer releases the load balancer and then this Service's.
        match api.delete(&svc.name_any(), &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => remove_finalizer(&self.ctx.kube, svc, finalizers::SERVICE).await,
            Err(e) => Err(e.into()),
        }
    }

    /// A Service without kuryr's finalizer (skipped: headless, ExternalName) ends here, not in
    /// `on_finalize`.
    async fn on_deleted(&self, svc: &Service) -> Result<(), Error> {
        self.forget(svc);
        Ok(())
    }
}

impl ServiceHandler {
    /// How many Services the handler remembers Events for (each one it warned about or skipped
    /// and that is not deleted yet).
    pub fn remembered(&self) -> usize {
        let warned = self.warned.locked();
        let skipped = self.skipped.locked();
        warned.keys().chain(skipped.keys()).collect::<BTreeSet<_>>().len()
    }

    fn forget(&self, svc: &Service) {
        let uid = svc.uid().unwrap_or_default();
        self.warned.locked().remove(&uid);
        self.skipped.locked().remove(&uid);
    }

    async fn present(&self, svc: &Service) -> Result<(), Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let api: Api<KuryrLoadBalancer> = Api::namespaced(self.ctx.kube.clone(), &ns);
        let existing = api.get_opt(&name).await?;
        if let Some(skip) = spec::skip_reason(svc) {
            self.tell_skipped(svc, skip).await;
            // Served before (its type changed, or it went headless): its load balancer goes, as
            // upstream's does; the KuryrLoadBalancer's finalizer releases it in Octavia.
            if existing.is_some_and(|klb| klb.metadata.deletion_timestamp.is_none()) {
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(());
        }
        let Some(Wanted {
            spec: wanted,
            deployment,
            ip,
            provider,
        }) = self.wanted(svc, existing.as_ref()).await?
        else {
            return Ok(());
        };
        self.warn_unhonoured(svc, provider.as_deref()).await;
        let svc = add_finalizer(&self.ctx.kube, svc, finalizers::SERVICE).await?;
        match existing {
            Some(klb) if klb.metadata.deletion_timestamp.is_some() => Err(Error::not_ready(format!(
                "KuryrLoadBalancer {ns}/{name} is being deleted"
            ))),
            Some(klb) => {
                let mut wanted = wanted;
                wanted.listener_acls = self
                    .listener_acls(&wanted, &deployment, ip, &klb.spec.endpoint_slices)
                    .await?;
                self.patch_if_differs(&api, &klb, &wanted, false)
                    .await
                    .map(|_| ())
            }
            None => {
                // The slices that exist already go in with the spec, so that a new Service is one fully
                // populated create in Octavia rather than a create and a member update.
                let slices = Api::<EndpointSlice>::namespaced(self.ctx.kube.clone(), &ns)
                    .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
                    .await?;
                let mut wanted = wanted;
                wanted.endpoint_slices = from_slices(&slices.items);
                wanted.listener_acls = self
                    .listener_acls(&wanted, &deployment, ip, &wanted.endpoint_slices)
                    .await?;
                let klb = KuryrLoadBalancer {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(ns.clone()),
                        annotations: Some(record::annotations(&deployment)),
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
                        self.catch_up_slices(&api, &ns, &name, &klb.spec.endpoint_slices)
                            .await?;
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

impl ServiceHandler {
    /// A slice that changed between the list above and the create was seen by the `endpoints`
    /// handler while there was no KuryrLoadBalancer to write it to (it leaves that to this handler):
    /// one more list puts it in.
    async fn catch_up_slices(
        &self,
        api: &Api<KuryrLoadBalancer>,
        ns: &str,
        name: &str,
        listed: &[kuryr_crds::LbEndpointSlice],
    ) -> Result<(), Error> {
        let _turn = self.ctx.slice_writes.lock((ns.to_owned(), name.to_owned())).await;
        let slices = Api::<EndpointSlice>::namespaced(self.ctx.kube.clone(), ns)
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}")))
            .await?;
        let now = from_slices(&slices.items);
        if now != listed {
            let patch = serde_json::json!({ "spec": { "endpointSlices": now } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }
}

/// The Services whose load balancers follow the network policies: with `[kubernetes]
/// service_security_groups_driver = policy` a load balancer takes the groups of the policies selecting its
/// backends, and with `enforce_sg_rules` its listeners admit what those groups' ingress rules admit. A
/// policy created, changed or deleted, or a pod moving in or out of one, refreshes the Services whose
/// backends it picks (upstream's `_is_service_affected` + `update_lbaas_sg` in its `kuryrnetworkpolicy`
/// and `pod_label` handlers). Each refresh patches the KuryrLoadBalancer spec only when it changed, so the
/// `kuryrloadbalancer` handler (which coalesces events per object) updates only the listeners that moved.
pub struct PolicyFollowers {
    ctx: Arc<Context>,
    /// `None` when no load balancer depends on policies (no `service` handler, or another groups driver:
    /// their groups, hence ACLs, never change with policies).
    services: Option<ServiceHandler>,
}

impl PolicyFollowers {
    pub fn new(ctx: Arc<Context>) -> Self {
        let k = &ctx.config.kubernetes;
        let depends = k.enabled_handlers.iter().any(|h| h == "service")
            && k.service_security_groups_driver == kuryr_config::SecurityGroupsDriver::Policy;
        Self {
            services: depends.then(|| ServiceHandler::new(ctx.clone())),
            ctx,
        }
    }

    /// Refreshes the Services of `ns` with a backend (a pod their selector picks) that one of
    /// `selectors` picks too.
    pub async fn refresh(&self, ns: &str, selectors: &[Selector]) -> Result<(), Error> {
        if self.services.is_none() || selectors.is_empty() {
            return Ok(());
        }
        let pods = Api::<Pod>::namespaced(self.ctx.kube.clone(), ns)
            .list(&ListParams::default())
            .await?;
        let picked: Vec<&BTreeMap<String, String>> = pods
            .iter()
            .map(|p| p.labels())
            .filter(|l| selectors.iter().any(|s| s.matches(l)))
            .collect();
        self.refresh_backed_by(ns, &picked).await
    }

    /// Refreshes the Services of `ns` whose selector picks a pod labelled one of `labels`.
    pub async fn refresh_backed_by(
        &self,
        ns: &str,
        labels: &[&BTreeMap<String, String>],
    ) -> Result<(), Error> {
        let Some(handler) = &self.services else {
            return Ok(());
        };
        if labels.is_empty() {
            return Ok(());
        }
        let svcs = Api::<Service>::namespaced(self.ctx.kube.clone(), ns)
            .list(&ListParams::default())
            .await?;
        let mut errors = vec![];
        for svc in &svcs.items {
            // Upstream: policies are not applied to Services without selectors.
            let Some(sel) = svc
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
            else {
                continue;
            };
            if !labels
                .iter()
                .any(|l| sel.iter().all(|(k, v)| l.get(k) == Some(v)))
            {
                continue;
            }
            match handler.refresh(svc).await {
                Ok(true) => {
                    tracing::debug!(service = %format!("{ns}/{}", svc.name_any()), "load balancer groups or ACLs follow a policy change")
                }
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Multiple(errors)),
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
