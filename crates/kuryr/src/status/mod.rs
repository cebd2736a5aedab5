//! `kuryr status`: upgrade and sanity checks (upstream's `kuryr-k8s-status upgrade check` and
//! `kuryr-k8s-sanity`). `gather` reads the cluster (and Neutron's port quota) into a
//! [`checks::Snapshot`]; `checks` decides; `run` prints one line per check and exits with the
//! worst level (0 success, 1 warning, 2 failure), so CI can gate an upgrade on it.

pub mod checks;

use std::process::ExitCode;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use kuryr_config::{KuryrConfig, VifPoolDriver};
use kuryr_controller::cluster_claim;
use kuryr_crds::names::annotations;
use serde_json::Value;

use self::checks::{ClaimState, InstalledCrd, Level, PortQuota, Snapshot};
use crate::cli::StatusArgs;
use crate::kubeclient;
use crate::manifests::base::{CONFIG_KEY, CONFIG_MAP};

/// Field kuryr-rs adds to each recorded VIF; a KuryrPort without it was written by upstream.
const KURYR_RS_VIF_FIELD: &str = "kuryrRsOrigin";

async fn list_or_empty<K>(api: Api<K>) -> anyhow::Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        // The kind is not installed (a missing CRD is a finding of its own).
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

fn kuryr_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "openstack.org".into(),
        version: "v1".into(),
        api_version: "openstack.org/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn key(obj: &impl ResourceExt) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// A KuryrPort with VIFs none of which carries kuryr-rs' own field.
fn written_by_upstream(kp: &DynamicObject) -> bool {
    let Some(vifs) = kp.data.pointer("/status/vifs").and_then(Value::as_object) else {
        return false;
    };
    !vifs.is_empty() && vifs.values().all(|v| v.get(KURYR_RS_VIF_FIELD).is_none())
}

async fn port_quota(config: &KuryrConfig) -> Option<Result<PortQuota, String>> {
    if config.kubernetes.vif_pool_driver == VifPoolDriver::Noop {
        return None;
    }
    let project = config.neutron_defaults.project.clone()?;
    let result = async {
        // Only the default deployment's client: another deployment without credentials is a
        // finding of its own and must not hide the quota.
        let section = config
            .deployment(kuryr_config::DEFAULT_DEPLOYMENT)
            .ok_or("no [neutron] section")?;
        let opts =
            kuryr_controller::openstack::client_options("neutron", section).map_err(|e| e.to_string())?;
        let client = kuryr_neutron::NeutronClient::new(&opts).map_err(|e| e.to_string())?;
        let details = client
            .get_quota_details(&project)
            .await
            .map_err(|e| e.to_string())?;
        let port = details.get("port").ok_or("Neutron reported no port quota")?;
        Ok(PortQuota {
            limit: port.limit,
            used: port.used + port.reserved,
        })
    }
    .await;
    Some(result)
}

/// Whether the default deployment's credentials are complete here (not left in a Secret).
fn has_secret(config: &KuryrConfig) -> bool {
    let Some(s) = config.deployment(kuryr_config::DEFAULT_DEPLOYMENT) else {
        return false;
    };
    s.cloud.is_some()
        || match s.auth_type.map(|t| t.as_str()) {
            Some("password" | "v3password") => s.password.is_some(),
            Some("v3applicationcredential" | "applicationcredential" | "application_credential") => {
                s.application_credential_secret.is_some()
            }
            _ => true,
        }
}

/// The `cluster_id` claims in the default deployment and this cluster's kube-system uid.
async fn claims(client: &Client, config: &KuryrConfig) -> Result<ClaimState, String> {
    let uid = cluster_claim::cluster_uid(client)
        .await
        .map_err(|e| format!("reading the kube-system namespace: {e}"))?;
    let section = config
        .deployment(kuryr_config::DEFAULT_DEPLOYMENT)
        .ok_or("no [neutron] section")?;
    let opts = kuryr_controller::openstack::client_options("neutron", section).map_err(|e| e.to_string())?;
    let neutron = kuryr_neutron::NeutronClient::new(&opts).map_err(|e| e.to_string())?;
    let cluster_id = config.kubernetes.cluster_id.clone();
    let claims = cluster_claim::read_claims(&neutron, &cluster_id)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ClaimState {
        cluster_id,
        uid,
        claims,
    })
}

