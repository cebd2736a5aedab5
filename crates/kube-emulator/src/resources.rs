//! The resource registry: built-in kinds plus custom resources registered at run time from stored
//! `CustomResourceDefinition` objects. Discovery, routing and storage all read from here.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{ApiError, ApiResult, Cause};

/// An `additionalPrinterColumns` entry (or a built-in column).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub json_path: String,
    pub priority: i64,
}

/// One served resource of one group-version.
#[derive(Debug, Clone)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// Custom resources: merge patch stands in for strategic merge, schema validation applies.
    pub custom: bool,
    pub columns: Vec<PrinterColumn>,
    pub schema: Option<Arc<Value>>,
    /// Field selector labels accepted besides `metadata.name` / `metadata.namespace`.
    pub extra_fields: Vec<&'static str>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Storage key: versions of one group share storage (no conversion, like `strategy: None`).
    pub fn storage_key(&self) -> String {
        crate::error::qualified(&self.group, &self.plural)
    }

    pub fn is_pod(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }

    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    pub fn is_crd(&self) -> bool {
        self.group == "apiextensions.k8s.io" && self.plural == "customresourcedefinitions"
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    status: bool,
    categories: &'static [&'static str],
    fields: &'static [&'static str],
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// events.k8s.io/v1 (what kube-runtime's `Recorder` writes) selects on `regarding.*`.
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "reason",
    "reportingController",
    "type",
];

