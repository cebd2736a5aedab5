//! RBAC authorization of ServiceAccount requests, as the real authorizer decides it: a request is
//! allowed when a ClusterRoleBinding grants a ClusterRole, or a RoleBinding in the request's
//! namespace grants a Role or ClusterRole, with a rule matching its verb, API group, resource
//! (`plural` or `plural/subresource`) and name. Nothing is ever denied explicitly. Pure: the
//! policy objects are passed in, so the rules are tested without a server.

use std::sync::Arc;

use serde_json::Value;

use crate::error::ApiError;

/// A ServiceAccount making a request (from its bearer token).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccount {
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// What a request does, in the authorizer's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// `plural`, or `plural/subresource`.
    pub resource: String,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// One permission a request was allowed to use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Used {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
}

/// The stored RBAC objects.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub cluster_roles: Vec<Arc<Value>>,
    pub cluster_role_bindings: Vec<Arc<Value>>,
    pub roles: Vec<Arc<Value>>,
    pub role_bindings: Vec<Arc<Value>>,
}

/// The request verb: `get`/`list`/`watch`/`create`/`update`/`patch`/`delete`/`deletecollection`.
pub fn verb(method: &axum::http::Method, has_name: bool, watch: bool) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if has_name => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if has_name => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or_default()
}

fn rule_matches(rule: &Value, a: &Attributes<'_>) -> bool {
    let any_or = |field: &str, want: &str| strings(&rule[field]).any(|v| v == "*" || v == want);
    if !any_or("verbs", a.verb) || !any_or("apiGroups", a.group) {
        return false;
    }
    let resource_ok = strings(&rule["resources"]).any(|r| {
        r == "*" || r == a.resource || {
            // `pods/*` matches every subresource, `*/status` every resource's status.
            match (r.split_once('/'), a.resource.split_once('/')) {
                (Some((rb, "*")), Some((ab, _))) => rb == ab,
                (Some(("*", rs)), Some((_, asub))) => rs == asub,
                _ => false,
            }
        }
    });
    if !resource_ok {
        return false;
    }
    let mut names = strings(&rule["resourceNames"]).peekable();
    names.peek().is_none() || a.name.is_some_and(|n| names.any(|r| r == n))
}

fn binds(binding: &Value, who: &ServiceAccount) -> bool {
    binding["subjects"].as_array().into_iter().flatten().any(|s| {
        let kind = str_at(s, "/kind");
        let name = str_at(s, "/name");
        match kind {
            "ServiceAccount" => name == who.name && str_at(s, "/namespace") == who.namespace,
            "User" => name == who.username(),
            "Group" => {
                name == "system:serviceaccounts"
                    || name == format!("system:serviceaccounts:{}", who.namespace)
                    || name == "system:authenticated"
            }
            _ => false,
        }
    })
}

fn rules_of<'a>(roles: &'a [Arc<Value>], name: &str, namespace: Option<&str>) -> Vec<&'a Value> {
    roles
        .iter()
        .filter(|r| {
            str_at(r, "/metadata/name") == name
                && namespace.is_none_or(|ns| str_at(r, "/metadata/namespace") == ns)
        })
        .flat_map(|r| r["rules"].as_array().into_iter().flatten())
        .collect()
}

/// Whether `who` may do `a`.
pub fn allows(policy: &Policy, who: &ServiceAccount, a: &Attributes<'_>) -> bool {
    let cluster = policy
        .cluster_role_bindings
        .iter()
        .filter(|b| binds(b, who) && str_at(b, "/roleRef/kind") == "ClusterRole")
        .flat_map(|b| rules_of(&policy.cluster_roles, str_at(b, "/roleRef/name"), None));
    let namespaced: Vec<&Value> = match a.namespace {
        Some(ns) => policy
            .role_bindings
            .iter()
            .filter(|b| str_at(b, "/metadata/namespace") == ns && binds(b, who))
            .flat_map(|b| {
                let name = str_at(b, "/roleRef/name");
                match str_at(b, "/roleRef/kind") {
                    "Role" => rules_of(&policy.roles, name, Some(ns)),
                    "ClusterRole" => rules_of(&policy.cluster_roles, name, None),
                    _ => Vec::new(),
                }
            })
            .collect(),
        None => Vec::new(),
    };
    cluster.chain(namespaced).any(|rule| rule_matches(rule, a))
}

