//! kuryr-neutron
