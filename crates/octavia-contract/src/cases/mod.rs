//! The cases, one file per API area. Each asserts what Octavia 19.0.0 does with `auth_strategy = noauth` and the
//! `amphora` provider on noop amphora/compute/network drivers (`scripts/octavia-lab/`). [`all_cases`] is the one
//! list of cases, in report order.

mod errors;
mod loadbalancers;
mod members;
mod platform;

use crate::Case;

const MISSING: &str = "00000000-0000-0000-0000-000000000000";

macro_rules! cases {
    ($($area:ident :: $name:ident),* $(,)?) => {
        /// Every case, in report order.
        pub fn all_cases() -> Vec<Case> {
            vec![$(Case { name: stringify!($name), run: |ctx| Box::pin($area::$name(ctx)) }),*]
        }
    };
}

cases!(
    loadbalancers::fully_populated_create_reaches_active_with_status_tree,
    loadbalancers::listener_and_pool_added_to_active_lb,
    loadbalancers::write_while_pending_is_409_and_the_client_waits,
    loadbalancers::cascade_delete_removes_the_tree,
    loadbalancers::tags_filter_and_replace,
    loadbalancers::listener_update_null_restores_defaults,
    members::batch_member_update_adds_removes_keeps,
    members::batch_member_update_additive_only,
    errors::not_found_shapes,
    errors::invalid_input_is_400_validation,
    platform::quota_get_set_reset,
    platform::providers_and_amphora_records,
);
