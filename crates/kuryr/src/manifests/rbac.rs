//! Least-privilege RBAC: every verb on every resource is a [`Grant`] that says which call of the
//! code needs it, and is only granted when `kuryr.conf` enables the code that makes the call.
//! The justifications are written next to the rules in the generated YAML.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kuryr_config::{KuryrConfig, MultiVifDriver, PodVifDriver, VifPoolDriver};

use super::{Doc, Options, meta};

/// The controller's ServiceAccount (and its roles' names).
pub const CONTROLLER: &str = "kuryr-controller";
/// The CNI daemon's ServiceAccount (and its role's name).
pub const CNI: &str = "kuryr-cni";

const CORE: &str = "";
const KURYR: &str = "openstack.org";

/// One verb on one resource, with the call that needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub group: &'static str,
    pub resource: &'static str,
    pub verb: &'static str,
    pub why: &'static str,
}

const fn g(group: &'static str, resource: &'static str, verb: &'static str, why: &'static str) -> Grant {
    Grant {
        group,
        resource,
        verb,
        why,
    }
}

fn handler_enabled(config: &KuryrConfig, name: &str) -> bool {
    config.kubernetes.enabled_handlers.iter().any(|h| h == name)
}

fn pools_enabled(config: &KuryrConfig) -> bool {
    config.kubernetes.vif_pool_driver != VifPoolDriver::Noop
}

