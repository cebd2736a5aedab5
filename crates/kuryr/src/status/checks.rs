//! The checks of `kuryr status`, as pure functions of what was read from the cluster (and from
//! Neutron), so that each is tested without servers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

use kuryr_config::{KuryrConfig, VifPoolDriver};

use kuryr_controller::cluster_claim::{Claim, Verdict, judge};

use crate::cluster_config;

/// How bad a finding is; the exit code is the worst one (upstream's upgrade-check codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Success,
    Warning,
    Failure,
}

impl Level {
    pub fn exit_code(self) -> u8 {
        match self {
            Level::Success => 0,
            Level::Warning => 1,
            Level::Failure => 2,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Success => "Success",
            Level::Warning => "Warning",
            Level::Failure => "Failure",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub detail: String,
}

fn finding(check: &'static str, level: Level, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        level,
        detail: detail.into(),
    }
}

/// A CRD as installed: the versions it serves and the one it stores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstalledCrd {
    pub served: Vec<String>,
    pub storage: Option<String>,
    /// The fields the stored version's schema declares ([`schema_fields`]); `None`: not read.
    pub fields: Option<BTreeSet<String>>,
}

/// The field paths a CRD version's schema declares (`spec.listeners[].pool`); a field whose
/// schema keeps unknown fields (`x-kubernetes-preserve-unknown-fields`) is `<path>.*`. Maps
/// (`additionalProperties`) are not entered.
pub fn schema_fields(crd: &CustomResourceDefinition, version: &str) -> BTreeSet<String> {
    fn walk(path: &str, props: &JSONSchemaProps, out: &mut BTreeSet<String>) {
        if props.x_kubernetes_preserve_unknown_fields == Some(true) {
            out.insert(format!("{path}.*"));
        }
        for (name, child) in props.properties.iter().flatten() {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            out.insert(p.clone());
            walk(&p, child, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &props.items {
            walk(&format!("{path}[]"), items, out);
        }
    }
    let mut out = BTreeSet::new();
    let schema = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref());
    if let Some(schema) = schema {
        walk("", schema, &mut out);
    }
    out
}

/// Whether `fields` (as [`schema_fields`] gives them) keep `path`: declared, or under a field
/// that keeps unknown fields.
fn keeps(fields: &BTreeSet<String>, path: &str) -> bool {
    if fields.contains(path) {
        return true;
    }
    let mut prefix = path;
    while let Some(i) = prefix.rfind(['.', '[']) {
        prefix = &prefix[..i];
        if fields.contains(&format!("{prefix}.*")) {
            return true;
        }
    }
    fields.contains(".*")
}

/// The project's port quota as Neutron reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortQuota {
    /// -1: unlimited.
    pub limit: i64,
    pub used: i64,
}

/// Everything the checks look at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `namespace/name` of pods still carrying the pre-CRD `openstack.org/kuryr-vif` annotation.
    pub legacy_annotated_pods: Vec<String>,
    /// CRD name -> what is installed.
    pub crds: BTreeMap<String, InstalledCrd>,
    /// `namespace/name` of KuryrPorts whose VIFs were recorded by upstream kuryr-kubernetes.
    pub upstream_kuryrports: Vec<String>,
    pub kuryrnetworks: usize,
    pub nodes: usize,
    pub config: Option<KuryrConfig>,
    /// `None`: not asked (no pools, or no project); `Some(Err)`: Neutron could not be asked.
    pub port_quota: Option<Result<PortQuota, String>>,
    /// The `cluster_id` claims in the default deployment; `None`: not asked.
    pub claims: Option<Result<ClaimState, String>>,
}

/// What `kuryr status` read of the `cluster_id` claim.
#[derive(Debug, Clone, Default)]
pub struct ClaimState {
    pub cluster_id: String,
    /// This cluster's kube-system namespace uid.
    pub uid: String,
    pub claims: Vec<Claim>,
}

/// The CRD versions kuryr-rs reads and writes: (CRD name, version).
pub fn expected_crds() -> Vec<(String, String)> {
    kuryr_crds::generate::crds()
        .into_iter()
        .filter_map(|crd| {
            let name = crd.metadata.name?;
            let version = crd
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone())?;
            Some((name, version))
        })
        .collect()
}

