//! The daemon's HTTP API wire format (upstream compatible) and its errors.
//!
//! Endpoints (all `POST`, JSON body = [`CniRequest`]):
//! - `/addNetwork` -> 202, body = the default (eth0) VIF as os-vif JSON
//!   (exactly what upstream returns, so the upstream Go plugin works).
//!   kuryr-rs extension: `/addNetwork?all=1` -> 202,
//!   body = `{"vif": <eth0 VIF>, "result": {interfaces, ips, routes, dns}}`
//!   where `result` is a CNI 1.0 result (without `cniVersion`) listing every
//!   interface of the pod; the kuryr-rs plugin always asks for it.
//! - `/delNetwork` -> 204.
//! - kuryr-rs extensions: `/checkNetwork` -> 204 (CNI CHECK), `/status` ->
//!   200 when ready (CNI STATUS), `/gc` -> 204 (CNI GC; `config_kuryr`
//!   carries `cni.dev/valid-attachments`, required: an empty list tears
//!   down every attachment, a missing one is a 400).
//!
//! A `CNI_NETNS` that is the daemon's own network namespace is a 400: the
//! daemon deletes links by name there. `config_kuryr.kuryr_daemon_timeout`
//! (seconds; the kuryr-rs plugin sends the one it waits) bounds an ADD: it
//! answers (504 when it timed out) before the plugin hangs up.
//!
//! Errors: `{"code": int, "msg": str, "details": str}` with HTTP 400/code 4
//! (bad parameters), 410/3 (pod gone or UID mismatch), 504/11 (timed out,
//! try again later), 500/999 (anything else), 503/50 (STATUS: not ready).
//! The same body answers what never reaches a command ([`ApiError`]):
//! malformed HTTP 400/4, unknown path 404/4, wrong method 405/4, head or
//! body too large 431/413 with code 4, head or body too slow 408/11, every
//! connection slot busy 503/11.

mod error;
pub mod fields;

pub use error::*;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::registry::PodKey;

/// The request body the plugins send (upstream Go plugin keys).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CniRequest {
    #[serde(rename = "CNI_IFNAME", default)]
    pub ifname: String,
    #[serde(rename = "CNI_NETNS", default)]
    pub netns: String,
    #[serde(rename = "CNI_PATH", default)]
    pub path: String,
    #[serde(rename = "CNI_COMMAND", default)]
    pub command: String,
    #[serde(rename = "CNI_CONTAINERID", default)]
    pub container_id: String,
    #[serde(rename = "CNI_ARGS", default)]
    pub args: String,
    #[serde(default)]
    pub config_kuryr: Value,
}

impl CniRequest {
    /// Parse a body, naming the field that is wrong: every `CNI_*` key is a
    /// string (or absent/null), `config_kuryr` an object (or absent/null);
    /// unknown keys are ignored, as upstream does.
    pub fn from_json(body: &[u8]) -> Result<Self, DaemonError> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| DaemonError::BadParams(format!("request body is not JSON: {e}")))?;
        let Value::Object(mut o) = v else {
            return Err(DaemonError::BadParams("request body is not a JSON object".into()));
        };
        let mut text = |key: &str| match o.remove(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(DaemonError::BadParams(format!("{key} must be a string"))),
        };
        let req = Self {
            ifname: text("CNI_IFNAME")?,
            netns: text("CNI_NETNS")?,
            path: text("CNI_PATH")?,
            command: text("CNI_COMMAND")?,
            container_id: text("CNI_CONTAINERID")?,
            args: text("CNI_ARGS")?,
            config_kuryr: match o.remove("config_kuryr") {
                None | Some(Value::Null) => Value::Null,
                Some(v @ Value::Object(_)) => v,
                Some(_) => {
                    return Err(DaemonError::BadParams(
                        "config_kuryr must be a JSON object".into(),
                    ));
                }
            },
        };
        fields::command(&req.command).map_err(DaemonError::BadParams)?;
        Ok(req)
    }
}

/// What a request asks for; it decides which fields are required.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
}

/// A request with its `CNI_ARGS` parsed and checked.
#[derive(Clone, Debug)]
pub struct CniParams {
    pub req: CniRequest,
    pub key: PodKey,
    pub pod_uid: Option<String>,
}