/// What the controller does cluster-wide.
pub fn controller_cluster_grants(config: &KuryrConfig) -> Vec<Grant> {
    let mut out = vec![g(
        CORE,
        "namespaces",
        "get",
        "the cluster_id claim reads the kube-system Namespace's uid, the cluster's identity (cluster_claim.rs)",
    )];
    if handler_enabled(config, "vif") {
        out.extend([
            g(
                CORE,
                "pods",
                "list",
                "vif handler: watcher.rs lists Pods before watching",
            ),
            g(CORE, "pods", "watch", "vif handler: watcher.rs watches Pods"),
            g(
                CORE,
                "pods",
                "get",
                "pipeline Retry re-reads the Pod it retries (k8s.rs ObjectSource)",
            ),
            g(
                CORE,
                "pods",
                "patch",
                "vif handler adds/removes the pod finalizer (k8s.rs add_finalizer)",
            ),
            g(
                KURYR,
                "kuryrports",
                "get",
                "vif handler: is there a KuryrPort for the pod (handlers/vif.rs)",
            ),
            g(
                KURYR,
                "kuryrports",
                "create",
                "vif handler creates the pod's KuryrPort (handlers/vif.rs)",
            ),
            g(
                KURYR,
                "kuryrports",
                "delete",
                "vif handler deletes the KuryrPort of a deleted pod (handlers/vif.rs)",
            ),
        ]);
    }
    if handler_enabled(config, "kuryrport") {
        out.extend([
            g(
                KURYR,
                "kuryrports",
                "list",
                "kuryrport handler: watcher.rs lists KuryrPorts",
            ),
            g(
                KURYR,
                "kuryrports",
                "watch",
                "kuryrport handler: watcher.rs watches KuryrPorts",
            ),
            g(
                KURYR,
                "kuryrports",
                "get",
                "pipeline Retry re-reads the KuryrPort it retries (k8s.rs)",
            ),
            g(
                KURYR,
                "kuryrports",
                "patch",
                "kuryrport handler writes status.vifs and removes its finalizer",
            ),
            g(
                KURYR,
                "kuryrports",
                "delete",
                "kuryrport handler deletes a KuryrPort whose pod is gone",
            ),
            g(
                CORE,
                "pods",
                "get",
                "kuryrport handler loads the KuryrPort's pod (handlers/kuryrport.rs)",
            ),
            g(
                CORE,
                "pods",
                "patch",
                "kuryrport handler removes the pod finalizer once the ports are released",
            ),
        ]);
        if config
            .kubernetes
            .multi_vif_drivers
            .iter()
            .any(|d| *d != MultiVifDriver::Noop)
        {
            out.push(g(
                CORE,
                "pods",
                "patch",
                "kuryrport handler writes k8s.v1.cni.cncf.io/network-status (multi_vif_drivers)",
            ));
        }
        if config.kubernetes.pod_project_driver == kuryr_config::ProjectDriver::Annotation
            || config.pod_binding.enabled
        {
            out.push(g(
                CORE,
                "namespaces",
                "get",
                "project driver 'annotation' / [pod_binding] read the pod's Namespace annotations",
            ));
        }
        if config
            .kubernetes
            .multi_vif_drivers
            .contains(&MultiVifDriver::NpwgMultipleInterfaces)
        {
            out.push(g(
                "k8s.cni.cncf.io",
                "network-attachment-definitions",
                "get",
                "npwg_multiple_interfaces reads the pod's NetworkAttachmentDefinitions",
            ));
        }
        if matches!(
            config.kubernetes.pod_vif_driver,
            PodVifDriver::NestedVlan | PodVifDriver::NestedMacvlan
        ) {
            out.push(g(
                CORE,
                "nodes",
                "get",
                "nested VIF drivers read the node's addresses to find its VM port (drivers/vif/nested.rs)",
            ));
        }
    }
    if [
        config.kubernetes.pod_security_groups_driver,
        config.kubernetes.service_security_groups_driver,
    ]
    .contains(&kuryr_config::SecurityGroupsDriver::Namespace)
    {
        out.push(g(
            CORE,
            "namespaces",
            "list",
            "the namespace security groups' orphan sweep lists Namespaces (drivers/namespace_groups.rs)",
        ));
    }
    if config.kubernetes.pod_subnets_driver == kuryr_config::PodSubnetsDriver::Namespace {
        out.extend([
            g(
                KURYR,
                "kuryrnetworks",
                "get",
                "subnets driver 'namespace' reads the namespace's KuryrNetwork (drivers/subnets.rs)",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "create",
                "subnets driver 'namespace' makes the KuryrNetwork of a namespace's first pod, Service or \
                 policy (drivers/namespace_networks.rs)",
            ),
            g(
                CORE,
                "namespaces",
                "get",
                "subnets driver 'namespace' reads the Namespace whose KuryrNetwork it makes (its labels)",
            ),
        ]);
    }
    if handler_enabled(config, "namespace") {
        out.extend([
            g(
                CORE,
                "pods",
                "list",
                "namespace handler: does the namespace hold a pod on the pods' network (drivers/namespace_networks.rs)",
            ),
            g(
                CORE,
                "namespaces",
                "list",
                "namespace handler: watcher.rs lists Namespaces",
            ),
            g(
                CORE,
                "namespaces",
                "watch",
                "namespace handler: watcher.rs watches Namespaces",
            ),
            g(
                CORE,
                "namespaces",
                "get",
                "pipeline Retry re-reads the Namespace it retries (k8s.rs)",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "get",
                "namespace handler: does the namespace have its KuryrNetwork",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "create",
                "namespace handler creates the namespace's KuryrNetwork",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "patch",
                "namespace handler updates the KuryrNetwork spec",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "delete",
                "namespace handler deletes the KuryrNetwork of a deleted namespace",
            ),
        ]);
    }
    if handler_enabled(config, "kuryrnetwork") {
        out.extend([
            g(
                KURYR,
                "kuryrnetworks",
                "list",
                "kuryrnetwork handler: watcher.rs lists KuryrNetworks",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "watch",
                "kuryrnetwork handler: watcher.rs watches KuryrNetworks",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "get",
                "pipeline Retry re-reads the KuryrNetwork it retries (k8s.rs)",
            ),
            g(
                KURYR,
                "kuryrnetworks",
                "patch",
                "kuryrnetwork handler writes status and its finalizer",
            ),
        ]);
    }
    let service = handler_enabled(config, "service");
    let endpoints = handler_enabled(config, "endpoints");
    let klb = handler_enabled(config, "kuryrloadbalancer");
    if service {
        out.extend([
            g(
                CORE,
                "services",
                "list",
                "service handler: watcher.rs lists Services",
            ),
            g(
                CORE,
                "services",
                "watch",
                "service handler: watcher.rs watches Services",
            ),
            g(
                CORE,
                "services",
                "patch",
                "service handler adds its finalizer (k8s.rs add_finalizer)",
            ),
            g(
                KURYR,
                "kuryrloadbalancers",
                "create",
                "service handler creates the Service's KuryrLoadBalancer (handlers/service.rs)",
            ),
            g(
                KURYR,
                "kuryrloadbalancers",
                "delete",
                "service handler deletes the KuryrLoadBalancer of a deleted Service",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "list",
                "service handler puts existing endpoints into a new KuryrLoadBalancer",
            ),
        ]);
    }
    if endpoints {
        out.extend([
            g(
                "discovery.k8s.io",
                "endpointslices",
                "list",
                "endpoints handler: watcher.rs lists EndpointSlices; all slices of a Service",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "watch",
                "endpoints handler: watcher.rs watches EndpointSlices",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "get",
                "pipeline Retry re-reads the EndpointSlice it retries",
            ),
        ]);
    }
    if service || endpoints || klb {
        out.extend([
            g(
                CORE,
                "services",
                "get",
                "the Service of a slice or KuryrLoadBalancer; Retry re-reads a Service",
            ),
            g(
                KURYR,
                "kuryrloadbalancers",
                "get",
                "service/endpoints handlers compare the KuryrLoadBalancer spec; Retry re-reads it",
            ),
            g(
                KURYR,
                "kuryrloadbalancers",
                "patch",
                "spec (service, endpoints handlers), status and finalizer (kuryrloadbalancer handler)",
            ),
        ]);
    }
    if klb {
        out.extend([
            g(
                KURYR,
                "kuryrloadbalancers",
                "list",
                "kuryrloadbalancer handler: watcher.rs lists them; services/reconcile.rs checks each",
            ),
            g(
                KURYR,
                "kuryrloadbalancers",
                "watch",
                "kuryrloadbalancer handler: watcher.rs watches KuryrLoadBalancers",
            ),
            g(
                CORE,
                "services",
                "patch",
                "kuryrloadbalancer handler removes the Service finalizer once the load balancer is gone",
            ),
            g(
                CORE,
                "services/status",
                "patch",
                "kuryrloadbalancer handler writes a LoadBalancer Service's status.loadBalancer.ingress",
            ),
        ]);
    }
    let annotated = |driver: kuryr_config::ProjectDriver, used: bool| {
        used && driver == kuryr_config::ProjectDriver::Annotation
    };
    let k = &config.kubernetes;
    if annotated(k.service_project_driver, service)
        || annotated(k.namespace_project_driver, handler_enabled(config, "namespace"))
        || annotated(
            k.network_policy_project_driver,
            handler_enabled(config, "kuryrnetworkpolicy"),
        )
    {
        out.push(g(
            CORE,
            "namespaces",
            "get",
            "project driver 'annotation' of Services, namespaces or policies reads the Namespace's annotation",
        ));
    }
    out.extend(policy_grants(config));
    if pools_enabled(config) {
        out.extend([
            g(
                CORE,
                "nodes",
                "get",
                "pools read a node's pod-vif label (pool/mod.rs)",
            ),
            g(
                CORE,
                "nodes",
                "list",
                "pools pre-populate every node's pool; the node watch lists them (pool/mod.rs, pool/nodes.rs)",
            ),
            g(
                CORE,
                "nodes",
                "watch",
                "pools drop the pools of deleted or re-created nodes (pool/nodes.rs)",
            ),
            g(
                KURYR,
                "kuryrports",
                "list",
                "pool recovery lists every KuryrPort to find ports in use (pool/persist.rs)",
            ),
        ]);
    }
    if config.pod_binding.enabled {
        out.extend([
            g(
                KURYR,
                "kuryrprojectbindings",
                "get",
                "placement reads the binding of a (project, group) (placement/kube_store.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings",
                "list",
                "the usage task measures the port quota of every bound project (placement/usage.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings",
                "watch",
                "an operator's move or pin empties the binder's cache at once (placement/watch.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings",
                "create",
                "placement records a new (project, group) binding (placement/kube_store.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings/status",
                "update",
                "placement claims a binding with a resourceVersion precondition (placement/kube_store.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings",
                "update",
                "a binding kept under a name its group shared is copied to its own name (placement/kube_store.rs)",
            ),
            g(
                KURYR,
                "kuryrprojectbindings",
                "delete",
                "the copied binding's old object, and bindings unused for the retention (placement/kube_store.rs, placement/retire.rs)",
            ),
            g(
                KURYR,
                "kuryropenstackdeployments",
                "list",
                "placement/watch.rs lists the operator's deployment objects",
            ),
            g(
                KURYR,
                "kuryropenstackdeployments",
                "watch",
                "placement/watch.rs follows maintenance and threshold edits without a restart",
            ),
            g(
                KURYR,
                "kuryropenstackdeployments",
                "create",
                "placement/watch.rs creates the object of a kuryr.conf deployment that has none",
            ),
            g(
                KURYR,
                "kuryropenstackdeployments/status",
                "patch",
                "usage figures and the Configured condition (placement/usage.rs, placement/watch.rs)",
            ),
        ]);
        out.push(g(
            KURYR,
            "kuryrprojectbindings",
            "patch",
            "the binder unmarks a binding marked unused as it reads it; retiring marks and unmarks (placement/kube_store.rs, placement/retire.rs)",
        ));
        if config.pod_binding.unused_binding_retention > 0 {
            out.extend([
                g(
                    CORE,
                    "namespaces",
                    "list",
                    "retiring reads which (project, group) the namespaces ask for (placement/retire.rs)",
                ),
                g(
                    KURYR,
                    "kuryrnetworks",
                    "list",
                    "retiring reads the project each namespace's network records (placement/retire.rs)",
                ),
            ]);
        }
    }
    out.extend([
        g(
            "events.k8s.io",
            "events",
            "create",
            "Events on pods and KuryrPorts (kuryr_crds::events, kube-runtime's Recorder)",
        ),
        g(
            "events.k8s.io",
            "events",
            "patch",
            "the Recorder folds a repeated Event into a series",
        ),
    ]);
    out
}

