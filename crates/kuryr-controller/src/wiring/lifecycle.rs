//! Acquire, activate and release all of a pod's interfaces through a [`VifSource`].
//!
//! Guarantees, for any source:
//! - [`acquire_all`] returns every planned interface or none: on the first failure the ones
//!   already acquired are released again (a failed rollback is logged; those ports carry the pod's
//!   ownership tags, by which finalize finds them);
//! - [`release_all`] attempts every interface whatever fails, and reports every failure;
//! - [`activate_all`] attempts every inactive interface and says whether anything changed, so the
//!   caller records progress even when one interface is still pending.

use async_trait::async_trait;

use super::plan::Interface;
use super::record::RecordedVif;
use crate::drivers::PodRef;
use crate::error::Error;

/// Where a pod's ports come from and go back to.
#[async_trait]
pub trait VifSource: Send + Sync {
    /// The port of one planned interface.
    async fn acquire(&self, pod: &PodRef, iface: &Interface) -> Result<RecordedVif, Error>;

    /// Marks the VIF active once its port is; ResourceNotReady while it is not.
    async fn activate(&self, vif: &mut RecordedVif) -> Result<(), Error>;

    /// Gives the port back the way it was obtained. A port already gone is success.
    async fn release(&self, vif: &RecordedVif) -> Result<(), Error>;
}

