//! KuryrPortPool persistence (docs/architecture.md#port-pools): pool membership lives in the Kubernetes API, written
//! off the hit path by a flusher that coalesces changes (at most one write per pool per
//! [`FLUSH_INTERVAL`]), and read back for restart recovery together with the KuryrPorts.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kuryr_crds::{KuryrPort, KuryrPortPool, KuryrPortPoolStatus, PoolFixedIp, PoolPort, Vif};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::driver::PoolDriver;
use super::recover::{InUsePort, RecoveryInput};
use super::state::{Entry, Key};
use crate::drivers::pool::{ORIGIN_FIELD, VifOrigin, holder};
use crate::error::{Error, is_not_found};
use crate::k8s::remove_finalizer;
use kuryr_crds::names::finalizers;

/// KuryrPorts per list request when all of them are read.
const KUBE_PAGE: u32 = 500;
/// How often a KuryrPort list whose continue token expired is started again before it fails.
const LIST_RESTARTS: u32 = 3;

/// Changes are collected this long before a write.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Writes and reads the KuryrPortPool objects of the controller namespace.
pub struct Persister {
    kube: kube::Client,
    namespace: String,
    /// Objects known to exist (skips the create attempt).
    created: Mutex<HashSet<String>>,
}

fn pool_port(e: &Entry<Vif>, subnet_id: &str) -> PoolPort {
    PoolPort {
        port_id: e.port_id.clone(),
        mac_address: e.data.address().unwrap_or_default().to_string(),
        fixed_ips: e
            .data
            .fixed_ips()
            .map(|(_, ip)| PoolFixedIp {
                subnet_id: subnet_id.to_string(),
                ip_address: ip.to_string(),
            })
            .collect(),
        vlan_id: e.data.vlan_id(),
        since: Time(e.since),
        released_by: e.released_by.clone(),
    }
}

/// The port ids (and kuryr-rs origins) a KuryrPort's `status.vifs` records. Read from raw JSON
/// so that one object kuryr-rs cannot fully parse still protects its ports.
pub fn kuryrport_ports(meta: &ObjectMeta, obj: &Value) -> Vec<InUsePort> {
    let Some(vifs) = obj.pointer("/status/vifs").and_then(Value::as_object) else {
        return Vec::new();
    };
    let pod_uid = obj
        .pointer("/spec/podUid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ids = vifs.values().filter_map(|entry| {
        let id = entry
            .pointer("/vif/versioned_object.data/id")
            .and_then(Value::as_str)?;
        Some((
            id.to_string(),
            entry
                .get(ORIGIN_FIELD)
                .and_then(|o| VifOrigin::deserialize(o).ok()),
        ))
    });
    in_use(
        meta.namespace.as_deref(),
        meta.name.as_deref(),
        pod_uid,
        meta.deletion_timestamp.is_some(),
        ids,
    )
}

/// One [`InUsePort`] per recorded port id, with its origin if kuryr-rs could read it (a port
/// whose origin it cannot read is protected all the same).
fn in_use(
    namespace: Option<&str>,
    name: Option<&str>,
    pod_uid: &str,
    terminating: bool,
    ids: impl Iterator<Item = (String, Option<VifOrigin>)>,
) -> Vec<InUsePort> {
    let holder = match (namespace, name) {
        (Some(ns), Some(name)) => Some(holder(ns, name, pod_uid)),
        _ => (!pod_uid.is_empty()).then(|| pod_uid.to_string()),
    };
    ids.map(|(port_id, origin)| InUsePort {
        port_id,
        origin,
        holder: holder.clone(),
        terminating,
    })
    .collect()
}

/// What the pools read of a KuryrPort: which ports it records and for whom, nothing else. The
/// sweep and recovery read every KuryrPort of the cluster; parsed whole, a page of 500 was ~7 MB
/// of JSON trees at the peak of a 10,000-pod burst, this is a few strings per object.
#[derive(Deserialize)]
struct PortsOf {
    metadata: PortsOfMeta,
    #[serde(default)]
    spec: PortsOfSpec,
    #[serde(default)]
    status: PortsOfStatus,
}

#[derive(Deserialize)]
struct PortsOfMeta {
    name: Option<String>,
    namespace: Option<String>,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<IgnoredAny>,
}

