//! Project drivers: which Neutron project a pod's (or namespace's) resources belong to.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kuryr_crds::names::annotations;

use crate::error::Error;

#[async_trait]
pub trait ProjectDriver: Send + Sync {
    /// Project of everything in `namespace`.
    async fn project_for_namespace(&self, namespace: &str) -> Result<String, Error>;
}

/// `default`: `[neutron_defaults] project` for everything.
pub struct DefaultProject {
    project: String,
}

impl DefaultProject {
    pub fn new(project: Option<&str>) -> Result<Self, Error> {
        match project {
            Some(p) if !p.is_empty() => Ok(Self {
                project: p.to_string(),
            }),
            _ => Err(Error::Config(
                "[neutron_defaults] project must be set for the default project driver".into(),
            )),
        }
    }
}

#[async_trait]
impl ProjectDriver for DefaultProject {
    async fn project_for_namespace(&self, _namespace: &str) -> Result<String, Error> {
        Ok(self.project.clone())
    }
}

/// `annotation`: the namespace's `openstack.org/kuryr-project` annotation, else the default project.
pub struct AnnotationProject {
    kube: kube::Client,
    default: Option<String>,
}

impl AnnotationProject {
    pub fn new(kube: kube::Client, default: Option<&str>) -> Self {
        Self {
            kube,
            default: default.filter(|p| !p.is_empty()).map(str::to_string),
        }
    }
}

#[async_trait]
impl ProjectDriver for AnnotationProject {
    async fn project_for_namespace(&self, namespace: &str) -> Result<String, Error> {
        let ns = Api::<Namespace>::all(self.kube.clone()).get(namespace).await?;
        match (annotated_project(&ns), &self.default) {
            (Some(p), _) if !p.is_empty() => Ok(p.to_string()),
            (Some(_), _) => Err(Error::invalid(
                format!("namespace {namespace} annotation {}", annotations::PROJECT),
                "empty project id",
            )),
            (None, Some(d)) => Ok(d.clone()),
            (None, None) => Err(Error::invalid(
                format!("namespace {namespace} annotation {}", annotations::PROJECT),
                "missing, and [neutron_defaults] project is not set",
            )),
        }
    }
}

/// A namespace's `openstack.org/kuryr-project` annotation, trimmed (`Some("")` when set empty,
/// which the `annotation` driver refuses): the one reading of it for the driver and for what
/// reads namespaces in bulk (placement's retirement of unused bindings).
pub fn annotated_project(ns: &Namespace) -> Option<&str> {
    ns.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::PROJECT))
        .map(|p| p.trim())
}

/// A project driver that could not be configured: every use is that configuration error.
pub struct UnsetProject(pub String);

#[async_trait]
impl ProjectDriver for UnsetProject {
    async fn project_for_namespace(&self, _namespace: &str) -> Result<String, Error> {
        Err(Error::Config(self.0.clone()))
    }
}
