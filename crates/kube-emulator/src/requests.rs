//! Request counters by verb and resource (`list pods`, `patch kuryrports`, `watch pods`, ...), so
//! benchmarks can say how many API requests a client made per object it handled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::Method;

/// Shared counters; cheap to clone.
#[derive(Clone, Default)]
pub struct RequestStats(Arc<Mutex<BTreeMap<String, u64>>>);

impl RequestStats {
    pub fn record(&self, method: &Method, path: &str, query: Option<&str>) {
        let key = classify(method, path, query);
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    /// Requests per `<verb> <resource>` since the start or the last [`RequestStats::reset`].
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn reset(&self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

/// `<verb> <resource>[/<subresource>]` in Kubernetes' verb names; anything that is not a resource
/// path (discovery, `/version`, health) is `discovery`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> String {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.first() {
        Some(&"api") if segs.len() > 2 => &segs[2..],
        Some(&"apis") if segs.len() > 3 => &segs[3..],
        _ => return "discovery".into(),
    };
    let (watch_prefix, rest) = match rest.first() {
        Some(&"watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    let rest = match rest {
        ["namespaces", _, plural, tail @ ..] => {
            let mut v = vec![*plural];
            v.extend_from_slice(tail);
            v
        }
        other => other.to_vec(),
    };
    let Some(plural) = rest.first() else {
        return "discovery".into();
    };
    let named = rest.len() > 1;
    let resource = match rest.get(2) {
        Some(sub) => format!("{plural}/{sub}"),
        None => (*plural).to_string(),
    };
    let watch = watch_prefix
        || query.is_some_and(|q| {
            q.split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1" || kv == "watch=True")
        });
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    format!("{verb} {resource}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_and_resources() {
        let c = |m: Method, p: &str, q: Option<&str>| classify(&m, p, q);
        assert_eq!(c(Method::GET, "/api/v1/namespaces/a/pods", None), "list pods");
        assert_eq!(
            c(Method::GET, "/api/v1/pods", Some("watch=true&rv=1")),
            "watch pods"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/watch/namespaces/a/pods", None),
            "watch pods"
        );
        assert_eq!(c(Method::GET, "/api/v1/namespaces/a/pods/p", None), "get pods");
        assert_eq!(c(Method::GET, "/api/v1/namespaces/a", None), "get namespaces");
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/a/pods/p/binding", None),
            "create pods/binding"
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/openstack.org/v1/namespaces/a/kuryrports/p",
                None
            ),
            "patch kuryrports"
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/openstack.org/v1/namespaces/a/kuryrports/p/status",
                None
            ),
            "update kuryrports/status"
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/a/pods", None),
            "deletecollection pods"
        );
        assert_eq!(c(Method::GET, "/apis/openstack.org/v1", None), "discovery");
        assert_eq!(c(Method::GET, "/version", None), "discovery");
    }

    #[test]
    fn counts_accumulate_and_reset() {
        let s = RequestStats::default();
        s.record(&Method::GET, "/api/v1/namespaces/a/pods/p", None);
        s.record(&Method::GET, "/api/v1/namespaces/b/pods/q", None);
        assert_eq!(s.snapshot().get("get pods"), Some(&2));
        s.reset();
        assert!(s.snapshot().is_empty());
    }
}