fn listed(items: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut out = items.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > SHOWN {
        out.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    out
}

pub fn legacy_annotations(s: &Snapshot) -> Finding {
    const CHECK: &str = "Pod annotations";
    if s.legacy_annotated_pods.is_empty() {
        return finding(
            CHECK,
            Level::Success,
            "no pod carries the pre-CRD openstack.org/kuryr-vif annotation",
        );
    }
    finding(
        CHECK,
        Level::Failure,
        format!(
            "{} pod(s) still carry the pre-CRD openstack.org/kuryr-vif annotation, which kuryr-rs does not read \
             ({}): recreate them, or convert them with upstream's release that still reads it",
            s.legacy_annotated_pods.len(),
            listed(&s.legacy_annotated_pods)
        ),
    )
}

pub fn crd_versions(s: &Snapshot) -> Finding {
    const CHECK: &str = "CRD versions";
    let mut missing = Vec::new();
    let mut unserved = Vec::new();
    let mut storage = Vec::new();
    for (name, version) in expected_crds() {
        match s.crds.get(&name) {
            None => missing.push(name),
            Some(crd) if !crd.served.contains(&version) => unserved.push(format!(
                "{name} (serves {}, needs {version})",
                crd.served.join(",")
            )),
            Some(crd) if crd.storage.as_deref() != Some(version.as_str()) => storage.push(format!(
                "{name} (stores {}, kuryr-rs writes {version})",
                crd.storage.as_deref().unwrap_or("nothing")
            )),
            Some(_) => {}
        }
    }
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "missing: {} (kubectl apply -f deploy/crds)",
            listed(&missing)
        ));
    }
    if !unserved.is_empty() {
        problems.push(format!("not served: {}", listed(&unserved)));
    }
    if problems.is_empty() && storage.is_empty() {
        return finding(
            CHECK,
            Level::Success,
            "every CRD kuryr-rs uses is installed and served",
        );
    }
    if problems.is_empty() {
        return finding(
            CHECK,
            Level::Warning,
            format!("storage version differs: {}", listed(&storage)),
        );
    }
    problems.extend((!storage.is_empty()).then(|| format!("storage version differs: {}", listed(&storage))));
    finding(CHECK, Level::Failure, problems.join("; "))
}

/// Fields kuryr-rs writes that an installed CRD's schema does not declare: the API server
/// drops them (a KuryrLoadBalancer CRD kept from upstream loses `spec.listener_acls`, and
/// Services are then open to every client whatever the policies say).
pub fn crd_fields(s: &Snapshot) -> Finding {
    const CHECK: &str = "CRD fields";
    let mut lacking = Vec::new();
    for crd in kuryr_crds::generate::crds() {
        let Some(name) = crd.metadata.name.clone() else {
            continue;
        };
        let Some(version) = crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.clone())
        else {
            continue;
        };
        let Some(fields) = s.crds.get(&name).and_then(|c| c.fields.as_ref()) else {
            continue;
        };
        let missing: Vec<String> = schema_fields(&crd, &version)
            .into_iter()
            .filter(|f| !f.ends_with(".*") && !keeps(fields, f))
            .collect();
        if !missing.is_empty() {
            lacking.push(format!("{name} lacks {}", listed(&missing)));
        }
    }
    if lacking.is_empty() {
        return finding(
            CHECK,
            Level::Success,
            "every field kuryr-rs writes is in the installed CRDs",
        );
    }
    finding(
        CHECK,
        Level::Failure,
        format!(
            "the API server would drop fields kuryr-rs writes: {} (kubectl apply -f deploy/crds)",
            lacking.join("; ")
        ),
    )
}

pub fn adopted_objects(s: &Snapshot) -> Finding {
    const CHECK: &str = "Objects left by upstream";
    if s.upstream_kuryrports.is_empty() {
        return finding(
            CHECK,
            Level::Success,
            format!(
                "no upstream KuryrPort to adopt; {} KuryrNetwork(s) in place",
                s.kuryrnetworks
            ),
        );
    }
    finding(
        CHECK,
        Level::Success,
        format!(
            "{} KuryrPort(s) recorded by upstream kuryr-kubernetes will be adopted with their Neutron ports \
             ({}); {} KuryrNetwork(s) are kept as they are",
            s.upstream_kuryrports.len(),
            listed(&s.upstream_kuryrports),
            s.kuryrnetworks
        ),
    )
}

