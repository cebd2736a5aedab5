//! kuryr-neutron: the OpenStack client layer - Keystone v3 authentication, one transport, and typed clients for
//! Neutron ([`NeutronClient`]) and Octavia ([`octavia::OctaviaClient`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kuryr_neutron::Error> {
//! use kuryr_neutron::{ClientOptions, ListFilter, NeutronClient, PortCreate};
//! let client = NeutronClient::new(&ClientOptions::noauth("http://127.0.0.1:9696"))?;
//! let ports = client.list_ports(&ListFilter::new().device_owner("compute:kuryr").limit(100)).await?;
//! let port = client.create_port(&PortCreate { name: Some("p".into()), ..PortCreate::new("net-id") }).await?;
//! # let _ = (ports, port); Ok(()) }
//! ```
//!
//! Transport rules (`transport.rs`, the same for every service): every call passes through one semaphore (`max_concurrent_requests`), is logged at debug level with
//! method, path, status, latency and `x-openstack-request-id` (never the token; a retry at info, a final failure at
//! warn with the request id, a 404 at debug only), is reported to the optional
//! [`Metrics`] hook, and is retried with exponential backoff + jitter on connection failures, 5xx and 429 when it is
//! idempotent (GET, PUT, DELETE; POST only when the connection could not be established: a POST that lost its
//! connection after sending fails with [`Error::outcome_unknown`] set, since it may have taken effect). A 401
//! triggers one re-authentication and one resend.

pub mod auth;
pub mod client;
pub mod error;
pub mod filter;
pub mod metrics;
pub mod octavia;
#[cfg(test)]
mod proptests;
pub mod quota_gate;
mod transport;
pub mod types;

pub use auth::{AuthOptions, AuthType, ClientOptions, Interface, Secret};
pub use client::{NeutronClient, Page};
pub use error::{ApiError, Error, ErrorKind, Result};
pub use filter::ListFilter;
pub use metrics::{CallRecord, Metrics, Outcome};
pub use types::*;
