//! The public IP of a `type: LoadBalancer` Service (upstream's `[kubernetes] service_public_ip_driver =
//! neutron_floating_ip`): a floating IP associated with the load balancer's VIP port.
//!
//! - [`decide`] (pure): what the KuryrLoadBalancer spec and the recorded `status.service_pub_ip_info` call
//!   for. `spec.lb_ip` (the Service's `loadBalancerIP`) names a floating IP the user allocated
//!   (`alloc_method: user`, associated and disassociated, never deleted); otherwise one is allocated from
//!   `[neutron_defaults] external_svc_net` / `external_svc_subnet` (`alloc_method: pool`, deleted on release).
//! - [`PublicIps`] (acting): the Neutron calls. A pool floating IP is created already associated (one call)
//!   with a description naming the cluster and the Service, so one made by a controller killed before the
//!   status write is found again instead of duplicated, and the orphan sweep can tell whose it is; the
//!   ownership tags follow in a second call (Neutron takes no tags in a floating IP create).

use kuryr_crds::LbPubIpInfo;
use kuryr_neutron::{ErrorKind, FloatingIp, FloatingIpCreate, ListFilter, NeutronClient, Taggable};

use crate::error::Error;

pub const ALLOC_USER: &str = "user";
pub const ALLOC_POOL: &str = "pool";

/// Where a Service's public IP comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// A floating IP of the external network, allocated for the Service.
    Pool,
    /// The floating IP with this address, allocated by the user beforehand.
    User(String),
}

/// What to do about a Service's public IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    Acquire(Want),
    Release(LbPubIpInfo),
    /// The wanted IP changed (`loadBalancerIP` set, changed or removed): release the old one, then acquire.
    Replace {
        old: LbPubIpInfo,
        new: Want,
    },
}

/// The step for a Service of type `spec_type` with `loadBalancerIP` `lb_ip`, given what is recorded.
pub fn decide(spec_type: Option<&str>, lb_ip: Option<&str>, recorded: Option<&LbPubIpInfo>) -> Step {
    if spec_type != Some("LoadBalancer") {
        return match recorded {
            Some(r) => Step::Release(r.clone()),
            None => Step::Nothing,
        };
    }
    let want = match lb_ip {
        Some(ip) if !ip.is_empty() => Want::User(ip.to_string()),
        _ => Want::Pool,
    };
    match recorded {
        None => Step::Acquire(want),
        Some(r) => {
            let same = match &want {
                Want::Pool => r.alloc_method == ALLOC_POOL,
                // The address the Service already has, pinned by `loadBalancerIP` (as users do
                // to keep it): kept, still the Service's own, deleted with it.
                Want::User(ip) => r.ip_addr == *ip,
            };
            if same {
                Step::Nothing
            } else {
                Step::Replace {
                    old: r.clone(),
                    new: want,
                }
            }
        }
    }
}

/// Description of a pool floating IP: which cluster and Service it belongs to (set in the create, so it is
/// there even when the controller dies before the tags are).
pub fn description(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!(
        "{} {}",
        kuryr_crds::names::neutron::cluster_tag(cluster_id),
        super::service_tag(namespace, name)
    )
}

/// The `<ns>/<name>` of the Service a description written by [`description`] for `cluster_id` names.
pub fn service_of_description<'a>(cluster_id: &str, description: &'a str) -> Option<&'a str> {
    let rest = description.strip_prefix(&kuryr_crds::names::neutron::cluster_tag(cluster_id))?;
    rest.strip_prefix(" kuryr-rs.service=")
}

/// The external network options.
#[derive(Debug, Clone, Default)]
pub struct External {
    pub network: Option<String>,
    pub subnet: Option<String>,
}

pub struct PublicIps<'a> {
    pub neutron: &'a NeutronClient,
    pub external: External,
    /// Ownership tags (the cluster's and the Service's).
    pub tags: Vec<String>,
    /// See [`description`].
    pub description: String,
}

fn neutron_err(context: String) -> impl FnOnce(kuryr_neutron::Error) -> Error {
    move |e| Error::openstack(context, e)
}