const BUILTINS: &[Builtin] = &[
    Builtin {
        group: "",
        version: "v1",
        kind: "Namespace",
        plural: "namespaces",
        short: &["ns"],
        namespaced: false,
        status: true,
        categories: &[],
        fields: &["status.phase"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Node",
        plural: "nodes",
        short: &["no"],
        namespaced: false,
        status: true,
        categories: &[],
        fields: &["spec.unschedulable"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
        short: &["po"],
        namespaced: true,
        status: true,
        categories: &["all"],
        fields: POD_FIELDS,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
        short: &["svc"],
        namespaced: true,
        status: true,
        categories: &["all"],
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Endpoints",
        plural: "endpoints",
        short: &["ep"],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &["ev"],
        namespaced: true,
        status: false,
        categories: &[],
        fields: EVENT_FIELDS,
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        short: &["cm"],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &["type"],
    },
    Builtin {
        group: "",
        version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        short: &["sa"],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "discovery.k8s.io",
        version: "v1",
        kind: "EndpointSlice",
        plural: "endpointslices",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: EVENTS_V1_FIELDS,
    },
    Builtin {
        group: "coordination.k8s.io",
        version: "v1",
        kind: "Lease",
        plural: "leases",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
        short: &["deploy"],
        namespaced: true,
        status: true,
        categories: &["all"],
        fields: &[],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        short: &["ds"],
        namespaced: true,
        status: true,
        categories: &["all"],
        fields: &[],
    },
    Builtin {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
        short: &["rs"],
        namespaced: true,
        status: true,
        categories: &["all"],
        fields: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        short: &[],
        namespaced: false,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        short: &[],
        namespaced: false,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "Role",
        plural: "roles",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        short: &[],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "policy",
        version: "v1",
        kind: "PodDisruptionBudget",
        plural: "poddisruptionbudgets",
        short: &["pdb"],
        namespaced: true,
        status: true,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "networking.k8s.io",
        version: "v1",
        kind: "NetworkPolicy",
        plural: "networkpolicies",
        short: &["netpol"],
        namespaced: true,
        status: false,
        categories: &[],
        fields: &[],
    },
    Builtin {
        group: "apiextensions.k8s.io",
        version: "v1",
        kind: "CustomResourceDefinition",
        plural: "customresourcedefinitions",
        short: &["crd", "crds"],
        namespaced: false,
        status: true,
        categories: &["api-extensions"],
        fields: &[],
    },
];

fn builtin_defs() -> Vec<ResourceDef> {
    BUILTINS
        .iter()
        .map(|b| ResourceDef {
            group: b.group.into(),
            version: b.version.into(),
            kind: b.kind.into(),
            list_kind: format!("{}List", b.kind),
            plural: b.plural.into(),
            singular: b.kind.to_lowercase(),
            short_names: b.short.iter().map(|s| s.to_string()).collect(),
            categories: b.categories.iter().map(|s| s.to_string()).collect(),
            namespaced: b.namespaced,
            status_subresource: b.status,
            custom: false,
            columns: Vec::new(),
            schema: None,
            extra_fields: b.fields.to_vec(),
        })
        .collect()
}

/// All served group-versions and their resources.
#[derive(Debug, Clone)]
pub struct Registry {
    /// (group, version) -> resources, ordered for stable discovery output.
    versions: BTreeMap<(String, String), Vec<Arc<ResourceDef>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        let mut reg = Self {
            versions: BTreeMap::new(),
        };
        for def in builtin_defs() {
            reg.insert(def);
        }
        reg
    }

    fn insert(&mut self, def: ResourceDef) {
        self.versions
            .entry((def.group.clone(), def.version.clone()))
            .or_default()
            .push(Arc::new(def));
    }

    /// Rebuilds the custom part from the stored CRDs (cheap; CRD writes are rare).
    pub fn rebuild<'a>(&mut self, crds: impl Iterator<Item = &'a Value>) {
        let mut fresh = Self::new();
        for crd in crds {
            // Stored CRDs were validated on write; an unparsable one is skipped rather than served wrong.
            if let Ok(defs) = defs_from_crd(crd) {
                for def in defs {
                    fresh.insert(def);
                }
            }
        }
        *self = fresh;
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.versions
            .get(&(group.to_string(), version.to_string()))?
            .iter()
            .find(|d| d.plural == plural)
            .cloned()
    }

    pub fn group_versions(&self) -> impl Iterator<Item = (&(String, String), &Vec<Arc<ResourceDef>>)> {
        self.versions.iter()
    }

    pub fn resources(&self, group: &str, version: &str) -> Option<&Vec<Arc<ResourceDef>>> {
        self.versions.get(&(group.to_string(), version.to_string()))
    }

    /// Any served version of a storage key (used for GC and namespace cleanup).
    pub fn by_storage_key(&self, key: &str) -> Option<Arc<ResourceDef>> {
        self.versions
            .values()
            .flatten()
            .find(|d| d.storage_key() == key)
            .cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceDef>> {
        self.versions.values().flatten()
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn crd_invalid(name: &str, causes: Vec<Cause>) -> ApiError {
    ApiError::invalid(
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        name,
        causes,
    )
}

/// Parses a CRD into one `ResourceDef` per served version; 422 naming the bad field otherwise.
pub fn defs_from_crd(crd: &Value) -> ApiResult<Vec<ResourceDef>> {
    let name = str_at(crd, &["metadata", "name"]).unwrap_or_default();
    let mut causes = Vec::new();
    let group = str_at(crd, &["spec", "group"]).unwrap_or_default().to_string();
    let plural = str_at(crd, &["spec", "names", "plural"])
        .unwrap_or_default()
        .to_string();
    let kind = str_at(crd, &["spec", "names", "kind"])
        .unwrap_or_default()
        .to_string();
    if group.is_empty() {
        causes.push(Cause::required("spec.group"));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural"));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind"));
    }
    let scope = str_at(crd, &["spec", "scope"]).unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::not_supported(
            "spec.scope",
            format!("Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::required("spec.versions"));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        causes.push(Cause::invalid(
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if let Some(why) = v.pointer("/schema/openAPIV3Schema").and_then(|s| {
            crate::schema::non_boolean_exclusive_bound(s, "spec.versions.schema.openAPIV3Schema")
        }) {
            return Err(ApiError::bad_request(format!(
                "CustomResourceDefinition in version \"v1\" cannot be handled as a CustomResourceDefinition: {why}"
            )));
        }
        if v.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            causes.push(Cause::required(format!("spec.versions[{i}].name")));
        }
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema")
            && !schema.is_object()
        {
            causes.push(Cause::type_invalid(
                format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "must be an object",
            ));
        }
    }
    if !causes.is_empty() {
        return Err(crd_invalid(name, causes));
    }
    let names = &crd["spec"]["names"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    let mut defs = Vec::new();
    for v in versions {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let mut columns: Vec<PrinterColumn> = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: c.get("name").and_then(Value::as_str).unwrap_or_default().into(),
                        type_: c.get("type").and_then(Value::as_str).unwrap_or("string").into(),
                        format: c.get("format").and_then(Value::as_str).unwrap_or_default().into(),
                        description: c
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .into(),
                        json_path: c
                            .get("jsonPath")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .into(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if columns.is_empty() {
            // The real defaulting adds an Age column when none are declared.
            columns.push(PrinterColumn {
                name: "Age".into(),
                type_: "date".into(),
                format: String::new(),
                description: String::new(),
                json_path: ".metadata.creationTimestamp".into(),
                priority: 0,
            });
        }
        defs.push(ResourceDef {
            group: group.clone(),
            version: v.get("name").and_then(Value::as_str).unwrap_or_default().into(),
            kind: kind.clone(),
            list_kind: names
                .get("listKind")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| format!("{kind}List")),
            plural: plural.clone(),
            singular: names
                .get("singular")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| kind.to_lowercase()),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            namespaced: scope == "Namespaced",
            status_subresource: v.pointer("/subresources/status").is_some(),
            custom: true,
            columns,
            schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
            extra_fields: Vec::new(),
        });
    }
    Ok(defs)
}
