//! Watcher: list+watch of one kind feeding the pipeline.
//!
//! kube-runtime's watcher resumes from the last resourceVersion, re-lists on 410 Gone and reconnects
//! with backoff. On top of it we keep the last state of every object so that (a) objects deleted
//! while the watch was down still produce a DELETED event after the re-list, and (b) a periodic full
//! reconcile (`[kubernetes] watch_reconcile_period`) re-sends every object as MODIFIED and re-lists,
//! healing anything a lost event or an exhausted retry left behind.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pipeline::{Event, EventHandler, EventType, WatchSelector};

/// The periodic re-send queues at most this many objects per [`RESEND_PACE`]...
const RESEND_BATCH: usize = 32;
const RESEND_PACE: Duration = Duration::from_millis(20);
/// ...and only while the pipeline holds fewer objects than this.
const RESEND_BACKLOG: usize = 256;

/// Last-seen state of every object of one kind, keyed by `namespace/name`. Pure state, tested
/// without a server.
///
/// Each object is kept as compact JSON, not as the parsed tree: a `serde_json::Value` takes
/// about ten times the bytes of its text, and with ten thousand pods and KuryrPorts that was
/// most of the controller's memory. The copies are read back only for the periodic re-send and
/// for deletions found by a re-list.
#[derive(Default)]
pub struct KnownObjects {
    objects: HashMap<String, Known>,
    relisting: Option<HashSet<String>>,
}

struct Known {
    uid: Option<String>,
    resource_version: Option<String>,
    json: Box<str>,
}

impl Known {
    fn of(obj: &DynamicObject) -> Self {
        Self {
            uid: obj.metadata.uid.clone(),
            resource_version: obj.metadata.resource_version.clone(),
            // A DynamicObject (string keys, JSON values) always serializes.
            json: serde_json::to_string(obj).unwrap_or_default().into_boxed_str(),
        }
    }

    fn object(&self) -> Option<DynamicObject> {
        match serde_json::from_str(&self.json) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(error = %e, "a kept object does not parse back; skipped");
                None
            }
        }
    }
}

fn key_of(obj: &DynamicObject) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    )
}

/// Drops what no handler reads and every object would otherwise carry twice over (kept here and
/// queued): the field managers' bookkeeping, often the largest part of a small object.
fn slim(obj: &mut DynamicObject) {
    obj.metadata.managed_fields = None;
}

impl KnownObjects {
    /// Turns a watcher event into the pipeline events it implies.
    pub fn apply(&mut self, ev: WEvent<DynamicObject>) -> Vec<(EventType, DynamicObject)> {
        let ev = ev.modify(slim);
        match ev {
            WEvent::Init => {
                self.relisting = Some(HashSet::new());
                vec![]
            }
            WEvent::InitApply(obj) => {
                if let Some(seen) = self.relisting.as_mut() {
                    seen.insert(key_of(&obj));
                }
                self.upsert(obj).into_iter().collect()
            }
            WEvent::InitDone => {
                let Some(seen) = self.relisting.take() else {
                    return vec![];
                };
                let gone: Vec<String> = self
                    .objects
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .filter_map(|k| self.objects.remove(&k))
                    .filter_map(|known| known.object())
                    .map(|obj| (EventType::Deleted, obj))
                    .collect()
            }
            WEvent::Apply(obj) => self.upsert(obj).into_iter().collect(),
            WEvent::Delete(obj) => {
                self.objects.remove(&key_of(&obj));
                vec![(EventType::Deleted, obj)]
            }
        }
    }

    fn upsert(&mut self, obj: DynamicObject) -> Option<(EventType, DynamicObject)> {
        let key = key_of(&obj);
        let ty = match self.objects.get(&key) {
            // Same resourceVersion after a re-list: nothing changed, nothing to do.
            Some(old)
                if old.resource_version == obj.metadata.resource_version && old.uid == obj.metadata.uid =>
            {
                return None;
            }
            Some(_) => EventType::Modified,
            None => EventType::Added,
        };
        self.objects.insert(key, Known::of(&obj));
        Some((ty, obj))
    }

    /// Every kept object, parsed again.
    pub fn all(&self) -> impl Iterator<Item = DynamicObject> + '_ {
        self.objects.values().filter_map(Known::object)
    }

    /// The keys of every kept object (what a periodic re-send goes through).
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.objects.keys()
    }

    /// The kept object under `key`, parsed again; `None` once it is gone.
    pub fn get(&self, key: &str) -> Option<DynamicObject> {
        self.objects.get(key).and_then(Known::object)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// Watches one kind until `stop` is cancelled.
pub async fn run_watch(
    client: Client,
    resource: Arc<ApiResource>,
    selector: WatchSelector,
    reconcile_period: Duration,
    sink: Arc<dyn EventHandler>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::all_with(client, resource.as_ref());
    let mut cfg = watcher::Config::default();
    if let Some(l) = &selector.labels {
        cfg = cfg.labels(l);
    }
    if let Some(f) = &selector.fields {
        cfg = cfg.fields(f);
    }
    let start = || {
        watcher::watcher(api.clone(), cfg.clone())
            .default_backoff()
            .boxed()
    };
    let mut stream = start();
    let mut known = KnownObjects::default();
    let mut tick = tokio::time::interval(reconcile_period.max(Duration::from_secs(1)));
    tick.tick().await;
    // Keys still to re-send in this period, a few at a time while the pipeline's backlog is
    // small: each re-sent object is parsed and queued, and ten thousand at once were most of
    // the controller's memory in a burst.
    let mut resend: VecDeque<String> = VecDeque::new();
    let mut pace = tokio::time::interval(RESEND_PACE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                tracing::debug!(kind = %resource.kind, objects = known.len(), "periodic reconcile");
                // Re-send what we know (heals handlers whose retries ran out) and re-list (heals
                // anything the watch itself missed: the re-list's changes and deletions follow).
                // A re-send still going from the last period goes on from where it is.
                if resend.is_empty() {
                    resend.extend(known.keys().cloned());
                }
                stream = start();
            }
            _ = pace.tick(), if !resend.is_empty() => {
                if sink.backlog().await < RESEND_BACKLOG {
                    for key in resend.drain(..RESEND_BATCH.min(resend.len())).collect::<Vec<_>>() {
                        // The object as it is now; one deleted meanwhile is not re-sent.
                        if let Some(obj) = known.get(&key) {
                            let _ = sink.handle(Event::resync(resource.clone(), obj)).await;
                        }
                    }
                }
            }
            next = stream.next() => match next {
                None => return,
                Some(Err(e)) => {
                    // The backoff wrapper already slows reconnects down; just report.
                    tracing::warn!(kind = %resource.kind, error = %e, "watch error; reconnecting");
                }
                Some(Ok(ev)) => {
                    for (ty, obj) in known.apply(ev) {
                        metrics.watch_event(&resource.kind, ty.as_str());
                        let _ = sink.handle(Event::new(ty, resource.clone(), obj)).await;
                    }
                }
            }
        }
    }
}
