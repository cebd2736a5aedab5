//! kuryr-config