/// NetworkPolicy: the `policy`, `kuryrnetworkpolicy` and `pod_label` handlers, and the `policy`
/// security groups drivers (pods' and Services' groups from the policies that select them).
fn policy_grants(config: &KuryrConfig) -> Vec<Grant> {
    use kuryr_config::SecurityGroupsDriver::Policy;
    const NET: &str = "networking.k8s.io";
    let policy = handler_enabled(config, "policy");
    let knp = handler_enabled(config, "kuryrnetworkpolicy");
    let pod_label = handler_enabled(config, "pod_label");
    let groups_driver = config.kubernetes.pod_security_groups_driver == Policy
        || config.kubernetes.service_security_groups_driver == Policy;
    let mut out = Vec::new();
    if policy || knp || pod_label || groups_driver {
        out.extend([
            g(
                CORE,
                "namespaces",
                "list",
                "the policies' model lists Namespaces once (drivers/network_policy.rs)",
            ),
            g(
                CORE,
                "pods",
                "list",
                "the policies' model lists Pods once; a namespace's pods (drivers/network_policy.rs)",
            ),
            g(
                CORE,
                "services",
                "list",
                "the policies' model lists Services (drivers/network_policy.rs)",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "list",
                "a selector-less Service's backends for egress rules (drivers/network_policy.rs)",
            ),
            g(
                NET,
                "networkpolicies",
                "list",
                "the policies' model lists NetworkPolicies (drivers/network_policy.rs)",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "list",
                "the deployment each policy's groups are in (drivers/network_policy.rs)",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "get",
                "a policy's groups as its KuryrNetworkPolicy records them (drivers/network_policy.rs)",
            ),
            g(
                KURYR,
                "kuryrports",
                "get",
                "a pod's ports to move between groups (drivers/network_policy.rs)",
            ),
        ]);
    }
    if policy {
        out.extend([
            g(
                NET,
                "networkpolicies",
                "watch",
                "policy handler: watcher.rs watches NetworkPolicies",
            ),
            g(
                NET,
                "networkpolicies",
                "get",
                "pipeline Retry re-reads the NetworkPolicy it retries",
            ),
            g(
                NET,
                "networkpolicies",
                "patch",
                "policy handler adds/removes its finalizer (k8s.rs add_finalizer)",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "create",
                "policy handler creates the policy's KuryrNetworkPolicy",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "patch",
                "policy handler updates the KuryrNetworkPolicy spec",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "delete",
                "policy handler deletes the KuryrNetworkPolicy of a deleted policy",
            ),
        ]);
    }
    if knp {
        out.extend([
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "watch",
                "kuryrnetworkpolicy handler: watcher.rs watches KuryrNetworkPolicies",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "patch",
                "kuryrnetworkpolicy handler writes status and its finalizer",
            ),
            g(
                KURYR,
                "kuryrnetworkpolicies",
                "delete",
                "kuryrnetworkpolicy handler deletes one whose NetworkPolicy is gone",
            ),
            g(
                NET,
                "networkpolicies",
                "get",
                "kuryrnetworkpolicy handler reads the KuryrNetworkPolicy's policy",
            ),
            g(
                KURYR,
                "kuryrports",
                "list",
                "a namespace's pods' ports moved between groups (drivers/network_policy.rs)",
            ),
        ]);
    }
    if pod_label {
        out.extend([
            g(
                CORE,
                "pods",
                "watch",
                "pod_label handler: watcher.rs watches Pods",
            ),
            g(CORE, "pods", "get", "pipeline Retry re-reads the Pod it retries"),
            g(
                CORE,
                "namespaces",
                "watch",
                "pod_label's namespace companion watches Namespaces",
            ),
            g(
                CORE,
                "namespaces",
                "get",
                "pipeline Retry re-reads the Namespace it retries",
            ),
            g(
                CORE,
                "services",
                "watch",
                "pod_label's Service companion watches Services",
            ),
            g(
                CORE,
                "services",
                "get",
                "pipeline Retry re-reads the Service it retries",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "watch",
                "pod_label's EndpointSlice companion watches the backends of Services without a selector",
            ),
            g(
                "discovery.k8s.io",
                "endpointslices",
                "get",
                "pipeline Retry re-reads the EndpointSlice it retries",
            ),
        ]);
    }
    out
}

