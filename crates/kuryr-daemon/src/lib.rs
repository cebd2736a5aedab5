//! kuryr-daemon