impl PublicIps<'_> {
    /// Acquires the public IP and associates it with `vip_port`.
    pub async fn acquire(&self, want: &Want, project_id: &str, vip_port: &str) -> Result<LbPubIpInfo, Error> {
        match want {
            Want::User(ip) => self.acquire_user(ip, vip_port).await,
            Want::Pool => self.acquire_pool(project_id, vip_port).await,
        }
    }

    /// What must hold before the public IP recorded now is let go for `want`: a user's floating
    /// IP must exist and be free (or on `vip_port` already), so that a typo in
    /// `loadBalancerIP` costs the Service nothing. Returns the floating IP found.
    pub async fn check_wanted(&self, want: &Want, vip_port: &str) -> Result<Option<FloatingIp>, Error> {
        let Want::User(ip) = want else {
            return Ok(None);
        };
        let found = self
            .neutron
            .list_floatingips(&ListFilter::new().eq("floating_ip_address", ip.clone()))
            .await
            .map_err(neutron_err(format!("looking up floating IP {ip}")))?;
        let Some(fip) = found.into_iter().next() else {
            return Err(Error::invalid(
                "spec.loadBalancerIP",
                format!("no floating IP {ip} exists: allocate it in Neutron first"),
            ));
        };
        match fip.port_id.as_deref() {
            Some(p) if p != vip_port => Err(Error::invalid(
                "spec.loadBalancerIP",
                format!("floating IP {ip} is in use by port {p}"),
            )),
            _ => Ok(Some(fip)),
        }
    }

    async fn acquire_user(&self, ip: &str, vip_port: &str) -> Result<LbPubIpInfo, Error> {
        let want = Want::User(ip.to_string());
        let Some(fip) = self.check_wanted(&want, vip_port).await? else {
            return Err(Error::invalid(
                "spec.loadBalancerIP",
                format!("{ip}: not a user's floating IP"),
            ));
        };
        if fip.port_id.is_none() {
            self.associate(&fip, vip_port).await?;
        }
        Ok(LbPubIpInfo {
            ip_id: fip.id,
            ip_addr: fip.floating_ip_address,
            alloc_method: ALLOC_USER.into(),
        })
    }

    /// The pool floating IP made for this Service before (a crash between create and status write).
    pub async fn find_own(&self) -> Result<Vec<FloatingIp>, Error> {
        let Some(net) = &self.external.network else {
            return Ok(Vec::new());
        };
        self.neutron
            .list_floatingips(
                &ListFilter::new()
                    .eq("floating_network_id", net.clone())
                    .eq("description", self.description.clone()),
            )
            .await
            .map_err(neutron_err("looking up the Service's floating IP".into()))
    }

    /// Deletes the pool floating IPs [`Self::find_own`] finds (ones a crash left unrecorded);
    /// how many there were.
    pub async fn release_own(&self) -> Result<usize, Error> {
        let own = self.find_own().await?;
        let n = own.len();
        for fip in own {
            tracing::info!(fip = %fip.id, ip = %fip.floating_ip_address, "releasing an unrecorded floating IP of the Service");
            let info = LbPubIpInfo {
                ip_id: fip.id,
                ip_addr: fip.floating_ip_address,
                alloc_method: ALLOC_POOL.into(),
            };
            self.release(&info, None).await?;
        }
        Ok(n)
    }

    async fn acquire_pool(&self, project_id: &str, vip_port: &str) -> Result<LbPubIpInfo, Error> {
        let Some(net) = self.external.network.clone().filter(|n| !n.is_empty()) else {
            return Err(Error::invalid(
                "[neutron_defaults] external_svc_net",
                "is not set: a Service of type LoadBalancer needs it to allocate its floating IP",
            ));
        };
        let fip = match self.find_own().await?.into_iter().next() {
            Some(fip) => {
                tracing::info!(fip = %fip.id, ip = %fip.floating_ip_address, "adopting the Service's floating IP");
                if fip.port_id.as_deref() != Some(vip_port) {
                    self.associate(&fip, vip_port).await?;
                }
                fip
            }
            None => {
                let req = FloatingIpCreate {
                    floating_network_id: net.clone(),
                    subnet_id: self.external.subnet.clone().filter(|s| !s.is_empty()),
                    port_id: Some(vip_port.to_string()),
                    project_id: Some(project_id.to_string()),
                    description: Some(self.description.clone()),
                    ..FloatingIpCreate::default()
                };
                self.neutron
                    .create_floatingip(&req)
                    .await
                    .map_err(|e| self.explain(e, &net))?
            }
        };
        if !self.tags.iter().all(|t| fip.tags.contains(t)) {
            self.neutron
                .replace_tags(Taggable::FloatingIp, &fip.id, &self.tags)
                .await
                .map_err(neutron_err(format!("tagging floating IP {}", fip.id)))?;
        }
        Ok(LbPubIpInfo {
            ip_id: fip.id,
            ip_addr: fip.floating_ip_address,
            alloc_method: ALLOC_POOL.into(),
        })
    }

    /// Makes sure the recorded public IP points at `vip_port` (one read; a write only when it
    /// does not: a replaced or rebuilt load balancer has a new VIP port, and Neutron let the IP go
    /// with the old one). False when the IP no longer exists.
    pub async fn ensure_on(&self, info: &LbPubIpInfo, vip_port: &str) -> Result<bool, Error> {
        let fip = match self.neutron.get_floatingip(&info.ip_id).await {
            Ok(fip) => fip,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => {
                return Err(neutron_err(format!("reading floating IP {}", info.ip_addr))(e));
            }
        };
        if fip.port_id.as_deref() != Some(vip_port) {
            tracing::info!(ip = %info.ip_addr, vip_port, was = ?fip.port_id, "public IP not on the VIP port: pointing it there");
            self.associate(&fip, vip_port).await?;
        }
        Ok(true)
    }

    async fn associate(&self, fip: &FloatingIp, vip_port: &str) -> Result<(), Error> {
        self.neutron
            .update_floatingip_port(&fip.id, Some(vip_port))
            .await
            .map(|_| ())
            .map_err(|e| self.explain(e, &fip.floating_network_id))
    }

    /// Neutron's refusals that only the operator can fix, as errors naming the option.
    fn explain(&self, e: kuryr_neutron::Error, net: &str) -> Error {
        match e.kind() {
            Some(ErrorKind::ExternalGatewayForFloatingIpNotFound) => Error::invalid(
                "[neutron_defaults] external_svc_net",
                format!(
                    "network {net} is not reachable from the load balancer's VIP subnet: a router needs its \
                     gateway on {net} and an interface on the service subnet ({e})"
                ),
            ),
            Some(ErrorKind::NetworkNotFound | ErrorKind::BadRequest | ErrorKind::SubnetNotFound) => {
                Error::invalid(
                    "[neutron_defaults] external_svc_net",
                    format!("network {net} cannot give floating IPs: {e}"),
                )
            }
            _ => Error::openstack(format!("floating IP on network {net}"), e),
        }
    }

    /// Releases a public IP: a pool one is deleted, a user one only disassociated, and only from
    /// the Service's VIP port (`vip_port`, when known: the user may have moved it meanwhile).
    /// Already gone is fine.
    pub async fn release(&self, info: &LbPubIpInfo, vip_port: Option<&str>) -> Result<(), Error> {
        let r = if info.alloc_method == ALLOC_USER {
            match self.neutron.get_floatingip(&info.ip_id).await {
                Ok(fip) if fip.port_id.is_none() => Ok(()),
                Ok(fip) if vip_port.is_some_and(|v| !v.is_empty() && fip.port_id.as_deref() != Some(v)) => {
                    tracing::info!(ip = %info.ip_addr, port = ?fip.port_id,
                        "the user's floating IP was moved to another port: left there");
                    Ok(())
                }
                Ok(_) => self
                    .neutron
                    .update_floatingip_port(&info.ip_id, None)
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            }
        } else {
            self.neutron.delete_floatingip(&info.ip_id).await
        };
        match r {
            Err(e) if !e.is_not_found() => Err(Error::openstack(
                format!("releasing floating IP {}", info.ip_addr),
                e,
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, ip: &str) -> LbPubIpInfo {
        LbPubIpInfo {
            ip_id: "f".into(),
            ip_addr: ip.into(),
            alloc_method: method.into(),
        }
    }

    #[test]
    fn cluster_ip_services_have_none_and_release_what_they_had() {
        assert_eq!(decide(Some("ClusterIP"), None, None), Step::Nothing);
        assert_eq!(decide(None, Some("1.2.3.4"), None), Step::Nothing);
        let had = info(ALLOC_POOL, "172.24.4.10");
        assert_eq!(decide(Some("ClusterIP"), None, Some(&had)), Step::Release(had));
    }

    #[test]
    fn load_balancer_services_acquire_from_the_pool_or_the_user() {
        assert_eq!(
            decide(Some("LoadBalancer"), None, None),
            Step::Acquire(Want::Pool)
        );
        assert_eq!(
            decide(Some("LoadBalancer"), Some(""), None),
            Step::Acquire(Want::Pool)
        );
        assert_eq!(
            decide(Some("LoadBalancer"), Some("172.24.4.7"), None),
            Step::Acquire(Want::User("172.24.4.7".into()))
        );
    }

    #[test]
    fn what_is_recorded_and_still_wanted_costs_nothing() {
        let pool = info(ALLOC_POOL, "172.24.4.10");
        assert_eq!(decide(Some("LoadBalancer"), None, Some(&pool)), Step::Nothing);
        let user = info(ALLOC_USER, "172.24.4.7");
        assert_eq!(
            decide(Some("LoadBalancer"), Some("172.24.4.7"), Some(&user)),
            Step::Nothing
        );
        // The pool's address pinned by loadBalancerIP: kept (it was released, then looked for).
        assert_eq!(
            decide(Some("LoadBalancer"), Some("172.24.4.10"), Some(&pool)),
            Step::Nothing
        );
    }

    #[test]
    fn a_changed_load_balancer_ip_replaces_the_public_ip() {
        let pool = info(ALLOC_POOL, "172.24.4.10");
        assert_eq!(
            decide(Some("LoadBalancer"), Some("172.24.4.7"), Some(&pool)),
            Step::Replace {
                old: pool,
                new: Want::User("172.24.4.7".into())
            }
        );
        let user = info(ALLOC_USER, "172.24.4.7");
        assert_eq!(
            decide(Some("LoadBalancer"), Some("172.24.4.8"), Some(&user)),
            Step::Replace {
                old: user.clone(),
                new: Want::User("172.24.4.8".into())
            }
        );
        assert_eq!(
            decide(Some("LoadBalancer"), None, Some(&user)),
            Step::Replace {
                old: user,
                new: Want::Pool
            }
        );
    }

    #[test]
    fn descriptions_name_cluster_and_service() {
        let d = description("c1", "demo", "web");
        assert_eq!(service_of_description("c1", &d), Some("demo/web"));
        assert_eq!(service_of_description("c2", &d), None);
        assert_eq!(service_of_description("c1", "kuryr_lb"), None);
    }
}
