//! Changing a port's security groups: one change per port at a time, and a group deleted only once
//! no change that touches it is still in flight.
//!
//! Why: ML2/OVN moves a port between OVN port groups after Neutron's database commit (the mechanism
//! driver's postcommit), from the old and new group lists of that update. Two concurrent updates of
//! one port, or a group deleted between an update's commit and its postcommit, leave OVN behind the
//! database: Neutron logs "Port group pg_<id> does not exist", answers 200, and the port stays in
//! the old OVN port group (its traffic still follows a deleted policy). The `pod_label` handler
//! and a policy's release both change ports' groups, so they meet here.
//!
//! A pod's port released to a pool meets them too: a group written for the pod after the pool
//! took the port back would go with the port to the next pod. The release waits for the port's
//! turn ([`PortGroups::after_changes`]), and a policy's change asks in the turn whether the pod
//! still holds the port ([`PortGroups::change_if`]). One set of turns serves the controller
//! (`Platform::port_groups`).
//!
//! Guarantees: callers of [`PortGroups::change`] for the same port run one after the other, each
//! reading the port under the turn it holds; [`PortGroups::settled`] returns once no change whose
//! old or new groups contain the group is running (changes that start later read the port after
//! the group left it, or name a group Neutron no longer has and fail with 404, to be retried).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex as SyncMutex};

use kuryr_neutron::{NeutronClient, Port, PortUpdate};
use tokio::sync::{Mutex, Notify};

use crate::error::Error;
use crate::locked::Locked;

/// What a change decides from the port as read under its turn.
pub enum Change {
    /// These groups, in place of the port's.
    Set(Vec<String>),
    /// Nothing to do.
    Keep,
}

#[derive(Default)]
struct State {
    /// One turn per port with a change running or waiting; dropped when the last one leaves.
    turns: HashMap<String, (Arc<Mutex<()>>, usize)>,
    /// Groups named (old or new) by a change being written, with how many such changes.
    in_flight: HashMap<String, usize>,
}

#[derive(Default)]
pub struct PortGroups {
    state: SyncMutex<State>,
    idle: Notify,
}

impl PortGroups {
    /// Reads port `id` and writes the groups `decide` picks, after every earlier change of the
    /// port. Returns whether it wrote; a port that is gone is no change (`Ok(false)`).
    pub async fn change(
        &self,
        client: &NeutronClient,
        id: &str,
        decide: impl FnOnce(&Port) -> Change,
    ) -> Result<bool, Error> {
        self.change_if(client, id, || async { Ok(true) }, decide).await
    }

    /// [`Self::change`] when `still` - asked in the port's turn, before the port is read - says
    /// the change still applies (its pod still holds the port): a release that waited for the
    /// turn ([`Self::after_changes`]) is then either before the question, which sees it, or
    /// after the write, which a pool's recycling then undoes.
    pub async fn change_if<F, Fut>(
        &self,
        client: &NeutronClient,
        id: &str,
        still: F,
        decide: impl FnOnce(&Port) -> Change,
    ) -> Result<bool, Error>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<bool, Error>>,
    {
        let turn = self.enter(id);
        let guard = turn.lock().await;
        let result = match still().await {
            Ok(true) => self.change_in_turn(client, id, decide).await,
            other => other.map(|_| false),
        };
        drop(guard);
        self.leave(id);
        result
    }

    /// Waits until every change of port `id` running or waiting now has finished: a port
    /// released to a pool (or deleted, or given back its pre-created attributes) waits for them,
    /// so that no group written for the pod it served lands after the release.
    pub async fn after_changes(&self, id: &str) {
        let turn = self.enter(id);
        drop(turn.lock().await);
        self.leave(id);
    }

    async fn change_in_turn(
        &self,
        client: &NeutronClient,
        id: &str,
        decide: impl FnOnce(&Port) -> Change,
    ) -> Result<bool, Error> {
        let port = match client.get_port(id).await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let Change::Set(groups) = decide(&port) else {
            return Ok(false);
        };
        let named: BTreeSet<String> = port.security_groups.iter().chain(&groups).cloned().collect();
        self.mark(&named, true);
        let update = PortUpdate {
            security_groups: Some(groups),
            ..Default::default()
        };
        let written = client.update_port(id, &update).await;
        self.mark(&named, false);
        match written {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() && !e.is_kind(&kuryr_neutron::ErrorKind::SecurityGroupNotFound) => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until no change naming `group` is being written.
    pub async fn settled(&self, group: &str) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if !self.lock().in_flight.contains_key(group) {
                return;
            }
            idle.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this plain map lock cannot leave it half-written.
        self.state.locked()
    }

    fn enter(&self, id: &str) -> Arc<Mutex<()>> {
        let mut s = self.lock();
        let entry = s.turns.entry(id.to_string()).or_default();
        entry.1 += 1;
        entry.0.clone()
    }

    fn leave(&self, id: &str) {
        let mut s = self.lock();
        if let Some(entry) = s.turns.get_mut(id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                s.turns.remove(id);
            }
        }
    }

    fn mark(&self, groups: &BTreeSet<String>, writing: bool) {
        let mut s = self.lock();
        for g in groups {
            if writing {
                *s.in_flight.entry(g.clone()).or_default() += 1;
            } else if let Some(n) = s.in_flight.get_mut(g) {
                *n -= 1;
                if *n == 0 {
                    s.in_flight.remove(g);
                }
            }
        }
        drop(s);
        if !writing {
            self.idle.notify_waiters();
        }
    }

    #[cfg(test)]
    fn ports_tracked(&self) -> usize {
        self.lock().turns.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_group_is_settled_only_after_every_change_naming_it_was_written() {
        let pg = Arc::new(PortGroups::default());
        pg.mark(&BTreeSet::from(["g".to_string(), "h".to_string()]), true);
        pg.mark(&BTreeSet::from(["g".to_string()]), true);
        let waiter = {
            let pg = pg.clone();
            tokio::spawn(async move { pg.settled("g").await })
        };
        pg.settled("other").await;
        pg.mark(&BTreeSet::from(["g".to_string(), "h".to_string()]), false);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "one change naming g is still being written"
        );
        pg.mark(&BTreeSet::from(["g".to_string()]), false);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("settled once the last change was written")
            .expect("waiter task");
        pg.settled("h").await;
    }

    #[tokio::test]
    async fn a_release_waits_for_the_change_of_its_port_in_flight() {
        let pg = Arc::new(PortGroups::default());
        let first = pg.enter("p");
        let guard = first.lock().await;
        let release = {
            let pg = pg.clone();
            tokio::spawn(async move { pg.after_changes("p").await })
        };
        pg.after_changes("other").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!release.is_finished(), "the release waits for the change of p");
        drop(guard);
        pg.leave("p");
        tokio::time::timeout(Duration::from_secs(5), release)
            .await
            .expect("released once the change finished")
            .expect("release task");
        assert_eq!(pg.ports_tracked(), 0);
    }

    #[tokio::test]
    async fn changes_of_one_port_take_turns_and_leave_nothing_behind() {
        let pg = Arc::new(PortGroups::default());
        let first = pg.enter("p");
        let guard = first.lock().await;
        let second = {
            let pg = pg.clone();
            tokio::spawn(async move {
                let turn = pg.enter("p");
                let _g = turn.lock().await;
                pg.leave("p");
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "the second change waits for the first");
        drop(guard);
        pg.leave("p");
        second.await.expect("second change");
        assert_eq!(
            pg.ports_tracked(),
            0,
            "no turn is kept for a port without changes"
        );
    }
}
