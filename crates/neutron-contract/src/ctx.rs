//! Per-case context: a client, a private project, fixtures, assertions on typed errors, and the cleanup sweep.

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use kuryr_neutron::{
    ClientOptions, Error, ErrorKind, ListFilter, Network, NetworkCreate, NeutronClient, Port, PortCreate,
    PortUpdate, RouterInterfaceSpec, Subnet, SubnetCreate, TrunkCreate,
};
use serde_json::Value;

pub struct Ctx {
    pub client: NeutronClient,
    /// For the few checks the typed client cannot express (unknown attributes, raw link shapes).
    pub raw: reqwest::Client,
    pub base_url: String,
    /// This case's project: every resource is created in it, the sweep deletes it.
    pub project: String,
    pub case: &'static str,
}

impl Ctx {
    pub fn new(base_url: &str, case: &'static str) -> anyhow::Result<Self> {
        let mut opts = ClientOptions::noauth(base_url);
        opts.timeout = Some(Duration::from_secs(120));
        let client = NeutronClient::new(&opts)?;
        let raw = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(120))
            .build()?;
        let short = uuid::Uuid::new_v4().simple().to_string();
        Ok(Self {
            client,
            raw,
            base_url: base_url.trim_end_matches('/').to_owned(),
            project: format!("contract-{}-{}", case.replace('_', "-"), &short[..8]),
            case,
        })
    }

    /// A network with one IPv4 subnet (no DHCP) in this case's project.
    pub async fn network(&self, cidr: &str) -> anyhow::Result<(Network, Subnet)> {
        let net = self
            .client
            .create_network(&NetworkCreate {
                name: Some(format!("{}-net", self.case)),
                project_id: Some(self.project.clone()),
                ..NetworkCreate::default()
            })
            .await
            .context("create network")?;
        let subnet = self.subnet(&net.id, cidr).await?;
        Ok((net, subnet))
    }

    pub async fn subnet(&self, network_id: &str, cidr: &str) -> anyhow::Result<Subnet> {
        self.client
            .create_subnet(&SubnetCreate {
                network_id: network_id.to_owned(),
                ip_version: 4,
                cidr: Some(cidr.to_owned()),
                name: Some(format!("{}-subnet", self.case)),
                project_id: Some(self.project.clone()),
                enable_dhcp: Some(false),
                ..SubnetCreate::default()
            })
            .await
            .with_context(|| format!("create subnet {cidr}"))
    }

    /// A port request in this project.
    pub fn port_req(&self, network_id: &str) -> PortCreate {
        PortCreate {
            project_id: Some(self.project.clone()),
            ..PortCreate::new(network_id)
        }
    }

    /// A trunk request on `port_id` in this project.
    pub fn trunk_req(&self, port_id: &str) -> TrunkCreate {
        TrunkCreate {
            port_id: port_id.to_owned(),
            project_id: Some(self.project.clone()),
            ..TrunkCreate::default()
        }
    }

    pub async fn port(&self, req: PortCreate) -> anyhow::Result<Port> {
        self.client.create_port(&req).await.context("create port")
    }

    pub fn project_filter(&self) -> ListFilter {
        ListFilter::new().project_id(&self.project)
    }

    pub async fn project_ports(&self) -> anyhow::Result<Vec<Port>> {
        Ok(self.client.list_ports(&self.project_filter()).await?)
    }

    /// Poll until the port reaches `status` (or the deadline passes).
    pub async fn wait_status(&self, port_id: &str, status: &str, within: Duration) -> anyhow::Result<Port> {
        let deadline = Instant::now() + within;
        loop {
            let p = self.client.get_port(port_id).await?;
            if p.status == status {
                return Ok(p);
            }
            if Instant::now() >= deadline {
                bail!(
                    "port {port_id} still {} (vif_type {:?}, host {:?}) after {within:?}, wanted {status}",
                    p.status,
                    p.binding_vif_type,
                    p.binding_host_id
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Raw JSON request to `/v2.0{path}`: (status, body or Null).
    pub async fn raw_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut rb = self
            .raw
            .request(method, format!("{}/v2.0{path}", self.base_url))
            .header("Accept", "application/json");
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .map_err(|e| anyhow!("non-JSON answer ({status}): {e}: {text:.200}"))?
        };
        Ok((status, v))
    }

    /// Delete everything of this project, dependants first. Returns what could not be deleted.
    pub async fn sweep(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let c = &self.client;
        let pf = self.project_filter();
        let mut note = |what: String, r: Result<(), Error>| {
            if let Err(e) = r
                && !e.is_not_found()
            {
                errors.push(format!("{what}: {e}"));
            }
        };
        if let Ok(trunks) = c.list_trunks(&pf).await {
            for t in trunks {
                if !t.sub_ports.is_empty() {
                    let ids: Vec<&str> = t.sub_ports.iter().map(|s| s.port_id.as_str()).collect();
                    let _ = c.remove_subports(&t.id, &ids).await;
                }
                let mut r = c.delete_trunk(&t.id).await;
                if r.as_ref().is_err_and(|e| e.status() == Some(409)) {
                    // A trunk whose parent is bound is "in use": unbind the parent first (what Nova does on delete).
                    let unbind = PortUpdate {
                        binding_host_id: Some(String::new()),
                        device_id: Some(String::new()),
                        ..PortUpdate::default()
                    };
                    let _ = c.update_port(&t.port_id, &unbind).await;
                    r = c.delete_trunk(&t.id).await;
                }
                note(format!("trunk {}", t.id), r);
            }
        }
        // Floating IPs hold a port on the external network: they go before the ports and networks.
        if let Ok(fips) = c.list_floatingips(&pf).await {
            for f in fips {
                note(format!("floating IP {}", f.id), c.delete_floatingip(&f.id).await);
            }
        }
        if let Ok(routers) = c.list_routers(&pf).await {
            for r in routers {
                if let Ok(ports) = c.list_ports(&ListFilter::new().device_id(&r.id)).await {
                    for p in ports {
                        let spec = RouterInterfaceSpec::Port {
                            port_id: p.id.clone(),
                        };
                        let res = c.remove_router_interface(&r.id, &spec).await.map(|_| ());
                        note(format!("router {} interface {}", r.id, p.id), res);
                    }
                }
                note(format!("router {}", r.id), c.delete_router(&r.id).await);
            }
        }
        if let Ok(ports) = c.list_ports(&pf.clone().fields(["id"])).await {
            let results: Vec<_> = futures::stream::iter(ports)
                .map(|p| async move { (p.id.clone(), c.delete_port(&p.id).await) })
                .buffer_unordered(4)
                .collect()
                .await;
            for (id, r) in results {
                note(format!("port {id}"), r);
            }
        }
        if let Ok(subnets) = c.list_subnets(&pf).await {
            for s in subnets {
                note(format!("subnet {}", s.id), c.delete_subnet(&s.id).await);
            }
        }
        if let Ok(nets) = c.list_networks(&pf).await {
            for n in nets {
                note(format!("network {}", n.id), c.delete_network(&n.id).await);
            }
        }
        if let Ok(pools) = c.list_subnetpools(&pf).await {
            for p in pools {
                note(format!("subnetpool {}", p.id), c.delete_subnetpool(&p.id).await);
            }
        }
        if let Ok(sgs) = c.list_security_groups(&pf).await {
            for sg in sgs {
                note(
                    format!("security group {}", sg.id),
                    c.delete_security_group(&sg.id).await,
                );
            }
        }
        if let Ok(groups) = c.list_address_groups(&pf).await {
            for ag in groups {
                note(
                    format!("address group {}", ag.id),
                    c.delete_address_group(&ag.id).await,
                );
            }
        }
        note("quota".into(), c.reset_quota(&self.project).await);
        errors
    }
}

/// Assert that `r` failed with Neutron error `kind` and HTTP `status`.
pub fn expect_api_error<T: std::fmt::Debug>(
    r: Result<T, Error>,
    kind: ErrorKind,
    status: u16,
) -> anyhow::Result<Error> {
    match r {
        Ok(v) => bail!("expected {kind} ({status}), got success: {v:?}"),
        Err(e) => {
            let api = e
                .api()
                .ok_or_else(|| anyhow!("expected {kind} ({status}), got non-API error: {e}"))?;
            if api.kind != kind || api.status != status {
                bail!(
                    "expected {kind} ({status}), got {} ({}): {}",
                    api.kind,
                    api.status,
                    api.message
                );
            }
            Ok(e)
        }
    }
}