/// The real server's 403 for a denied request.
pub fn forbidden(who: &ServiceAccount, a: &Attributes<'_>) -> ApiError {
    let (plural, sub) = match a.resource.split_once('/') {
        Some((p, s)) => (p, Some(s)),
        None => (a.resource.as_str(), None),
    };
    let qualified = if a.group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{}", a.group)
    };
    let subject = match a.name {
        Some(n) => format!("{qualified} \"{n}\""),
        None => qualified,
    };
    let what = match sub {
        Some(s) => format!("resource \"{plural}/{s}\""),
        None => format!("resource \"{plural}\""),
    };
    let scope = match a.namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".to_owned(),
    };
    let mut err = ApiError::forbidden(format!(
        "{subject} is forbidden: User \"{}\" cannot {} {what} in API group \"{}\"{scope}",
        who.username(),
        a.verb,
        a.group
    ));
    err.details.name = a.name.map(str::to_owned);
    err.details.group = Some(a.group.to_owned());
    err.details.kind = Some(plural.to_owned());
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sa() -> ServiceAccount {
        ServiceAccount {
            namespace: "kuryr".into(),
            name: "kuryr-cni".into(),
        }
    }

    fn attrs<'a>(verb: &'a str, group: &'a str, resource: &str, ns: Option<&'a str>) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource: resource.into(),
            namespace: ns,
            name: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            cluster_roles: vec![Arc::new(json!({"metadata": {"name": "cni"}, "rules": [
                {"apiGroups": ["openstack.org"], "resources": ["kuryrports"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/*"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["one"]}]}))],
            cluster_role_bindings: vec![Arc::new(json!({"metadata": {"name": "cni"},
                "roleRef": {"kind": "ClusterRole", "name": "cni"},
                "subjects": [{"kind": "ServiceAccount", "name": "kuryr-cni", "namespace": "kuryr"}]}))],
            roles: vec![Arc::new(
                json!({"metadata": {"name": "leases", "namespace": "kuryr"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]}),
            )],
            role_bindings: vec![Arc::new(
                json!({"metadata": {"name": "leases", "namespace": "kuryr"},
                "roleRef": {"kind": "Role", "name": "leases"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts:kuryr"}]}),
            )],
        }
    }

    #[test]
    fn cluster_roles_grant_their_verbs_everywhere_and_nothing_else() {
        let p = policy();
        assert!(allows(
            &p,
            &sa(),
            &attrs("list", "openstack.org", "kuryrports", None)
        ));
        assert!(allows(
            &p,
            &sa(),
            &attrs("watch", "openstack.org", "kuryrports", Some("x"))
        ));
        assert!(!allows(
            &p,
            &sa(),
            &attrs("create", "openstack.org", "kuryrports", Some("x"))
        ));
        assert!(
            !allows(&p, &sa(), &attrs("list", "", "kuryrports", None)),
            "wrong group"
        );
        let other = ServiceAccount {
            namespace: "default".into(),
            name: "kuryr-cni".into(),
        };
        assert!(!allows(
            &p,
            &other,
            &attrs("list", "openstack.org", "kuryrports", None)
        ));
    }

    #[test]
    fn subresources_names_and_role_bindings_are_scoped() {
        let p = policy();
        assert!(allows(&p, &sa(), &attrs("get", "", "pods/status", Some("a"))));
        assert!(!allows(&p, &sa(), &attrs("get", "", "pods", Some("a"))));
        let mut named = attrs("get", "", "configmaps", Some("a"));
        assert!(!allows(&p, &sa(), &named), "resourceNames need a name");
        named.name = Some("one");
        assert!(allows(&p, &sa(), &named));
        named.name = Some("two");
        assert!(!allows(&p, &sa(), &named));
        assert!(allows(
            &p,
            &sa(),
            &attrs("update", "coordination.k8s.io", "leases", Some("kuryr"))
        ));
        assert!(!allows(
            &p,
            &sa(),
            &attrs("update", "coordination.k8s.io", "leases", Some("default"))
        ));
        assert!(!allows(
            &p,
            &sa(),
            &attrs("list", "coordination.k8s.io", "leases", None)
        ));
    }

    #[test]
    fn the_403_names_user_verb_resource_group_and_scope() {
        let mut a = attrs("patch", "", "pods/status", Some("ns1"));
        a.name = Some("web");
        let e = forbidden(&sa(), &a);
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "pods \"web\" is forbidden: User \"system:serviceaccount:kuryr:kuryr-cni\" cannot patch resource \
             \"pods/status\" in API group \"\" in the namespace \"ns1\""
        );
        let status = e.to_status();
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(status["details"]["kind"], "pods");
        let e = forbidden(&sa(), &attrs("list", "openstack.org", "kuryrports", None));
        assert!(
            e.message
                .ends_with("in API group \"openstack.org\" at the cluster scope"),
            "{}",
            e.message
        );
    }
}
