pub mod error;
pub mod input;
pub mod store;