#[derive(Default, Deserialize)]
struct PortsOfSpec {
    #[serde(rename = "podUid")]
    pod_uid: Option<String>,
}

#[derive(Default, Deserialize)]
struct PortsOfStatus {
    vifs: Option<BTreeMap<String, RecordedPort>>,
}

/// A `status.vifs` entry: `vif.versioned_object.data.id` and the kuryr-rs origin.
#[derive(Deserialize)]
struct RecordedPort {
    vif: RecordedPortVif,
    #[serde(rename = "kuryrRsOrigin")]
    origin: Option<Value>,
}

#[derive(Deserialize)]
struct RecordedPortVif {
    #[serde(rename = "versioned_object.data")]
    data: RecordedPortId,
}

#[derive(Deserialize)]
struct RecordedPortId {
    id: String,
}

/// A page of a KuryrPort list, its items left as text until each is read.
#[derive(Deserialize)]
struct KuryrPortPage<'a> {
    #[serde(default)]
    metadata: ListMeta,
    /// `null` reads as no items, as kube's own list type takes it.
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

/// The ports one listed KuryrPort records. An object the slim reader does not take (an entry
/// without a port id, a field of an unexpected type) is read whole, as [`kuryrport_ports`] does;
/// one that does not parse at all fails the page, so that the sweep never takes its ports for
/// orphans.
fn listed_kuryrport_ports(item: &RawValue) -> Result<Vec<InUsePort>, serde_json::Error> {
    if let Ok(kp) = serde_json::from_str::<PortsOf>(item.get()) {
        let meta = kp.metadata;
        let ids = kp.status.vifs.unwrap_or_default().into_values().map(|p| {
            let origin = p.origin.and_then(|o| serde_json::from_value(o).ok());
            (p.vif.data.id, origin)
        });
        return Ok(in_use(
            meta.namespace.as_deref(),
            meta.name.as_deref(),
            kp.spec.pod_uid.as_deref().unwrap_or_default(),
            meta.deletion_timestamp.is_some(),
            ids,
        ));
    }
    let kp: DynamicObject = serde_json::from_str(item.get())?;
    Ok(kuryrport_ports(&kp.metadata, &kp.data))
}

impl Persister {
    pub fn new(kube: kube::Client, namespace: impl Into<String>) -> Self {
        Self {
            kube,
            namespace: namespace.into(),
            created: Mutex::default(),
        }
    }

    /// Forgets which objects exist (leadership lost: another leader may delete them meanwhile).
    pub async fn forget_created(&self) {
        self.created.lock().await.clear();
    }

    fn api(&self) -> Api<KuryrPortPool> {
        Api::namespaced(self.kube.clone(), &self.namespace)
    }

    /// The object and status of one pool as the driver holds it now.
    fn render(&self, driver: &PoolDriver, key: &Key) -> Result<Option<KuryrPortPool>, Error> {
        let st = driver.lock();
        let Some(pool) = st.get(key) else {
            return Ok(None);
        };
        let limits = st.limits();
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let mut obj = KuryrPortPool::for_key(
            &self.namespace,
            driver.crd_key(key),
            clamp(limits.min),
            clamp(limits.batch),
            clamp(limits.max),
            limits.ttl.map(|t| t.as_secs()),
        )
        .map_err(|e| Error::invalid(format!("pool {key}"), e.to_string()))?;
        // Named at creation; the pool tag on its ports must keep matching the object.
        obj.metadata.name = Some(pool.meta.name.clone());
        obj.spec.vif_driver = Some(driver.vif().name().to_string());
        let subnet_id = key.subnet_id();
        let subnet = subnet_id.as_str();
        let mut status = KuryrPortPoolStatus {
            available: pool.available().map(|e| pool_port(e, subnet)).collect(),
            recyclable: pool.recyclable().map(|e| pool_port(e, subnet)).collect(),
            last_refill_time: pool.last_refill().map(Time),
            last_error: pool.last_error().map(|e| e.0.message.clone()),
            last_error_time: pool.last_error().map(|e| Time(e.1)),
            ..KuryrPortPoolStatus::default()
        };
        status.update_counts();
        obj.status = Some(status);
        Ok(Some(obj))
    }

