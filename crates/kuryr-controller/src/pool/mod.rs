//! Port pools (seeds 000 and 002): pre-created Neutron ports handed to pods without a Neutron
//! call, recycled on release, persisted as KuryrPortPool objects.

pub mod driver;
pub mod recover;
pub mod state;