pub fn pool_settings(s: &Snapshot) -> Finding {
    const CHECK: &str = "Pool settings";
    let Some(config) = &s.config else {
        return finding(CHECK, Level::Warning, "no kuryr.conf: not checked");
    };
    if config.kubernetes.vif_pool_driver == VifPoolDriver::Noop {
        return finding(
            CHECK,
            Level::Success,
            "no port pools ([kubernetes] vif_pool_driver = noop)",
        );
    }
    let p = &config.vif_pool;
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    if p.ports_pool_max != 0 && p.ports_pool_min > p.ports_pool_max {
        failures.push(format!(
            "[vif_pool] ports_pool_min = {} is above ports_pool_max = {}: every refill is cut short",
            p.ports_pool_min, p.ports_pool_max
        ));
    }
    if p.ports_pool_max != 0 && p.ports_pool_batch.get() > p.ports_pool_max {
        warnings.push(format!(
            "[vif_pool] ports_pool_batch = {} is above ports_pool_max = {}: batches are trimmed",
            p.ports_pool_batch, p.ports_pool_max
        ));
    }
    match &s.port_quota {
        Some(Ok(q)) if q.limit >= 0 => {
            let prefill = u64::from(p.ports_pool_min) * s.nodes as u64;
            let room = (q.limit - q.used).max(0) as u64;
            if prefill > room {
                failures.push(format!(
                    "[vif_pool] ports_pool_min = {} on {} node(s) pre-creates {prefill} ports, but the port quota \
                     leaves {room} (limit {}, used {})",
                    p.ports_pool_min, s.nodes, q.limit, q.used
                ));
            }
        }
        Some(Ok(_)) => {}
        Some(Err(e)) => warnings.push(format!("the port quota could not be read: {e}")),
        None => {}
    }
    if !failures.is_empty() {
        failures.extend(warnings);
        return finding(CHECK, Level::Failure, failures.join("; "));
    }
    if !warnings.is_empty() {
        return finding(CHECK, Level::Warning, warnings.join("; "));
    }
    finding(
        CHECK,
        Level::Success,
        "pool sizes agree with each other and with the port quota",
    )
}

pub fn credentials(s: &Snapshot) -> Finding {
    const CHECK: &str = "Deployments and drivers";
    let Some(config) = &s.config else {
        return finding(CHECK, Level::Warning, "no kuryr.conf: not checked");
    };
    let mut problems = cluster_config::credential_problems(config);
    problems.extend(cluster_config::driver_problems(config));
    if problems.is_empty() {
        return finding(
            CHECK,
            Level::Success,
            format!(
                "{} OpenStack deployment(s) with credentials; drivers have their options",
                config.deployments().len()
            ),
        );
    }
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    finding(CHECK, Level::Failure, lines.join("; "))
}

