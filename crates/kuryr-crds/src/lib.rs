//! kuryr-crds
