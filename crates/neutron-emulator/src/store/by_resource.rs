//! Operations that dispatch on the resource type (what the generic REST routes call).

use serde_json::Value;

use super::{Std, Store, check_revision};
use crate::error::{ApiError, ApiResult, Resource};

impl Store {
    pub fn tags_mut(&mut self, res: Resource, id: &str) -> ApiResult<&mut Std> {
        let std = match res {
            Resource::Network => self.networks.get_mut(id).map(|r| &mut r.std),
            Resource::Subnet => self.subnets.get_mut(id).map(|r| &mut r.std),
            Resource::SubnetPool => self.subnetpools.get_mut(id).map(|r| &mut r.std),
            Resource::Port => self.ports.get_mut(id).map(|r| &mut r.std),
            Resource::Router => self.routers.get_mut(id).map(|r| &mut r.std),
            Resource::SecurityGroup => self.security_groups.get_mut(id).map(|r| &mut r.std),
            Resource::Trunk => self.trunks.get_mut(id).map(|r| &mut r.std),
            Resource::FloatingIp => self.floatingips.get_mut(id).map(|r| &mut r.std),
            Resource::SecurityGroupRule => None,
            // Address groups carry no tags: neutron answers their tag routes with a plain 404.
            Resource::AddressGroup => return Err(ApiError::http_not_found()),
        };
        std.ok_or_else(|| ApiError::resource_not_found(res, id))
    }

    /// The tags of a tagged record (`None` for kinds without tags or an unknown id): lets a list
    /// skip rendering what its tag filters refuse.
    pub fn tags_of(&self, res: Resource, id: &str) -> Option<&[String]> {
        let std = match res {
            Resource::Network => self.networks.get(id).map(|r| &r.std),
            Resource::Subnet => self.subnets.get(id).map(|r| &r.std),
            Resource::SubnetPool => self.subnetpools.get(id).map(|r| &r.std),
            Resource::Port => self.ports.get(id).map(|r| &r.std),
            Resource::Router => self.routers.get(id).map(|r| &r.std),
            Resource::SecurityGroup => self.security_groups.get(id).map(|r| &r.std),
            Resource::Trunk => self.trunks.get(id).map(|r| &r.std),
            Resource::FloatingIp => self.floatingips.get(id).map(|r| &r.std),
            Resource::SecurityGroupRule | Resource::AddressGroup => None,
        };
        std.map(|s| s.tags.as_slice())
    }

    pub fn exists(&self, res: Resource, id: &str) -> bool {
        match res {
            Resource::Network => self.networks.contains_key(id),
            Resource::Subnet => self.subnets.contains_key(id),
            Resource::SubnetPool => self.subnetpools.contains_key(id),
            Resource::Port => self.ports.contains_key(id),
            Resource::Router => self.routers.contains_key(id),
            Resource::SecurityGroup => self.security_groups.contains_key(id),
            Resource::SecurityGroupRule => self.sg_rules.contains_key(id),
            Resource::Trunk => self.trunks.contains_key(id),
            Resource::AddressGroup => self.address_groups.contains_key(id),
            Resource::FloatingIp => self.floatingips.contains_key(id),
        }
    }

    pub fn render(&self, res: Resource, id: &str) -> Value {
        match res {
            Resource::Network => self.render_network(id),
            Resource::Subnet => self.render_subnet(id),
            Resource::SubnetPool => self.render_subnetpool(id),
            Resource::Port => self.render_port(id),
            Resource::Router => self.render_router(id),
            Resource::SecurityGroup => self.render_sg(id),
            Resource::SecurityGroupRule => self.render_rule(id, false),
            Resource::Trunk => self.render_trunk(id),
            Resource::AddressGroup => self.render_address_group(id, false),
            Resource::FloatingIp => self.render_floatingip(id),
        }
    }

    /// All ids of a collection, sorted (neutron's default order is by id).
    pub fn ids(&self, res: Resource) -> Vec<String> {
        match res {
            Resource::Network => self.networks.keys().cloned().collect(),
            Resource::Subnet => self.subnets.keys().cloned().collect(),
            Resource::SubnetPool => self.subnetpools.keys().cloned().collect(),
            Resource::Port => self.ports.keys().cloned().collect(),
            Resource::Router => self.routers.keys().cloned().collect(),
            Resource::SecurityGroup => self.security_groups.keys().cloned().collect(),
            Resource::SecurityGroupRule => self.sg_rules.keys().cloned().collect(),
            Resource::Trunk => self.trunks.keys().cloned().collect(),
            Resource::AddressGroup => self.address_groups.keys().cloned().collect(),
            Resource::FloatingIp => self.floatingips.keys().cloned().collect(),
        }
    }

    pub fn get(&self, res: Resource, id: &str) -> ApiResult<Value> {
        if !self.exists(res, id) {
            return Err(ApiError::resource_not_found(res, id));
        }
        Ok(self.render(res, id))
    }

    pub fn delete(&mut self, res: Resource, id: &str, if_match: Option<u64>) -> ApiResult<()> {
        match res {
            Resource::Network => self.delete_network(id),
            Resource::Subnet => self.delete_subnet(id),
            Resource::SubnetPool => self.delete_subnetpool(id),
            Resource::Port => self.delete_port(id, if_match),
            Resource::Router => self.delete_router(id),
            Resource::SecurityGroup => self.delete_security_group(id),
            Resource::SecurityGroupRule => self.delete_sg_rule(id),
            Resource::Trunk => self.delete_trunk(id),
            Resource::AddressGroup => self.delete_address_group(id),
            Resource::FloatingIp => self.delete_floatingip(id),
        }
    }

    pub fn update(
        &mut self,
        res: Resource,
        id: &str,
        body: &Value,
        if_match: Option<u64>,
    ) -> ApiResult<Value> {
        if res != Resource::Port
            && let Some(expected) = if_match
        {
            let current = self.tags_mut(res, id)?.revision;
            check_revision(Some(expected), current)?;
        }
        match res {
            Resource::Network => self.update_network(id, body),
            Resource::Subnet => self.update_subnet(id, body),
            Resource::SubnetPool => self.update_subnetpool(id, body),
            Resource::Port => self.update_port(id, body, if_match),
            Resource::Router => self.update_router(id, body),
            Resource::SecurityGroup => self.update_security_group(id, body),
            Resource::SecurityGroupRule => Err(ApiError::method_not_allowed()),
            Resource::Trunk => self.update_trunk(id, body),
            Resource::AddressGroup => self.update_address_group(id, body),
            Resource::FloatingIp => self.update_floatingip(id, body),
        }
    }
}
