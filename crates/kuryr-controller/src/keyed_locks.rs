//! One async lock per key (a trunk, a VM port, a policy, a Service): writers of the same thing
//! take turns, writers of different things do not wait for each other. A key's lock is dropped
//! once nobody holds or waits for it, so a controller that saw a million keys keeps none.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::locked::Locked;
use tokio::sync::OwnedMutexGuard;

pub struct KeyedLocks<K> {
    locks: Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>,
}

impl<K> Default for KeyedLocks<K> {
    fn default() -> Self {
        Self {
            locks: Mutex::default(),
        }
    }
}

/// Held while the key's turn lasts.
pub struct Turn<'a, K: Hash + Eq + Clone> {
    guard: Option<OwnedMutexGuard<()>>,
    key: K,
    owner: &'a KeyedLocks<K>,
}

impl<K: Hash + Eq + Clone> KeyedLocks<K> {
    /// Waits for `key`'s turn.
    pub async fn lock(&self, key: K) -> Turn<'_, K> {
        let lock = self.map().entry(key.clone()).or_default().clone();
        Turn {
            guard: Some(lock.lock_owned().await),
            key,
            owner: self,
        }
    }

    /// Keys with a lock held or waited for.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Arc<tokio::sync::Mutex<()>>>> {
        self.locks.locked()
    }
}

impl<K: Hash + Eq + Clone> Drop for Turn<'_, K> {
    fn drop(&mut self) {
        // Released first, so that a count of 1 below means the map's own reference: nobody holds
        // the lock or waits for it (a waiter holds a clone of the Arc).
        drop(self.guard.take());
        let mut map = self.owner.map();
        if map.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_key_takes_turns_and_is_forgotten_after() {
        let locks = Arc::new(KeyedLocks::<String>::default());
        let first = locks.lock("a".into()).await;
        // Another key does not wait.
        drop(locks.lock("b".into()).await);
        let l2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _t = l2.lock("a".to_string()).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the same key waits for its turn");
        assert_eq!(locks.len(), 1, "b was forgotten, a is held");
        drop(first);
        waiter.await.unwrap();
        assert!(locks.is_empty(), "nobody holds or waits: nothing kept");
    }
}