impl CniParams {
    /// Parse the body; `K8S_POD_NAMESPACE` and `K8S_POD_NAME` are required
    /// and must be Kubernetes names, `K8S_POD_UID` a UID when set.
    pub fn parse(body: &[u8]) -> Result<Self, DaemonError> {
        let req = CniRequest::from_json(body)?;
        let mut ns = None;
        let mut name = None;
        let mut uid = None;
        for kv in req.args.split(';').filter(|s| !s.is_empty()) {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(DaemonError::BadParams(format!(
                    "CNI_ARGS entry {:?} is not K=V",
                    kv.chars().take(64).collect::<String>()
                )));
            };
            match k {
                "K8S_POD_NAMESPACE" => ns = Some(v.to_string()),
                "K8S_POD_NAME" => name = Some(v.to_string()),
                "K8S_POD_UID" if !v.is_empty() => uid = Some(v.to_string()),
                _ => {}
            }
        }
        let ns = ns
            .filter(|s| !s.is_empty())
            .ok_or_else(|| DaemonError::BadParams("CNI_ARGS: K8S_POD_NAMESPACE is missing".into()))?;
        let name = name
            .filter(|s| !s.is_empty())
            .ok_or_else(|| DaemonError::BadParams("CNI_ARGS: K8S_POD_NAME is missing".into()))?;
        let bad = |e: String| DaemonError::BadParams(format!("CNI_ARGS: {e}"));
        fields::namespace(&ns).map_err(bad)?;
        fields::pod_name(&name).map_err(bad)?;
        if let Some(uid) = &uid {
            fields::pod_uid(uid).map_err(bad)?;
        }
        Ok(Self {
            req,
            key: PodKey::new(ns, name),
            pod_uid: uid,
        })
    }

    /// Every field `command` needs is set and well formed. DEL takes empty
    /// fields (the runtime may have lost the namespace or the container),
    /// but not malformed ones; one with an empty CNI_CONTAINERID never
    /// matches a recorded container, so it is answered as stale.
    pub fn validate(&self, command: Command) -> Result<(), DaemonError> {
        let r = &self.req;
        if command != Command::Del {
            for (name, v) in [
                ("CNI_IFNAME", &r.ifname),
                ("CNI_NETNS", &r.netns),
                ("CNI_CONTAINERID", &r.container_id),
            ] {
                if v.is_empty() {
                    return Err(DaemonError::BadParams(format!("{name} is missing")));
                }
            }
        }
        if !r.ifname.is_empty() {
            crate::netlink::validate_ifname(&r.ifname)
                .map_err(|e| DaemonError::BadParams(format!("CNI_IFNAME: {e}")))?;
        }
        if !r.netns.is_empty() {
            fields::netns_path(&r.netns).map_err(DaemonError::BadParams)?;
        }
        if !r.container_id.is_empty() {
            fields::container_id(&r.container_id).map_err(DaemonError::BadParams)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cni_args_are_parsed_and_checked() {
        let body = json!({"CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_CONTAINERID": "c",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c;K8S_POD_UID=u1",
            "config_kuryr": {}});
        let p = CniParams::parse(body.to_string().as_bytes());
        let p = p.ok();
        assert_eq!(p.as_ref().map(|p| p.key.to_string()), Some("ns/p".into()));
        assert_eq!(p.and_then(|p| p.pod_uid), Some("u1".into()));
        let e = CniParams::parse(br#"{"CNI_ARGS":"K8S_POD_NAME=p"}"#).err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.to_string().contains("K8S_POD_NAMESPACE") && e.code() == 4)
        );
        assert!(CniParams::parse(b"{").is_err());
        assert!(CniParams::parse(br#"{"CNI_ARGS":"garbage"}"#).is_err());
        let p = CniParams::parse(br#"{"CNI_ARGS":"K8S_POD_NAMESPACE=n;K8S_POD_NAME=p"}"#).ok();
        assert!(p.as_ref().is_some_and(|p| {
            p.validate(Command::Add)
                .is_err_and(|e| e.to_string().contains("CNI_IFNAME"))
        }));
        assert!(p.is_some_and(|p| p.validate(Command::Del).is_ok()));
    }
}