/// Reads what the checks need.
pub async fn gather(
    client: &Client,
    config: Option<KuryrConfig>,
    ask_neutron: bool,
) -> anyhow::Result<Snapshot> {
    let pods = list_or_empty(Api::<Pod>::all(client.clone()))
        .await
        .context("listing pods")?;
    let legacy_annotated_pods = pods
        .iter()
        .filter(|p| p.annotations().contains_key(annotations::VIF))
        .map(key)
        .collect();
    let crds = list_or_empty(Api::<CustomResourceDefinition>::all(client.clone()))
        .await
        .context("listing CRDs")?
        .into_iter()
        .map(|crd| {
            let storage = crd
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .map(|v| v.name.clone());
            let installed = InstalledCrd {
                served: crd
                    .spec
                    .versions
                    .iter()
                    .filter(|v| v.served)
                    .map(|v| v.name.clone())
                    .collect(),
                fields: storage.as_deref().map(|v| checks::schema_fields(&crd, v)),
                storage,
            };
            (crd.name_any(), installed)
        })
        .collect();
    let kps = list_or_empty(Api::<DynamicObject>::all_with(
        client.clone(),
        &kuryr_resource("KuryrPort", "kuryrports"),
    ))
    .await
    .context("listing KuryrPorts")?;
    let kns = list_or_empty(Api::<DynamicObject>::all_with(
        client.clone(),
        &kuryr_resource("KuryrNetwork", "kuryrnetworks"),
    ))
    .await
    .context("listing KuryrNetworks")?;
    let nodes = list_or_empty(Api::<Node>::all(client.clone()))
        .await
        .context("listing nodes")?
        .len();
    let port_quota = match (&config, ask_neutron) {
        (Some(c), true) => port_quota(c).await,
        _ => None,
    };
    // An installed kuryr.conf (the ConfigMap) has its credentials in the controller's Secret:
    // Neutron is only asked with a --config-file that has them.
    let claims = match (&config, ask_neutron) {
        (Some(c), true) if has_secret(c) => Some(claims(client, c).await),
        _ => None,
    };
    Ok(Snapshot {
        legacy_annotated_pods,
        crds,
        upstream_kuryrports: kps.iter().filter(|kp| written_by_upstream(kp)).map(key).collect(),
        kuryrnetworks: kns.len(),
        nodes,
        config,
        port_quota,
        claims,
    })
}

/// kuryr.conf from `--config-file`, else from the install's ConfigMap.
async fn cluster_config(client: &Client, namespace: &str) -> anyhow::Result<Option<KuryrConfig>> {
    let cm = match Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(CONFIG_MAP)
        .await
    {
        Ok(cm) => cm,
        Err(kube::Error::Api(e)) if e.code == 404 => None,
        Err(e) => return Err(e).context(format!("reading ConfigMap {namespace}/{CONFIG_MAP}")),
    };
    let Some(text) = cm.and_then(|cm| cm.data).and_then(|mut d| d.remove(CONFIG_KEY)) else {
        return Ok(None);
    };
    // Its credentials are in the controller's Secret (`kuryr manifests`), not here.
    let loaded = KuryrConfig::from_ini_str_without_credentials(&text)
        .with_context(|| format!("ConfigMap {namespace}/{CONFIG_MAP} key {CONFIG_KEY}"))?;
    Ok(Some(loaded.config))
}

/// The findings for a cluster reached through `client`; `file_config` wins over the ConfigMap.
pub async fn report(
    client: &Client,
    file_config: Option<KuryrConfig>,
    namespace: &str,
    ask_neutron: bool,
) -> anyhow::Result<Vec<checks::Finding>> {
    let config = match file_config {
        Some(c) => Some(c),
        None => cluster_config(client, namespace).await?,
    };
    let snapshot = gather(client, config, ask_neutron).await?;
    Ok(checks::run_all(&snapshot))
}

async fn findings(args: &StatusArgs) -> anyhow::Result<Vec<checks::Finding>> {
    let file_config = if args.config.config_file.is_empty() && args.config.config_dir.is_empty() {
        None
    } else {
        Some(args.config.load()?.config)
    };
    let connect_with = file_config.clone().unwrap_or_default();
    let client = kubeclient::client(&args.kube, &connect_with).await?;
    report(&client, file_config, &args.namespace, !args.skip_neutron).await
}

/// One line per finding and the overall result; the exit code is the worst level.
pub fn print(findings: &[checks::Finding]) -> ExitCode {
    let width = findings.iter().map(|f| f.check.len()).max().unwrap_or(0);
    for f in findings {
        println!("{:<8} {:<width$}  {}", f.level.to_string(), f.check, f.detail);
    }
    let worst = findings.iter().map(|f| f.level).max().unwrap_or(Level::Success);
    println!("result: {worst}");
    ExitCode::from(worst.exit_code())
}

/// Prints the findings; a cluster that cannot be read is a failure too (exit 2).
pub async fn run(args: StatusArgs) -> ExitCode {
    match findings(&args).await {
        Ok(f) => print(&f),
        Err(e) => {
            eprintln!("kuryr status: {e:#}");
            ExitCode::from(Level::Failure.exit_code())
        }
    }
}
