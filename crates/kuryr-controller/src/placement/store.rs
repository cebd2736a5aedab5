//! Where bindings live: per (project, group) key a bounded history of records (`deployment`,
//! bound at, unbound at, why), the open record being the current binding, and whether an operator
//! pinned it. Claims carry a precondition (the binding expected now) so concurrent controllers
//! never race.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tokio::sync::Mutex;

use super::BindingKey;
use super::scheduler::Current;
use crate::error::Error;

/// History rows kept per binding: the oldest go first.
pub const MAX_HISTORY: usize = 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    pub deployment: String,
    /// Bound at (RFC 3339).
    pub start: String,
    /// Unbound at; None while current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// Why it was bound ("new binding", "deployment x is in maintenance...", "moved by an operator").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

/// One binding: its key, whether it is pinned, its history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindingState {
    pub key: BindingKey,
    pub pinned: bool,
    pub history: Vec<BindingRecord>,
}

impl BindingState {
    pub fn current(&self) -> Option<String> {
        self.history
            .iter()
            .rev()
            .find(|b| b.end.is_none())
            .map(|b| b.deployment.clone())
    }

    pub fn current_binding(&self) -> Option<Current> {
        self.current().map(|deployment| Current {
            deployment,
            pinned: self.pinned,
        })
    }

    /// Closes the open record and opens one to `new`, keeping at most [`MAX_HISTORY`] rows.
    pub fn rebind(&mut self, new: &str, why: &str, at: &str) {
        for b in self.history.iter_mut().filter(|b| b.end.is_none()) {
            b.end = Some(at.to_string());
        }
        self.history.push(BindingRecord {
            deployment: new.to_string(),
            start: at.to_string(),
            end: None,
            why: why.to_string(),
        });
        let over = self.history.len().saturating_sub(MAX_HISTORY);
        self.history.drain(..over);
    }
}

pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[async_trait]
pub trait BindingStore: Send + Sync {
    async fn get(&self, key: &BindingKey) -> Result<Option<BindingState>, Error>;

    async fn list(&self) -> Result<Vec<BindingState>, Error>;

    /// Ends the binding to `expected` (if any) and opens one to `new`, only if the current binding
    /// is still `expected` (and still pinned as `pinned` says, when it says: the scheduler moves
    /// no binding an operator pinned since it decided). Ok(false) when someone else changed it
    /// first.
    async fn claim(
        &self,
        key: &BindingKey,
        expected: Option<&str>,
        pinned: Option<bool>,
        new: &str,
        why: &str,
    ) -> Result<bool, Error>;

    /// Pins or unpins the binding of `key` (it must exist).
    async fn set_pinned(&self, key: &BindingKey, pinned: bool) -> Result<(), Error>;
}

/// In-process store (tests, single-replica setups without HA).
#[derive(Default)]
pub struct MemoryStore {
    data: Mutex<HashMap<BindingKey, BindingState>>,
}

#[async_trait]
impl BindingStore for MemoryStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<BindingState>, Error> {
        Ok(self.data.lock().await.get(key).cloned())
    }

    async fn list(&self) -> Result<Vec<BindingState>, Error> {
        let mut all: Vec<BindingState> = self.data.lock().await.values().cloned().collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(all)
    }

    async fn claim(
        &self,
        key: &BindingKey,
        expected: Option<&str>,
        pinned: Option<bool>,
        new: &str,
        why: &str,
    ) -> Result<bool, Error> {
        let mut data = self.data.lock().await;
        let st = data.entry(key.clone()).or_insert_with(|| BindingState {
            key: key.clone(),
            pinned: false,
            history: vec![],
        });
        if st.current().as_deref() != expected || pinned.is_some_and(|p| p != st.pinned) {
            return Ok(false);
        }
        st.rebind(new, why, &now());
        Ok(true)
    }

    async fn set_pinned(&self, key: &BindingKey, pinned: bool) -> Result<(), Error> {
        match self.data.lock().await.get_mut(key) {
            Some(st) => {
                st.pinned = pinned;
                Ok(())
            }
            None => Err(Error::invalid("binding", format!("{key} has no binding"))),
        }
    }
}
