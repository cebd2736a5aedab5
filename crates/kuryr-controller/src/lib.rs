//! kuryr-controller: turns Kubernetes objects into OpenStack Neutron resources.
//!
//! - [`pipeline`]: the handler pipeline (Async, Dispatcher, Retry, LogExceptions)
//! - [`watcher`]: list+watch per kind with resume, re-list and periodic reconcile
//! - `handlers`: `vif`, `kuryrport`, `namespace`, `kuryrnetwork`, `service`, `endpoints`,
//!   `kuryrloadbalancer`
//! - [`services`]: Kubernetes Services as Octavia load balancers (decide, then act)
//! - [`service`]: runs the controller (not to be confused with [`services`])
//! - `drivers`: project, subnets, security groups, VIF (neutron-vif, nested-vlan, nested-macvlan),
//!   pool, multi-VIF
//! - [`cluster_claim`]: `[kubernetes] cluster_id` claimed as this cluster's in every deployment

pub mod batch_poller;
pub mod cluster_claim;
pub mod context;
pub mod drivers;
pub mod error;
pub mod handlers;
pub mod k8s;
pub mod keyed_locks;
pub mod leader;
pub mod locked;
pub mod metrics;
pub mod openstack;
pub mod periodic;
pub mod pipeline;
pub mod placement;
pub mod policies;
pub mod pool;
pub mod service;
pub mod services;
pub mod watcher;
pub mod wiring;

pub use error::{Error, Result};
