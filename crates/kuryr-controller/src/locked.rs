//! Poison-tolerant locking of the controller's small in-memory maps and sets.
//!
//! A `std::sync::Mutex` is poisoned when a holder panicked. Every value the controller keeps
//! behind one is changed by single inserts, removals or swaps, so a panic never leaves it half
//! written, and refusing every later lock would stop a whole handler for one bad event.

use std::sync::{Mutex, MutexGuard};

pub trait Locked<T: ?Sized> {
    /// The lock, also after a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let holder = m.clone();
        let panicked = std::thread::spawn(move || {
            let _g = holder.locked();
            panic!("holder fails");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        m.locked().push(2);
        assert_eq!(*m.locked(), [1, 2]);
    }
}
