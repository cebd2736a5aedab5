//! Typed resource calls.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::json;

use super::{Call, NeutronClient};
use crate::error::Result;
use crate::filter::ListFilter;
use crate::types::*;

/// One page of a list, with the marker of the next page when the server announced one.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_marker: Option<String>,
}

impl NeutronClient {
    // ------------------------------------------------------------ networks

    pub async fn create_network(&self, req: &NetworkCreate) -> Result<Network> {
        self.create_one("create_network", "networks", "network", req)
            .await
    }
    pub async fn get_network(&self, id: &str) -> Result<Network> {
        self.get_one("get_network", &["networks", id], "network").await
    }
    pub async fn list_networks(&self, filter: &ListFilter) -> Result<Vec<Network>> {
        self.list_all_of("list_networks", "networks", filter).await
    }
    pub async fn delete_network(&self, id: &str) -> Result<()> {
        self.delete_at("delete_network", &["networks", id]).await
    }

    // ------------------------------------------------------------ subnets

    pub async fn create_subnet(&self, req: &SubnetCreate) -> Result<Subnet> {
        self.create_one("create_subnet", "subnets", "subnet", req).await
    }
    pub async fn get_subnet(&self, id: &str) -> Result<Subnet> {
        self.get_one("get_subnet", &["subnets", id], "subnet").await
    }
    pub async fn list_subnets(&self, filter: &ListFilter) -> Result<Vec<Subnet>> {
        self.list_all_of("list_subnets", "subnets", filter).await
    }
    pub async fn delete_subnet(&self, id: &str) -> Result<()> {
        self.delete_at("delete_subnet", &["subnets", id]).await
    }

    // ------------------------------------------------------------ subnet pools

    pub async fn create_subnetpool(&self, req: &SubnetPoolCreate) -> Result<SubnetPool> {
        self.create_one("create_subnetpool", "subnetpools", "subnetpool", req)
            .await
    }
    pub async fn get_subnetpool(&self, id: &str) -> Result<SubnetPool> {
        self.get_one("get_subnetpool", &["subnetpools", id], "subnetpool")
            .await
    }
    pub async fn list_subnetpools(&self, filter: &ListFilter) -> Result<Vec<SubnetPool>> {
        self.list_all_of("list_subnetpools", "subnetpools", filter).await
    }
    pub async fn delete_subnetpool(&self, id: &str) -> Result<()> {
        self.delete_at("delete_subnetpool", &["subnetpools", id]).await
    }

    // ------------------------------------------------------------ routers

    pub async fn create_router(&self, req: &RouterCreate) -> Result<Router> {
        self.create_one("create_router", "routers", "router", req).await
    }
    pub async fn get_router(&self, id: &str) -> Result<Router> {
        self.get_one("get_router", &["routers", id], "router").await
    }
    pub async fn list_routers(&self, filter: &ListFilter) -> Result<Vec<Router>> {
        self.list_all_of("list_routers", "routers", filter).await
    }
    pub async fn delete_router(&self, id: &str) -> Result<()> {
        self.delete_at("delete_router", &["routers", id]).await
    }
    /// `PUT /v2.0/routers/{id}/add_router_interface` (answer not wrapped).
    pub async fn add_router_interface(
        &self,
        router_id: &str,
        spec: &RouterInterfaceSpec,
    ) -> Result<RouterInterface> {
        self.router_interface("add_router_interface", router_id, spec)
            .await
    }
    /// `PUT /v2.0/routers/{id}/remove_router_interface` (answer not wrapped).
    pub async fn remove_router_interface(
        &self,
        router_id: &str,
        spec: &RouterInterfaceSpec,
    ) -> Result<RouterInterface> {
        self.router_interface("remove_router_interface", router_id, spec)
            .await
    }
    /// The router interface actions: the action is both the operation name and the last
    /// path segment.
    async fn router_interface(
        &self,
        action: &'static str,
        router_id: &str,
        spec: &RouterInterfaceSpec,
    ) -> Result<RouterInterface> {
        let call = Call::new(action, Method::PUT, &["routers", router_id, action])
            .json(spec)?
            .not_idempotent();
        self.execute(call).await?.json()
    }

    // ------------------------------------------------------------ ports

