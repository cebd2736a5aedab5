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
//!   carries `cni.dev/valid-attachments`).
//!
//! Errors: `{"code": int, "msg": str, "details": str}` with HTTP 400/code 4
//! (bad parameters), 410/3 (pod gone or UID mismatch), 504/11 (timed out,
//! try again later), 500/999 (anything else), 503/50 (STATUS: not ready).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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

/// A request with its `CNI_ARGS` parsed and checked.
#[derive(Clone, Debug)]
pub struct CniParams {
    pub req: CniRequest,
    pub key: PodKey,
    pub pod_uid: Option<String>,
}

impl CniParams {
    /// Parse the body; `K8S_POD_NAMESPACE` and `K8S_POD_NAME` are required.
    pub fn parse(body: &[u8]) -> Result<Self, DaemonError> {
        let req: CniRequest = serde_json::from_slice(body)
            .map_err(|e| DaemonError::BadParams(format!("request body is not a CNI request: {e}")))?;
        let mut ns = None;
        let mut name = None;
        let mut uid = None;
        for kv in req.args.split(';').filter(|s| !s.is_empty()) {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(DaemonError::BadParams(format!(
                    "CNI_ARGS entry {kv:?} is not K=V"
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
        Ok(Self {
            req,
            key: PodKey::new(ns, name),
            pod_uid: uid,
        })
    }

    pub fn require(&self, fields: &[&str]) -> Result<(), DaemonError> {
        for f in fields {
            let v = match *f {
                "CNI_IFNAME" => &self.req.ifname,
                "CNI_NETNS" => &self.req.netns,
                "CNI_CONTAINERID" => &self.req.container_id,
                _ => continue,
            };
            if v.is_empty() {
                return Err(DaemonError::BadParams(format!("{f} is missing")));
            }
        }
        crate::netlink::validate_ifname(&self.req.ifname)
            .map_err(|e| DaemonError::BadParams(format!("CNI_IFNAME: {e}")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    BadParams(String),
    #[error("{0}")]
    PodGone(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    Internal(String),
}

impl DaemonError {
    /// CNI error code (upstream numbering).
    pub fn code(&self) -> u32 {
        match self {
            Self::BadParams(_) => 4,
            Self::PodGone(_) => 3,
            Self::Timeout(_) => 11,
            Self::NotReady(_) => 50,
            Self::Internal(_) => 999,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadParams(_) => StatusCode::BAD_REQUEST,
            Self::PodGone(_) => StatusCode::GONE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn msg(&self) -> &'static str {
        match self {
            Self::BadParams(_) => "Required parameters are missing or invalid",
            Self::PodGone(_) => "Pod was deleted while processing the request",
            Self::Timeout(_) => "Try Again Later",
            Self::NotReady(_) => "The kuryr daemon is not ready",
            Self::Internal(_) => "Internal error",
        }
    }
}

impl IntoResponse for DaemonError {
    fn into_response(self) -> Response {
        let body = json!({"code": self.code(), "msg": self.msg(), "details": self.to_string()});
        (self.status(), axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(p.is_some_and(|p| p.require(&["CNI_NETNS"]).is_err()));
    }
}
