//! neutron-emulator