/// Acquires every interface of `plan`, in order, or none of them.
pub async fn acquire_all(
    source: &dyn VifSource,
    pod: &PodRef,
    plan: &[Interface],
) -> Result<Vec<RecordedVif>, Error> {
    let mut done = Vec::with_capacity(plan.len());
    for iface in plan {
        match source.acquire(pod, iface).await {
            Ok(v) => done.push(v),
            Err(e) => {
                if let Err(rollback) = release_all(source, &done).await {
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %rollback,
                        "rollback of a partly wired pod failed; finalize deletes its tagged ports");
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Releases every VIF; every failure is kept ([`Error::collect`]).
pub async fn release_all(source: &dyn VifSource, vifs: &[RecordedVif]) -> Result<(), Error> {
    let mut errors = Vec::new();
    for v in vifs {
        if let Err(e) = source.release(v).await {
            tracing::warn!(port = v.vif.id(), ifname = %v.ifname, error = %e, "releasing VIF failed");
            errors.push(e);
        }
    }
    Error::collect(errors)
}

/// What [`activate_all`] achieved.
#[derive(Debug, Default)]
pub struct Activation {
    /// At least one VIF became active: the status must be written again.
    pub changed: bool,
    /// Why some VIF is not active yet (the last such error).
    pub pending: Option<Error>,
}

/// Tries to activate every inactive VIF.
pub async fn activate_all(source: &dyn VifSource, vifs: &mut [RecordedVif]) -> Activation {
    let mut out = Activation::default();
    for v in vifs.iter_mut().filter(|v| !v.vif.active()) {
        match source.activate(v).await {
            Ok(()) => out.changed |= v.vif.active(),
            Err(e) => out.pending = Some(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    use kuryr_crds::Vif;

    use super::*;
    use crate::drivers::multi_vif::{PlannedVif, PortSource};
    use crate::drivers::{NetworkInfo, PortSpec};

    /// A source handing out VIFs named after their interface; `fail_*` make chosen interfaces fail.
    #[derive(Default)]
    struct FakeSource {
        fail_acquire: BTreeSet<String>,
        fail_release: BTreeSet<String>,
        not_ready: BTreeSet<String>,
        held: Mutex<BTreeSet<String>>,
        log: Mutex<Vec<String>>,
    }

    impl FakeSource {
        fn failing(acquire: &[&str], release: &[&str]) -> Self {
            Self {
                fail_acquire: acquire.iter().map(|s| s.to_string()).collect(),
                fail_release: release.iter().map(|s| s.to_string()).collect(),
                ..Self::default()
            }
        }

        fn held(&self) -> Vec<String> {
            self.held.lock().unwrap().iter().cloned().collect()
        }

        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
    }

    fn vif(port: &str) -> Vif {
        serde_json::from_value(serde_json::json!({
            "versioned_object.name": "VIFOpenVSwitch",
            "versioned_object.namespace": "os_vif",
            "versioned_object.version": "1.0",
            "versioned_object.data": {
                "id": port, "active": false, "address": "fa:16:3e:00:00:01", "plugin": "ovs",
                "vif_name": "tap0", "bridge_name": "br-int", "has_traffic_filtering": true,
                "preserve_on_delete": false,
                "network": {"versioned_object.name": "Network", "versioned_object.namespace": "os_vif",
                    "versioned_object.version": "1.1", "versioned_object.data": {"id": "net"}}
            }
        }))
        .expect("fixture VIF")
    }

    #[async_trait]
    impl VifSource for FakeSource {
        async fn acquire(&self, _pod: &PodRef, iface: &Interface) -> Result<RecordedVif, Error> {
            self.log.lock().unwrap().push(format!("acquire {}", iface.ifname));
            if self.fail_acquire.contains(&iface.ifname) {
                return Err(Error::exhausted(
                    "OverQuota",
                    format!("no port for {}", iface.ifname),
                ));
            }
            self.held.lock().unwrap().insert(iface.ifname.clone());
            Ok(RecordedVif {
                ifname: iface.ifname.clone(),
                default: iface.default,
                vif: vif(&format!("port-{}", iface.ifname)),
                origin: None,
                multi: None,
            })
        }

        async fn activate(&self, v: &mut RecordedVif) -> Result<(), Error> {
            if self.not_ready.contains(&v.ifname) {
                return Err(Error::not_ready(format!("{} is DOWN", v.ifname)));
            }
            v.vif.base_mut().active = true;
            Ok(())
        }

        async fn release(&self, v: &RecordedVif) -> Result<(), Error> {
            self.log.lock().unwrap().push(format!("release {}", v.ifname));
            if self.fail_release.contains(&v.ifname) {
                return Err(Error::Config(format!("cannot release {}", v.ifname)));
            }
            self.held.lock().unwrap().remove(&v.ifname);
            Ok(())
        }
    }

    fn pod() -> PodRef {
        PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "uid".into(),
            node: "node-1".into(),
        }
    }

    fn interfaces(names: &[&str]) -> Vec<Interface> {
        let net = Arc::new(NetworkInfo {
            id: "net".into(),
            name: "net".into(),
            mtu: None,
            subnets: vec![],
        });
        let spec = PortSpec::new("default", "project", net, vec![]);
        names
            .iter()
            .enumerate()
            .map(|(i, n)| Interface {
                ifname: n.to_string(),
                default: i == 0,
                plan: PlannedVif {
                    driver: "test",
                    ifname: Some(n.to_string()),
                    network: "net".into(),
                    source: PortSource::Pooled { spec: spec.clone() },
                },
            })
            .collect()
    }

    #[tokio::test]
    async fn acquires_every_interface_in_plan_order() {
        let src = FakeSource::default();
        let got = acquire_all(&src, &pod(), &interfaces(&["eth0", "eth1", "net1"]))
            .await
            .unwrap();
        let names: Vec<&str> = got.iter().map(|v| v.ifname.as_str()).collect();
        assert_eq!(names, ["eth0", "eth1", "net1"]);
        assert!(got[0].default && !got[1].default);
        assert_eq!(src.held(), ["eth0", "eth1", "net1"]);
    }

    #[tokio::test]
    async fn a_failed_interface_gives_back_the_ones_already_acquired() {
        let src = FakeSource::failing(&["net1"], &[]);
        let err = acquire_all(&src, &pod(), &interfaces(&["eth0", "eth1", "net1", "net2"]))
            .await
            .unwrap_err();
        assert_eq!(
            err.label(),
            "OverQuota",
            "the acquire error is what the caller sees"
        );
        assert!(src.held().is_empty(), "nothing left acquired: {:?}", src.held());
        assert_eq!(
            src.log(),
            [
                "acquire eth0",
                "acquire eth1",
                "acquire net1",
                "release eth0",
                "release eth1"
            ],
            "net2 is never attempted"
        );
    }

    #[tokio::test]
    async fn release_reports_every_failure_and_still_releases_the_rest() {
        let src = FakeSource::failing(&[], &["eth0", "net1"]);
        let vifs = acquire_all(&src, &pod(), &interfaces(&["eth0", "eth1", "net1"]))
            .await
            .unwrap();
        let err = release_all(&src, &vifs).await.unwrap_err();
        let Error::Multiple(errors) = &err else {
            panic!("two failures must both be reported: {err}");
        };
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].contains("cannot release eth0") && text[1].contains("cannot release net1"));
        assert_eq!(src.held(), ["eth0", "net1"], "eth1 was released");
        assert!(release_all(&FakeSource::default(), &[]).await.is_ok());
    }

    #[tokio::test]
    async fn activation_records_progress_while_one_interface_is_pending() {
        let src = FakeSource {
            not_ready: ["eth1".to_string()].into(),
            ..FakeSource::default()
        };
        let mut vifs = acquire_all(&src, &pod(), &interfaces(&["eth0", "eth1"]))
            .await
            .unwrap();
        let a = activate_all(&src, &mut vifs).await;
        assert!(a.changed, "eth0 became active");
        assert!(matches!(a.pending, Some(Error::ResourceNotReady(_))));
        assert!(vifs[0].vif.active() && !vifs[1].vif.active());
        // Nothing left that can change: no write needed.
        let again = activate_all(&src, &mut vifs[..1]).await;
        assert!(!again.changed && again.pending.is_none());
    }
}
