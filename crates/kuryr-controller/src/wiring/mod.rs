//! Wiring a pod: every interface of the pod, eth0 included, goes through the same steps.
//!
//! 1. [`plan`]: eth0 is resolved by the project, placement, subnet and security group drivers;
//!    the multi-VIF drivers add the other interfaces. Bad input stops here, before any port.
//! 2. [`lifecycle::acquire_all`]: every planned interface gets its port from a [`VifSource`]; if
//!    one fails, the ones already acquired are given back, so a pod never runs half-wired.
//! 3. record: the handler writes the [`RecordedVif`]s into the KuryrPort status ([`record`]).
//! 4. [`lifecycle::activate_all`]: each VIF is flipped to active once Neutron says so.
//! 5. [`lifecycle::release_all`]: every port goes back the way it came (pool, delete, restore);
//!    every failure is kept, none stops the others.
//! 6. [`unrecorded::release_unrecorded`]: ports a crash created between step 2 and 3 are found by
//!    the pod's ownership tags and deleted.
//!
//! Steps 2, 4 and 5 only talk to a [`VifSource`]: [`source::DriverSource`] is the drivers'
//! implementation; the unit tests use a fake one.

pub mod handoff;
pub mod lifecycle;
pub mod plan;
pub mod record;
pub mod source;
pub mod unrecorded;

pub use lifecycle::{Activation, VifSource, acquire_all, activate_all, release_all};
pub use plan::{Interface, plan};
pub use record::{RecordedVif, ReleaseMode, recorded_vifs};
pub use source::DriverSource;
