//! neutron-contract: one behavioural suite for the Neutron API, run against the emulator and a real neutron-server.