    async fn write(&self, obj: &KuryrPortPool) -> Result<(), Error> {
        let name = obj.metadata.name.clone().unwrap_or_default();
        let api = self.api();
        if !self.created.lock().await.contains(&name) {
            let mut bare = obj.clone();
            bare.status = None;
            match api.create(&PostParams::default(), &bare).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    // Left by an earlier run: its limits may predate a config change.
                    let spec = serde_json::json!({ "spec": obj.spec });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&spec))
                        .await?;
                }
                Err(e) => return Err(e.into()),
            }
            self.created.lock().await.insert(name.clone());
        }
        let patch = serde_json::json!({ "status": obj.status });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => {
                // Deleted behind our back: create it again on the next flush.
                self.created.lock().await.remove(&name);
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes every pool changed since the last flush. Pools whose write failed stay dirty.
    pub async fn flush(&self, driver: &PoolDriver) -> Result<usize, Error> {
        let dirty = driver.lock().take_dirty();
        let mut written = 0;
        let mut failed = Vec::new();
        let mut first = None;
        for key in dirty {
            let res = match self.render(driver, &key) {
                Ok(Some(obj)) => self.write(&obj).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            match res {
                Ok(()) => written += 1,
                Err(e) => {
                    tracing::warn!(pool = %key, error = %e, "could not write KuryrPortPool");
                    failed.push(key);
                    first.get_or_insert(e);
                }
            }
        }
        driver.lock().mark_dirty(failed);
        first.map_or(Ok(written), Err)
    }

    /// Flushes whenever the driver reports a change, at most once per [`FLUSH_INTERVAL`],
    /// and once more on stop.
    pub async fn run(self: Arc<Self>, driver: Arc<PoolDriver>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = self.flush(&driver).await;
                    return;
                }
                _ = driver.changed() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(FLUSH_INTERVAL) => {}
            }
            if let Err(e) = self.flush(&driver).await {
                tracing::debug!(error = %e, "KuryrPortPool flush failed; retrying");
                driver.touched();
            }
        }
    }

    /// Aligns the KuryrPortPool objects with the pools (after recovery): an object being
    /// deleted frees its pool (spare ports deleted) and loses the kuryr-rs finalizer; an object
    /// naming no pool of any driver (freed and emptied) is deleted. Returns how many objects
    /// were released.
    pub async fn reconcile(&self, drivers: &[Arc<PoolDriver>]) -> Result<usize, Error> {
        let api = self.api();
        let mut released = 0;
        for obj in api.list(&ListParams::default()).await?.items {
            let Some(name) = obj.metadata.name.clone() else {
                continue;
            };
            let owner = drivers
                .iter()
                .find_map(|d| d.key_by_name(&name).map(|k| (d.clone(), k)));
            let deleting = obj.metadata.deletion_timestamp.is_some();
            if !deleting && owner.is_some() {
                continue;
            }
            if let Some((driver, key)) = &owner
                && let Err(e) = driver.drop_pool(key).await
            {
                tracing::warn!(pool = %name, error = %e, "some ports of a released pool are left to the orphan sweep");
            }
            self.created.lock().await.remove(&name);
            remove_finalizer(&self.kube, &obj, finalizers::KURYRPORTPOOL).await?;
            if !deleting {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            tracing::info!(pool = %name, deleted_by_user = deleting, "KuryrPortPool released");
            released += 1;
        }
        Ok(released)
    }

    /// Deletes the KuryrPortPool object `name` (its pool was dropped), finalizer first.
    pub async fn delete(&self, name: &str) -> Result<(), Error> {
        self.created.lock().await.remove(name);
        let api = self.api();
        let Some(obj) = api.get_opt(name).await? else {
            return Ok(());
        };
        remove_finalizer(&self.kube, &obj, finalizers::KURYRPORTPOOL).await?;
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The pool objects of the controller namespace and every port the KuryrPorts record.
    pub async fn load_recovery_input(&self) -> Result<RecoveryInput, Error> {
        let pools = self.api().list(&ListParams::default()).await?.items;
        let in_use = self
            .collect_recorded(|all: &mut Vec<InUsePort>, ports| all.extend(ports))
            .await?;
        Ok(RecoveryInput { pools, in_use })
    }

    /// Port ids recorded by KuryrPorts (the orphan sweep's "owned by a pod").
    pub async fn ports_in_use(&self) -> Result<HashSet<String>, Error> {
        self.collect_recorded(|ids: &mut HashSet<String>, ports| {
            ids.extend(ports.into_iter().map(|u| u.port_id))
        })
        .await
    }

    /// Folds the ports every KuryrPort of the cluster records into a `T`, a page at a time and
    /// each page only for them: with ten thousand pods the whole list parsed is tens of MB of
    /// JSON, and the sweep reads it every update period. A list whose continue token expired
    /// (the server's history compacted while paging) is read again from the start, into a new
    /// `T`: what it misses the sweep would delete, and the server's inconsistent continuation
    /// may miss objects.
    async fn collect_recorded<T: Default>(
        &self,
        mut add: impl FnMut(&mut T, Vec<InUsePort>),
    ) -> Result<T, Error> {
        let mut restarts = 0;
        'list: loop {
            let mut params = ListParams::default().limit(KUBE_PAGE);
            let mut acc = T::default();
            loop {
                let request = kube::core::Request::new(KuryrPort::url_path(&(), None))
                    .list(&params)
                    .map_err(kube::Error::BuildRequest)?;
                let text = match self.kube.request_text(request).await {
                    Ok(text) => text,
                    Err(kube::Error::Api(s))
                        if s.code == 410 && params.continue_token.is_some() && restarts < LIST_RESTARTS =>
                    {
                        restarts += 1;
                        tracing::info!(
                            restarts,
                            "KuryrPort list outlasted the API server's history; listing again"
                        );
                        continue 'list;
                    }
                    Err(e) => return Err(e.into()),
                };
                let page: KuryrPortPage = serde_json::from_str(&text).map_err(kube::Error::SerdeError)?;
                for item in page.items.unwrap_or_default() {
                    add(
                        &mut acc,
                        listed_kuryrport_ports(item).map_err(kube::Error::SerdeError)?,
                    );
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Ok(acc),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kuryrport_ports_reads_ids_and_origins_from_raw_status() {
        let obj = serde_json::json!({
            "status": {"vifs": {
                "eth0": {
                    "default": true,
                    "vif": {"versioned_object.data": {"id": "p1"}, "versioned_object.name": "VIFOpenVSwitch"},
                    "kuryrRsOrigin": {
                        "deployment": "default", "host": "n1", "projectId": "pr", "networkId": "net",
                        "securityGroups": ["sg"], "driver": "neutron-vif"
                    }
                },
                "eth1": {"vif": {"versioned_object.data": {"id": "p2"}}, "kuryrRsOrigin": {"bad": 1}},
                "eth2": {"vif": "garbage"}
            }}
        });
        let meta = ObjectMeta {
            namespace: Some("ns".into()),
            name: Some("pod".into()),
            ..ObjectMeta::default()
        };
        let mut ports = kuryrport_ports(&meta, &obj);
        ports.sort_by(|a, b| a.port_id.cmp(&b.port_id));
        assert_eq!(ports.len(), 2);
        // No podUid: the pod is known by its name, as the pools know it when it asked.
        assert_eq!(ports[0].holder.as_deref(), Some("ns/pod"));
        assert!(!ports[0].terminating);
        assert_eq!(ports[0].port_id, "p1");
        assert_eq!(ports[0].origin.as_ref().map(|o| o.host.as_str()), Some("n1"));
        // An origin kuryr-rs cannot read still protects the port.
        assert_eq!(ports[1].port_id, "p2");
        assert!(ports[1].origin.is_none());
        assert!(kuryrport_ports(&meta, &serde_json::json!({"spec": {}})).is_empty());
        let deleting = ObjectMeta {
            deletion_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..meta
        };
        let mut with_uid = obj.clone();
        with_uid["spec"] = serde_json::json!({"podUid": "uid-1"});
        let ports = kuryrport_ports(&deleting, &with_uid);
        assert!(
            ports
                .iter()
                .all(|p| p.terminating && p.holder.as_deref() == Some("uid-1"))
        );
    }

    fn sorted(mut ports: Vec<InUsePort>) -> Vec<(String, Option<String>, bool, Option<String>)> {
        ports.sort_by(|a, b| a.port_id.cmp(&b.port_id));
        ports
            .into_iter()
            .map(|p| (p.port_id, p.holder, p.terminating, p.origin.map(|o| o.host)))
            .collect()
    }

    fn listed(obj: &Value) -> Result<Vec<InUsePort>, serde_json::Error> {
        let text = obj.to_string();
        let raw: &RawValue = serde_json::from_str(&text)?;
        listed_kuryrport_ports(raw)
    }

    #[test]
    fn a_listed_kuryrport_yields_the_ports_the_whole_object_reader_finds() {
        let origin = serde_json::json!({
            "deployment": "default", "host": "n1", "projectId": "pr", "networkId": "net",
            "securityGroups": ["sg"], "driver": "neutron-vif"
        });
        let vif = |id: &str| {
            serde_json::json!({
                "versioned_object.data": {"id": id, "address": "fa:16:3e:00:00:01", "network": {"versioned_object.data": {"id": "net"}}},
                "versioned_object.name": "VIFOpenVSwitch"
            })
        };
        let objects = [
            // What the kuryrport handler writes: read by the slim reader.
            serde_json::json!({
                "apiVersion": "openstack.org/v1", "kind": "KuryrPort",
                "metadata": {"name": "pod", "namespace": "ns", "uid": "kp-1", "finalizers": ["kuryr.openstack.org/kuryrport-finalizer"]},
                "spec": {"podUid": "uid-1", "podNodeName": "n1"},
                "status": {"vifs": {
                    "eth0": {"default": true, "vif": vif("p1"), "kuryrRsOrigin": origin},
                    "eth1": {"default": false, "vif": vif("p2"), "kuryrRsOrigin": {"bad": 1}}
                }}
            }),
            // Being deleted, no podUid: held by its name.
            serde_json::json!({
                "metadata": {"name": "pod", "namespace": "ns", "deletionTimestamp": "2026-11-28T00:00:00Z"},
                "status": {"vifs": {"eth0": {"vif": vif("p3")}}}
            }),
            // No ports yet.
            serde_json::json!({"metadata": {"name": "new", "namespace": "ns"}, "spec": {"podUid": "u"}}),
            serde_json::json!({"metadata": {"name": "new", "namespace": "ns"}, "status": {"vifs": null}}),
            // Entries the slim reader does not take: the object is read whole instead.
            serde_json::json!({
                "metadata": {"name": "odd", "namespace": "ns"},
                "status": {"vifs": {"eth0": {"vif": vif("p4")}, "eth1": {"vif": "garbage"}, "eth2": {"vif": {"versioned_object.data": {}}}}}
            }),
            serde_json::json!({"metadata": {"name": "odd", "namespace": "ns"}, "spec": null, "status": {"vifs": {"eth0": {"vif": vif("p5")}}}}),
        ];
        for obj in &objects {
            let kp: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
            let whole = sorted(kuryrport_ports(&kp.metadata, &kp.data));
            assert_eq!(sorted(listed(obj).unwrap()), whole, "{obj}");
        }
        // The cases the slim reader takes itself, and what it finds.
        assert!(serde_json::from_value::<PortsOf>(objects[0].clone()).is_ok());
        assert!(serde_json::from_value::<PortsOf>(objects[4].clone()).is_err());
        let first = sorted(listed(&objects[0]).unwrap());
        assert_eq!(
            first,
            vec![
                ("p1".into(), Some("uid-1".into()), false, Some("n1".into())),
                ("p2".into(), Some("uid-1".into()), false, None),
            ]
        );
        assert_eq!(
            sorted(listed(&objects[1]).unwrap()),
            vec![("p3".into(), Some("ns/pod".into()), true, None)]
        );
        assert_eq!(sorted(listed(&objects[4]).unwrap()).len(), 1);
    }

    #[test]
    fn a_listed_kuryrport_that_does_not_parse_fails_its_page() {
        // The sweep must not take the ports of an object it cannot read for orphans.
        assert!(listed(&serde_json::json!({"metadata": "garbage"})).is_err());
        assert!(listed(&serde_json::json!({"metadata": {"name": 5}})).is_err());
        let page: KuryrPortPage = serde_json::from_str(
            r#"{"apiVersion": "v1", "kind": "List", "metadata": {"continue": "abc"}, "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}"#,
        )
        .unwrap();
        assert_eq!(page.items.map(|i| i.len()), Some(2));
        let empty: KuryrPortPage = serde_json::from_str(r#"{"metadata": {}, "items": null}"#).unwrap();
        assert!(empty.items.unwrap_or_default().is_empty());
        assert_eq!(page.metadata.continue_.as_deref(), Some("abc"));
    }
}