/// What the controller does in its own namespace.
pub fn controller_namespace_grants(config: &KuryrConfig) -> Vec<Grant> {
    let mut out = Vec::new();
    if config.kubernetes.controller_ha {
        out.extend([
            g(
                "coordination.k8s.io",
                "leases",
                "get",
                "leader election reads the Lease (leader.rs)",
            ),
            g(
                "coordination.k8s.io",
                "leases",
                "create",
                "leader election creates the Lease (leader.rs)",
            ),
            g(
                "coordination.k8s.io",
                "leases",
                "update",
                "leader election renews or takes the Lease (leader.rs)",
            ),
        ]);
    }
    if pools_enabled(config) {
        out.extend([
            g(
                KURYR,
                "kuryrportpools",
                "get",
                "pool persistence reads a pool before deleting it (pool/persist.rs)",
            ),
            g(
                KURYR,
                "kuryrportpools",
                "list",
                "pool recovery lists the pools (pool/persist.rs)",
            ),
            g(
                KURYR,
                "kuryrportpools",
                "create",
                "pool persistence records a new pool (pool/persist.rs)",
            ),
            g(
                KURYR,
                "kuryrportpools",
                "patch",
                "pool persistence updates a pool's spec (pool/persist.rs)",
            ),
            g(
                KURYR,
                "kuryrportpools",
                "delete",
                "pool persistence removes an empty pool (pool/persist.rs)",
            ),
            g(
                KURYR,
                "kuryrportpools/status",
                "patch",
                "pool persistence records the pool's ports (pool/persist.rs)",
            ),
        ]);
    }
    out
}