    /// Bulk create in ONE request (`{"ports": [...]}`). Atomic on the server: on error nothing is created.
    pub async fn create_ports(&self, reqs: &[PortCreate]) -> Result<Vec<Port>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let body = json!({ "ports": reqs });
        // One of the requests the pace lets out: a pool's refills and the pods' own creates
        // share the server's queue, and an ACTIVE poll waits behind all of them.
        let place = self.bulk_place().await;
        let call = Call::new("create_ports", Method::POST, &["ports"]).json(&body)?;
        let answer = self.paced(reqs.len(), self.execute(call)).await;
        drop(place);
        // Never held back (the pools that send bulk creates back off on their own and read the
        // quota); a success tells the single creates' gate that the quota has room.
        if answer.is_ok() {
            let project = reqs
                .first()
                .and_then(|r| serde_json::to_value(r).ok())
                .map(|b| crate::quota_gate::project_of(&b))
                .unwrap_or_default();
            self.quota_has_room("port", &project);
        }
        answer?.unwrap("ports")
    }

    pub async fn get_port(&self, id: &str) -> Result<Port> {
        self.get_one("get_port", &["ports", id], "port").await
    }

    /// All matching ports; with [`ListFilter::limit`] the pages are fetched one after another.
    pub async fn list_ports(&self, filter: &ListFilter) -> Result<Vec<Port>> {
        self.list_all_of("list_ports", "ports", filter).await
    }

    /// One page: `marker` is the `next_marker` of the previous page.
    pub async fn list_ports_page(&self, filter: &ListFilter, marker: Option<&str>) -> Result<Page<Port>> {
        self.list_page_of("list_ports", "ports", filter, marker).await
    }

    pub async fn update_port(&self, id: &str, req: &PortUpdate) -> Result<Port> {
        self.update_port_inner(id, req, None).await
    }

    /// Update only if the port is still at `revision` (`If-Match: revision_number=N`); otherwise
    /// `RevisionNumberConstraintFailed` (412).
    pub async fn update_port_if_revision(&self, id: &str, req: &PortUpdate, revision: u64) -> Result<Port> {
        self.update_port_inner(id, req, Some(revision)).await
    }

    async fn update_port_inner(&self, id: &str, req: &PortUpdate, revision: Option<u64>) -> Result<Port> {
        let body = json!({ "port": req });
        let call = Call::new("update_port", Method::PUT, &["ports", id])
            .json(&body)?
            .if_match(revision);
        self.execute(call).await?.unwrap("port")
    }

    /// Delete; a missing port is `PortNotFound` (callers deleting decide whether that is fine).
    pub async fn delete_port(&self, id: &str) -> Result<()> {
        self.delete_at("delete_port", &["ports", id]).await
    }

    // ------------------------------------------------------------ trunks

    pub async fn create_trunk(&self, req: &TrunkCreate) -> Result<Trunk> {
        self.create_one("create_trunk", "trunks", "trunk", req).await
    }
    pub async fn get_trunk(&self, id: &str) -> Result<Trunk> {
        self.get_one("get_trunk", &["trunks", id], "trunk").await
    }
    pub async fn list_trunks(&self, filter: &ListFilter) -> Result<Vec<Trunk>> {
        self.list_all_of("list_trunks", "trunks", filter).await
    }
    pub async fn delete_trunk(&self, id: &str) -> Result<()> {
        self.delete_at("delete_trunk", &["trunks", id]).await
    }
    /// `PUT /v2.0/trunks/{id}/add_subports`; the answer is the trunk, NOT wrapped in `"trunk"`.
    pub async fn add_subports(&self, trunk_id: &str, sub_ports: &[SubPort]) -> Result<Trunk> {
        let call = Call::new("add_subports", Method::PUT, &["trunks", trunk_id, "add_subports"])
            .json(&json!({ "sub_ports": sub_ports }))?
            .not_idempotent();
        self.execute(call).await?.json()
    }
    /// `PUT /v2.0/trunks/{id}/remove_subports` by port id; the answer is the trunk, not wrapped.
    pub async fn remove_subports<S: AsRef<str>>(&self, trunk_id: &str, port_ids: &[S]) -> Result<Trunk> {
        let sub_ports: Vec<_> = port_ids
            .iter()
            .map(|p| json!({ "port_id": p.as_ref() }))
            .collect();
        let call = Call::new(
            "remove_subports",
            Method::PUT,
            &["trunks", trunk_id, "remove_subports"],
        )
        .json(&json!({ "sub_ports": sub_ports }))?
        .not_idempotent();
        self.execute(call).await?.json()
    }
    pub async fn get_subports(&self, trunk_id: &str) -> Result<Vec<SubPort>> {
        self.get_one("get_subports", &["trunks", trunk_id, "get_subports"], "sub_ports")
            .await
    }

    // ------------------------------------------------------------ security groups

    pub async fn create_security_group(&self, req: &SecurityGroupCreate) -> Result<SecurityGroup> {
        self.create_one("create_security_group", "security-groups", "security_group", req)
            .await
    }
    pub async fn get_security_group(&self, id: &str) -> Result<SecurityGroup> {
        self.get_one("get_security_group", &["security-groups", id], "security_group")
            .await
    }
    pub async fn list_security_groups(&self, filter: &ListFilter) -> Result<Vec<SecurityGroup>> {
        self.list_all_of("list_security_groups", "security-groups", filter)
            .await
    }
    pub async fn delete_security_group(&self, id: &str) -> Result<()> {
        self.delete_at("delete_security_group", &["security-groups", id])
            .await
    }
    pub async fn create_security_group_rule(
        &self,
        req: &SecurityGroupRuleCreate,
    ) -> Result<SecurityGroupRule> {
        self.create_one(
            "create_security_group_rule",
            "security-group-rules",
            "security_group_rule",
            req,
        )
        .await
    }
    pub async fn list_security_group_rules(&self, filter: &ListFilter) -> Result<Vec<SecurityGroupRule>> {
        self.list_all_of("list_security_group_rules", "security-group-rules", filter)
            .await
    }
    pub async fn delete_security_group_rule(&self, id: &str) -> Result<()> {
        self.delete_at("delete_security_group_rule", &["security-group-rules", id])
            .await
    }

    // ------------------------------------------------------------ address groups

    pub async fn create_address_group(&self, req: &AddressGroupCreate) -> Result<AddressGroup> {
        self.create_one("create_address_group", "address-groups", "address_group", req)
            .await
    }
    pub async fn get_address_group(&self, id: &str) -> Result<AddressGroup> {
        self.get_one("get_address_group", &["address-groups", id], "address_group")
            .await
    }
    pub async fn list_address_groups(&self, filter: &ListFilter) -> Result<Vec<AddressGroup>> {
        self.list_all_of("list_address_groups", "address-groups", filter)
            .await
    }
    /// Deleting a group a rule still names is `AddressGroupInUse` (409).
    pub async fn delete_address_group(&self, id: &str) -> Result<()> {
        self.delete_at("delete_address_group", &["address-groups", id])
            .await
    }
    /// `PUT /v2.0/address-groups/{id}/add_addresses`: all or nothing; an address already in the
    /// group is `AddressesAlreadyExist` (400) and nothing is added.
    pub async fn add_addresses<S: AsRef<str>>(&self, id: &str, addresses: &[S]) -> Result<AddressGroup> {
        self.address_group_action("add_addresses", id, addresses).await
    }
    /// `PUT /v2.0/address-groups/{id}/remove_addresses`: all or nothing; an address not in the
    /// group is `AddressesNotFound` (404) and nothing is removed.
    pub async fn remove_addresses<S: AsRef<str>>(&self, id: &str, addresses: &[S]) -> Result<AddressGroup> {
        self.address_group_action("remove_addresses", id, addresses).await
    }
    async fn address_group_action<S: AsRef<str>>(
        &self,
        action: &'static str,
        id: &str,
        addresses: &[S],
    ) -> Result<AddressGroup> {
        let addresses: Vec<&str> = addresses.iter().map(AsRef::as_ref).collect();
        let call = Call::new(action, Method::PUT, &["address-groups", id, action])
            .json(&json!({ "addresses": addresses }))?
            .not_idempotent();
        self.execute(call).await?.unwrap("address_group")
    }

    // ------------------------------------------------------------ floating IPs

    pub async fn create_floatingip(&self, req: &FloatingIpCreate) -> Result<FloatingIp> {
        self.create_one("create_floatingip", "floatingips", "floatingip", req)
            .await
    }
    pub async fn get_floatingip(&self, id: &str) -> Result<FloatingIp> {
        self.get_one("get_floatingip", &["floatingips", id], "floatingip")
            .await
    }
    /// Filters include `floating_ip_address`, `floating_network_id`, `port_id`, `description` and tags.
    pub async fn list_floatingips(&self, filter: &ListFilter) -> Result<Vec<FloatingIp>> {
        self.list_all_of("list_floatingips", "floatingips", filter).await
    }
    /// Associates the floating IP with `port_id` (`None` disassociates). Neutron answers
    /// `ExternalGatewayForFloatingIPNotFound` (404) when no router joins the port's subnet to the floating
    /// network, and `FloatingIPPortAlreadyAssociated` (409) when the fixed IP has another floating IP.
    pub async fn update_floatingip_port(&self, id: &str, port_id: Option<&str>) -> Result<FloatingIp> {
        let body = json!({ "floatingip": { "port_id": port_id } });
        let call = Call::new("update_floatingip", Method::PUT, &["floatingips", id]).json(&body)?;
        self.execute(call).await?.unwrap("floatingip")
    }
    /// A missing floating IP is `FloatingIPNotFound`.
    pub async fn delete_floatingip(&self, id: &str) -> Result<()> {
        self.delete_at("delete_floatingip", &["floatingips", id]).await
    }

    // ------------------------------------------------------------ tags

    pub async fn get_tags(&self, kind: Taggable, id: &str) -> Result<Vec<String>> {
        self.get_one("get_tags", &[kind.collection(), id, "tags"], "tags")
            .await
    }
    /// Add one tag (no-op when present).
    pub async fn add_tag(&self, kind: Taggable, id: &str, tag: &str) -> Result<()> {
        self.execute(Call::new(
            "add_tag",
            Method::PUT,
            &[kind.collection(), id, "tags", tag],
        ))
        .await
        .map(|_| ())
    }
    /// Replace all tags; returns the stored set.
    pub async fn replace_tags<S: AsRef<str>>(
        &self,
        kind: Taggable,
        id: &str,
        tags: &[S],
    ) -> Result<Vec<String>> {
        let tags: Vec<&str> = tags.iter().map(AsRef::as_ref).collect();
        let call = Call::new("replace_tags", Method::PUT, &[kind.collection(), id, "tags"])
            .json(&json!({ "tags": tags }))?;
        self.execute(call).await?.unwrap("tags")
    }
    pub async fn remove_tag(&self, kind: Taggable, id: &str, tag: &str) -> Result<()> {
        self.delete_at("remove_tag", &[kind.collection(), id, "tags", tag])
            .await
    }
    pub async fn remove_all_tags(&self, kind: Taggable, id: &str) -> Result<()> {
        self.delete_at("remove_all_tags", &[kind.collection(), id, "tags"])
            .await
    }

    // ------------------------------------------------------------ quotas, availability, extensions

    /// `GET /v2.0/quotas/{project}/details`.
    pub async fn get_quota_details(&self, project_id: &str) -> Result<QuotaDetails> {
        self.get_one("get_quota_details", &["quotas", project_id, "details"], "quota")
            .await
    }
    /// `PUT /v2.0/quotas/{project}`; returns all limits.
    pub async fn update_quota(&self, project_id: &str, req: &QuotaUpdate) -> Result<BTreeMap<String, i64>> {
        let call =
            Call::new("update_quota", Method::PUT, &["quotas", project_id]).json(&json!({ "quota": req }))?;
        self.execute(call).await?.unwrap("quota")
    }
    /// `DELETE /v2.0/quotas/{project}`: back to the defaults.
    pub async fn reset_quota(&self, project_id: &str) -> Result<()> {
        self.delete_at("reset_quota", &["quotas", project_id]).await
    }

    pub async fn get_network_ip_availability(&self, network_id: &str) -> Result<NetworkIpAvailability> {
        self.get_one(
            "get_network_ip_availability",
            &["network-ip-availabilities", network_id],
            "network_ip_availability",
        )
        .await
    }
    pub async fn list_network_ip_availabilities(
        &self,
        filter: &ListFilter,
    ) -> Result<Vec<NetworkIpAvailability>> {
        self.list_all_of(
            "list_network_ip_availabilities",
            "network-ip-availabilities",
            filter,
        )
        .await
    }

    pub async fn list_extensions(&self) -> Result<Vec<Extension>> {
        self.get_one("list_extensions", &["extensions"], "extensions")
            .await
    }
}
