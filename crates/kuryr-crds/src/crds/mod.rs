//! The custom resource types.

pub mod kuryrloadbalancer;
pub mod kuryrnetwork;
pub mod kuryrnetworkpolicy;
pub mod kuryrport;
pub mod kuryrportpool;
pub mod nad;
pub mod placement;
pub(crate) mod schema;
