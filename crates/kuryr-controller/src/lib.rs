//! kuryr-controller
