//! The cases, one file per API area. Each asserts what neutron-server 29.0.0 (noauth, ML2 openvswitch +
//! sriovnicswitch, fake OVS and NIC Switch agents on k8s-node-1, k8s-node-2 and k8s-node-hybrid (its OVS agent
//! reporting `ovs_hybrid_plug`, as with the iptables_hybrid firewall), VLAN ranges physnet1:100:200 and
//! physnet2:300:399, NIC Switch device_mappings physnet2; see `scripts/neutron-lab/`) does. [`all_cases`] is the
//! one list of cases, in report order.

mod address_groups;
mod binding;
mod floating_ips;
mod listing;
mod networks;
mod ports;
mod quotas;
mod security;
mod tags;
mod trunks;

use std::collections::BTreeSet;
use std::time::Duration;

use kuryr_neutron::Port;

use crate::Case;

const MISSING: &str = "00000000-0000-0000-0000-000000000000";
const AGENT_HOST: &str = "k8s-node-1";
const AGENT_HOST_2: &str = "k8s-node-2";
const HYBRID_PLUG_HOST: &str = "k8s-node-hybrid";
// The lab's agents report a binding through RabbitMQ and the RPC server: tens of seconds on a
// 2-core machine running the whole test suite (30 s was once not enough). A port that never goes
// ACTIVE still fails.
const ACTIVE_WITHIN: Duration = Duration::from_secs(90);

fn ids(ports: &[Port]) -> BTreeSet<String> {
    ports.iter().map(|p| p.id.clone()).collect()
}

fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v
}

macro_rules! cases {
    ($($area:ident :: $name:ident),* $(,)?) => {
        /// Every case, in report order.
        pub fn all_cases() -> Vec<Case> {
            vec![$(Case { name: stringify!($name), run: |ctx| Box::pin($area::$name(ctx)) }),*]
        }
    };
}

cases!(
    networks::extensions_include_trunk_and_tags,
    networks::network_crud,
    networks::subnet_crud_and_allocation_pool,
    ports::port_create_shape,
    ports::port_create_on_missing_network_is_network_not_found,
    ports::port_get_missing_is_port_not_found_with_request_id,
    ports::port_delete_missing_is_port_not_found,
    ports::port_delete_then_get_is_404,
    ports::bulk_create_50_ports,
    ports::bulk_create_is_atomic_on_quota,
    ports::bulk_create_is_atomic_on_ip_conflict,
    ports::bulk_create_stores_tags,
    ports::concurrent_single_creates_each_get_their_own_answer,
    ports::single_create_stores_tags,
    listing::filter_device_owner,
    listing::filter_device_id,
    listing::filter_binding_host_id,
    listing::filter_fixed_ip_address,
    listing::filter_fixed_ip_subnet,
    listing::filter_tags_all,
    listing::filter_tags_any,
    listing::filter_not_tags,
    listing::filter_network_id_and_fields,
    listing::filter_several_ids,
    listing::pagination_limit_and_marker,
    tags::tags_add_replace_remove,
    tags::tags_on_network_subnet_and_trunk,
    ports::update_port_attributes,
    ports::update_with_stale_revision_is_412,
    ports::unrecognized_attribute_is_400,
    trunks::trunk_create_on_unbound_parent,
    trunks::trunk_create_with_subports,
    trunks::trunk_on_bound_parent_is_parent_port_in_use,
    trunks::trunk_get_missing_is_trunk_not_found,
    trunks::trunk_add_and_remove_subports,
    trunks::trunk_duplicate_subport,
    trunks::subport_with_device_id_is_port_in_use,
    trunks::trunk_vlan_out_of_range_is_invalid_input,
    trunks::delete_subport_port_is_port_in_use_as_subport,
    trunks::parent_port_has_trunk_details,
    quotas::quota_details_shape_and_usage,
    quotas::quota_exhaustion_is_over_quota,
    networks::ip_exhaustion_on_tiny_subnet,
    networks::network_ip_availability_counts,
    security::security_groups_and_rules,
    security::router_add_and_remove_interface,
    security::security_group_create_refuses_tags,
    security::an_all_addresses_remote_duplicates_no_remote,
    address_groups::address_group_crud_and_membership,
    address_groups::address_group_create_refuses_bare_and_duplicate_addresses,
    address_groups::rule_with_remote_address_group,
    networks::subnetpool_allocation,
    binding::ports_bound_to_agent_host_become_active,
    binding::binding_by_update_becomes_active_and_unbinding_goes_down,
    binding::binding_to_host_without_agent_fails,
    binding::ovs_hybrid_plug_follows_the_agent_of_the_host,
    binding::trunk_subports_become_active,
    networks::provider_networks_flat_and_vlan,
    binding::direct_port_on_physnet_host_is_hw_veb_and_goes_active,
    floating_ips::floating_ip_allocation_tags_and_lookup,
    floating_ips::floating_ip_association_needs_a_router,
);