/// What the CNI daemon does (cluster-wide: its node's objects are selected, not namespaced).
pub fn cni_grants() -> Vec<Grant> {
    vec![
        g(
            KURYR,
            "kuryrports",
            "list",
            "kuryr-daemon kube.rs lists its node's KuryrPorts (label selector)",
        ),
        g(
            KURYR,
            "kuryrports",
            "watch",
            "kuryr-daemon kube.rs watches its node's KuryrPorts for VIFs",
        ),
        g(
            CORE,
            "pods",
            "get",
            "kuryr-daemon kube.rs reads the pod of an ADD that names no K8S_POD_UID (its uid, once)",
        ),
        g(
            CORE,
            "pods",
            "list",
            "kuryr-daemon kube.rs lists its node's pods (spec.nodeName)",
        ),
        g(
            CORE,
            "pods",
            "watch",
            "kuryr-daemon kube.rs watches pod deletions so a waiting ADD ends",
        ),
        g(
            "events.k8s.io",
            "events",
            "create",
            "kuryr-daemon Events on pods (kube-runtime's Recorder)",
        ),
        g(
            "events.k8s.io",
            "events",
            "patch",
            "the Recorder folds a repeated Event into a series",
        ),
    ]
}

/// Canonical order of verbs in a rule (the order `kubectl describe` people are used to).
const VERB_ORDER: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

