//! kuryr-e2e: end-to-end tests of kuryr-rs as a whole (no library code).
//!
//! The tests in `tests/` start the Kubernetes API emulator, a Neutron (the
//! in-repo emulator always, the real neutron-server when
//! `KURYR_TEST_NEUTRON_URL` is set), the controller, and one CNI daemon per
//! "node" (a network namespace with a Linux bridge `br-int`, the nodes'
//! bridges joined by a veth). Pods are fresh network namespaces wired by the
//! real `kuryr-cni` binary, called as a container runtime calls it.
//!
//! Run: `cargo test -p kuryr-e2e` as root (the tests build `kuryr-cni` with
//! `cargo build -p kuryr-cni` first when it is missing or older than the test).