/// Whether the controller would take `cluster_id` as this cluster's: clusters migrating from
/// upstream (which has no cluster_id) all start at the default, and the second to upgrade would
/// find its controller refusing to start.
pub fn cluster_id_claim(s: &Snapshot) -> Finding {
    const CHECK: &str = "cluster_id claim";
    let state = match &s.claims {
        None => {
            return finding(
                CHECK,
                Level::Success,
                "not checked: Neutron not asked (--skip-neutron, or a kuryr.conf without credentials)",
            );
        }
        Some(Err(e)) => return finding(CHECK, Level::Warning, format!("could not be read: {e}")),
        Some(Ok(state)) => state,
    };
    let id = &state.cluster_id;
    match judge(&state.claims, &state.uid) {
        Verdict::Unclaimed => finding(
            CHECK,
            Level::Success,
            format!(
                "cluster_id {id:?} is free in the default deployment: the controller claims it when it first leads"
            ),
        ),
        Verdict::Held { own, contested, .. } if contested.is_empty() => finding(
            CHECK,
            Level::Success,
            format!(
                "cluster_id {id:?} is this cluster's (security group {})",
                own.group
            ),
        ),
        Verdict::Held { contested, .. } => finding(
            CHECK,
            Level::Warning,
            format!(
                "cluster_id {id:?} is this cluster's, but also claimed later by another cluster (security group(s) {}):                  neither may sweep the default deployment until one gets another cluster_id",
                contested
                    .iter()
                    .map(|c| c.group.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Verdict::Taken { holder, .. } => finding(
            CHECK,
            Level::Failure,
            format!(
                "cluster_id {id:?} is claimed by another Kubernetes cluster (security group {}, kube-system uid {};                  this one's is {}): the controller would refuse to start. Set [kubernetes] cluster_id to a value of                  this cluster's own before upgrading",
                holder.group,
                holder.uid.as_deref().unwrap_or("unreadable"),
                state.uid
            ),
        ),
    }
}

/// Every check, in the order they are printed.
pub fn run_all(s: &Snapshot) -> Vec<Finding> {
    vec![
        legacy_annotations(s),
        crd_versions(s),
        crd_fields(s),
        adopted_objects(s),
        pool_settings(s),
        credentials(s),
        cluster_id_claim(s),
    ]
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

    const GOOD: &str = "[kubernetes]\nvif_pool_driver = neutron\n\
        [neutron]\nauth_type = noauth\nendpoint_override = http://127.0.0.1:9696\n\
        [neutron_defaults]\nproject = p\npod_subnet = s\npod_security_groups = sg\n\
        [vif_pool]\nports_pool_min = 5\nports_pool_max = 20\n";

    fn clean() -> Snapshot {
        Snapshot {
            crds: expected_crds()
                .into_iter()
                .map(|(name, v)| {
                    (
                        name,
                        InstalledCrd {
                            served: vec![v.clone()],
                            storage: Some(v),
                            fields: None,
                        },
                    )
                })
                .collect(),
            nodes: 3,
            config: Some(config(GOOD)),
            port_quota: Some(Ok(PortQuota { limit: 100, used: 10 })),
            ..Snapshot::default()
        }
    }

    fn claim(group: &str, uid: &str, at: &str) -> Claim {
        Claim {
            group: group.into(),
            project_id: "p".into(),
            uid: Some(uid.into()),
            created_at: Some(at.into()),
            tagged: true,
        }
    }

    #[test]
    fn a_cluster_id_another_cluster_claimed_fails_before_the_upgrade() {
        let state = |claims: Vec<Claim>| ClaimState {
            cluster_id: "kubernetes".into(),
            uid: "mine".into(),
            claims,
        };
        let with = |claims| Snapshot {
            claims: Some(Ok(state(claims))),
            ..clean()
        };
        assert_eq!(cluster_id_claim(&with(vec![])).level, Level::Success);
        let mine = claim("g1", "mine", "2026-11-30T00:00:00Z");
        let f = cluster_id_claim(&with(vec![mine.clone()]));
        assert_eq!(f.level, Level::Success);
        assert!(f.detail.contains("g1"), "{f:?}");
        let theirs = claim("g2", "theirs", "2026-11-29T00:00:00Z");
        let f = cluster_id_claim(&with(vec![mine.clone(), theirs.clone()]));
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail.contains("g2") && f.detail.contains("theirs") && f.detail.contains("mine"),
            "{f:?}"
        );
        let later = claim("g3", "theirs", "2026-12-01T00:00:00Z");
        assert_eq!(cluster_id_claim(&with(vec![mine, later])).level, Level::Warning);
        let unread = Snapshot {
            claims: Some(Err("refused".into())),
            ..clean()
        };
        assert_eq!(cluster_id_claim(&unread).level, Level::Warning);
    }

    #[test]
    fn a_clean_cluster_passes_every_check() {
        for f in run_all(&clean()) {
            assert_eq!(f.level, Level::Success, "{f:?}");
        }
    }

    #[test]
    fn legacy_annotations_fail_and_name_the_pods() {
        let s = Snapshot {
            legacy_annotated_pods: (0..7).map(|i| format!("ns/p{i}")).collect(),
            ..clean()
        };
        let f = legacy_annotations(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail.contains("7 pod(s)") && f.detail.contains("ns/p0") && f.detail.contains("2 more"),
            "{f:?}"
        );
    }

    #[test]
    fn missing_or_unserved_crds_fail_and_another_storage_version_warns() {
        let mut s = clean();
        s.crds.remove("kuryrportpools.openstack.org");
        let f = crd_versions(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail.contains("missing: kuryrportpools.openstack.org"),
            "{f:?}"
        );

        let mut s = clean();
        if let Some(crd) = s.crds.get_mut("kuryrports.openstack.org") {
            crd.served = vec!["v1beta1".into()];
        }
        let f = crd_versions(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail
                .contains("kuryrports.openstack.org (serves v1beta1, needs v1)"),
            "{f:?}"
        );

        let mut s = clean();
        if let Some(crd) = s.crds.get_mut("kuryrnetworks.openstack.org") {
            crd.served.push("v2".into());
            crd.storage = Some("v2".into());
        }
        assert_eq!(crd_versions(&s).level, Level::Warning);
    }

    #[test]
    fn a_crd_without_the_fields_kuryr_rs_writes_fails_naming_them() {
        let installed = |strip: &[&str]| -> Snapshot {
            let mut s = clean();
            for crd in kuryr_crds::generate::crds() {
                let name = crd.metadata.name.clone().unwrap_or_default();
                let version = crd
                    .spec
                    .versions
                    .iter()
                    .find(|v| v.storage)
                    .map(|v| v.name.clone());
                let mut fields = schema_fields(&crd, version.as_deref().unwrap_or_default());
                fields.retain(|f| !strip.iter().any(|s| f == s || f.starts_with(&format!("{s}."))));
                if let Some(c) = s.crds.get_mut(&name) {
                    c.fields = Some(fields);
                }
            }
            s
        };
        let f = crd_fields(&installed(&[]));
        assert_eq!(f.level, Level::Success, "{f:?}");
        let f = crd_fields(&installed(&["spec.listener_acls"]));
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail
                .contains("kuryrloadbalancers.openstack.org lacks spec.listener_acls"),
            "{f:?}"
        );
        // A schema that keeps unknown fields under spec keeps them.
        let mut s = installed(&["spec.listener_acls"]);
        if let Some(Some(fields)) = s
            .crds
            .get_mut("kuryrloadbalancers.openstack.org")
            .map(|c| c.fields.as_mut())
        {
            fields.insert("spec.*".into());
        }
        assert_eq!(crd_fields(&s).level, Level::Success);
        // Fields not read (an older snapshot) are not judged.
        assert_eq!(crd_fields(&clean()).level, Level::Success);
    }

    #[test]
    fn upstream_kuryrports_are_reported_as_adopted() {
        let s = Snapshot {
            upstream_kuryrports: vec!["default/web".into()],
            kuryrnetworks: 2,
            ..clean()
        };
        let f = adopted_objects(&s);
        assert_eq!(f.level, Level::Success);
        assert!(
            f.detail.contains("1 KuryrPort(s)") && f.detail.contains("default/web"),
            "{f:?}"
        );
    }

    #[test]
    fn pool_settings_that_contradict_each_other_or_the_quota_fail() {
        let s = Snapshot {
            config: Some(config(&GOOD.replace("ports_pool_min = 5", "ports_pool_min = 30"))),
            ..clean()
        };
        let f = pool_settings(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail
                .contains("ports_pool_min = 30 is above ports_pool_max = 20"),
            "{f:?}"
        );
        // 30 * 3 nodes = 90 > 100 - 10? no: 90 fits; the quota is a separate failure below.
        let s = Snapshot {
            port_quota: Some(Ok(PortQuota { limit: 20, used: 10 })),
            ..clean()
        };
        let f = pool_settings(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(
            f.detail
                .contains("pre-creates 15 ports, but the port quota leaves 10"),
            "{f:?}"
        );
        let s = Snapshot {
            port_quota: Some(Err("connection refused".into())),
            ..clean()
        };
        assert_eq!(pool_settings(&s).level, Level::Warning);
        let s = Snapshot {
            port_quota: Some(Ok(PortQuota { limit: -1, used: 500 })),
            ..clean()
        };
        assert_eq!(pool_settings(&s).level, Level::Success);
    }

    #[test]
    fn deployments_without_credentials_fail_naming_the_section() {
        let s = Snapshot {
            config: Some(config(&format!("{GOOD}[deployment:east]\npod_subnet = s2\n"))),
            ..clean()
        };
        let f = credentials(&s);
        assert_eq!(f.level, Level::Failure);
        assert!(f.detail.contains("[deployment:east] auth_type"), "{f:?}");
    }

    #[test]
    fn the_exit_code_is_the_worst_level() {
        assert_eq!(Level::Success.exit_code(), 0);
        assert_eq!(Level::Warning.exit_code(), 1);
        assert_eq!(Level::Failure.exit_code(), 2);
        assert!(Level::Failure > Level::Warning && Level::Warning > Level::Success);
    }
}