fn verb_rank(verb: &str) -> usize {
    VERB_ORDER
        .iter()
        .position(|v| *v == verb)
        .unwrap_or(VERB_ORDER.len())
}

/// Each verb (in canonical order) with the reasons it is granted.
type VerbReasons<'a> = BTreeMap<(usize, &'a str), Vec<&'a str>>;

/// `resource.group/subresource`, as `kubectl auth can-i` spells it.
pub fn qualified(group: &str, resource: &str) -> String {
    let (base, sub) = match resource.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (resource, None),
    };
    let mut out = base.to_owned();
    if !group.is_empty() {
        out.push('.');
        out.push_str(group);
    }
    if let Some(s) = sub {
        out.push('/');
        out.push_str(s);
    }
    out
}

/// One rule per (group, resource) with the union of its verbs, and the justification comment
/// lines (`resource verb: why`, each verb's reasons joined).
pub fn rules(grants: &[Grant]) -> (Vec<PolicyRule>, Vec<String>) {
    let mut by_resource: BTreeMap<(&str, &str), VerbReasons<'_>> = BTreeMap::new();
    for grant in grants {
        let whys = by_resource
            .entry((grant.group, grant.resource))
            .or_default()
            .entry((verb_rank(grant.verb), grant.verb))
            .or_default();
        if !whys.contains(&grant.why) {
            whys.push(grant.why);
        }
    }
    let mut rules = Vec::new();
    let mut comments = Vec::new();
    for ((group, resource), verbs) in &by_resource {
        let qualified = qualified(group, resource);
        for ((_, verb), whys) in verbs {
            comments.push(format!("{qualified} {verb}: {}", whys.join("; ")));
        }
        rules.push(PolicyRule {
            api_groups: Some(vec![(*group).to_owned()]),
            resources: Some(vec![(*resource).to_owned()]),
            verbs: verbs.keys().map(|(_, v)| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        });
    }
    (rules, comments)
}

fn subject(opts: &Options, account: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: account.into(),
        namespace: Some(opts.namespace.clone()),
        ..Subject::default()
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

fn cluster_role(opts: &Options, name: &str, grants: &[Grant]) -> Vec<Doc> {
    let (rules, why) = rules(grants);
    let role = ClusterRole {
        metadata: meta(name, None),
        rules: Some(rules),
        ..ClusterRole::default()
    };
    let binding = ClusterRoleBinding {
        metadata: meta(name, None),
        role_ref: role_ref("ClusterRole", name),
        subjects: Some(vec![subject(opts, name)]),
    };
    vec![Doc::with_comments(&role, why), Doc::new(&binding)]
}

/// ServiceAccounts, ClusterRoles, the controller's namespaced Role and the bindings.
pub fn objects(opts: &Options, config: &KuryrConfig) -> Vec<Doc> {
    let mut out = Vec::new();
    for name in [CONTROLLER, CNI] {
        out.push(Doc::new(&ServiceAccount {
            metadata: meta(name, Some(&opts.namespace)),
            ..ServiceAccount::default()
        }));
    }
    out.extend(cluster_role(opts, CONTROLLER, &controller_cluster_grants(config)));
    let namespaced = controller_namespace_grants(config);
    if !namespaced.is_empty() {
        let (rules, why) = rules(&namespaced);
        out.push(Doc::with_comments(
            &Role {
                metadata: meta(CONTROLLER, Some(&opts.namespace)),
                rules: Some(rules),
            },
            why,
        ));
        out.push(Doc::new(&RoleBinding {
            metadata: meta(CONTROLLER, Some(&opts.namespace)),
            role_ref: role_ref("Role", CONTROLLER),
            subjects: Some(vec![subject(opts, CONTROLLER)]),
        }));
    }
    out.extend(cluster_role(opts, CNI, &cni_grants()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ini: &str) -> KuryrConfig {
        match KuryrConfig::from_ini_str(ini) {
            Ok(l) => l.config,
            Err(e) => panic!("test config: {e}"),
        }
    }

    fn has(grants: &[Grant], group: &str, resource: &str, verb: &str) -> bool {
        grants
            .iter()
            .any(|g| g.group == group && g.resource == resource && g.verb == verb)
    }

    #[test]
    fn rules_merge_verbs_per_resource_in_canonical_order() {
        let grants = [
            g(CORE, "pods", "patch", "a"),
            g(CORE, "pods", "get", "b"),
            g(CORE, "pods", "patch", "c"),
            g(KURYR, "kuryrports", "watch", "d"),
        ];
        let (rules, comments) = rules(&grants);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].resources.as_deref(), Some(&["pods".to_string()][..]));
        assert_eq!(rules[0].verbs, vec!["get", "patch"]);
        assert_eq!(
            rules[1].api_groups.as_deref(),
            Some(&["openstack.org".to_string()][..])
        );
        assert_eq!(
            comments,
            vec![
                "pods get: b",
                "pods patch: a; c",
                "kuryrports.openstack.org watch: d"
            ]
        );
    }

    #[test]
    fn optional_features_add_their_permissions_only_when_enabled() {
        let plain = config("[kubernetes]\nenabled_handlers = vif,kuryrport\n");
        let cluster = controller_cluster_grants(&plain);
        assert!(has(&cluster, CORE, "pods", "watch"));
        assert!(!has(&cluster, CORE, "nodes", "get"));
        assert!(!has(&cluster, CORE, "namespaces", "watch"));
        assert!(!has(
            &cluster,
            "k8s.cni.cncf.io",
            "network-attachment-definitions",
            "get"
        ));
        assert!(!has(&cluster, "networking.k8s.io", "networkpolicies", "list"));
        assert_eq!(controller_namespace_grants(&plain), vec![]);
        // The `policy` groups driver alone reads the policies, but watches and writes nothing.
        let groups = controller_cluster_grants(&config(
            "[kubernetes]\nenabled_handlers = vif,kuryrport\npod_security_groups_driver = policy\n",
        ));
        assert!(has(&groups, "networking.k8s.io", "networkpolicies", "list"));
        assert!(!has(&groups, "networking.k8s.io", "networkpolicies", "watch"));
        assert!(!has(&groups, KURYR, "kuryrnetworkpolicies", "patch"));

        let full = config(
            "[kubernetes]\nenabled_handlers = vif,kuryrport,namespace,kuryrnetwork\ncontroller_ha = True\n\
             vif_pool_driver = neutron\nmulti_vif_drivers = npwg_multiple_interfaces\n\
             pod_subnets_driver = namespace\n[pod_binding]\nenabled = True\n",
        );
        let cluster = controller_cluster_grants(&full);
        for (group, resource, verb) in [
            (CORE, "nodes", "list"),
            (CORE, "nodes", "watch"),
            (CORE, "namespaces", "watch"),
            (KURYR, "kuryrnetworks", "create"),
            (KURYR, "kuryrprojectbindings", "create"),
            (KURYR, "kuryrprojectbindings", "delete"),
            (KURYR, "kuryrprojectbindings", "patch"),
            (KURYR, "kuryropenstackdeployments", "watch"),
            ("k8s.cni.cncf.io", "network-attachment-definitions", "get"),
        ] {
            assert!(has(&cluster, group, resource, verb), "{resource} {verb}");
        }
        let ns = controller_namespace_grants(&full);
        for (group, resource, verb) in [
            ("coordination.k8s.io", "leases", "update"),
            (KURYR, "kuryrportpools/status", "patch"),
        ] {
            assert!(has(&ns, group, resource, verb), "{resource} {verb}");
        }
    }

    #[test]
    fn the_daemon_only_reads_and_posts_events() {
        for grant in cni_grants() {
            assert!(
                matches!(grant.verb, "get" | "list" | "watch") || grant.resource == "events",
                "{grant:?}"
            );
        }
    }
}
