//! Watcher: list+watch of one kind feeding the pipeline.
//!
//! kube-runtime's watcher resumes from the last resourceVersion, re-lists on 410 Gone and reconnects
//! with backoff. On top of it we keep the uid and version of every object so that (a) objects
//! deleted while the watch was down still produce a DELETED event after the re-list, and (b) a
//! periodic full reconcile (`[kubernetes] watch_reconcile_period`) re-lists and re-sends every
//! object as MODIFIED, healing anything a lost event or an exhausted retry left behind.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pipeline::watched::WatchedObject;
use crate::pipeline::{Event, EventHandler, EventType, WatchSelector};

/// The periodic re-send queues at most this many objects per [`RESEND_PACE`]...
const RESEND_BATCH: usize = 32;
const RESEND_PACE: Duration = Duration::from_millis(20);
/// ...and only while the pipeline holds fewer objects than this...
const RESEND_BACKLOG: usize = 256;
/// ...reading the objects this many at a time.
const RESEND_PAGE: u32 = 100;

/// What is known of every object of one kind, keyed by `namespace/name`. Pure state, tested
/// without a server.
///
/// Only the uid and resourceVersion of an object are kept, unless a handler of the kind reads
/// the last state of an object a re-list found deleted (`keep_state`): then it is kept too, as
/// compact JSON. With ten thousand pods and KuryrPorts the kept copies were a fifth of the
/// controller's memory, for deletions no handler of those kinds looks at.
#[derive(Default)]
pub struct KnownObjects {
    objects: HashMap<Box<str>, Known>,
    relisting: Option<HashSet<String>>,
    keep_state: bool,
}

/// What is kept of an object: its uid and resourceVersion in one allocation (`uid/version`;
/// neither contains a slash), 32 bytes a slot, since a controller of 10,000 pods keeps one for
/// every pod and KuryrPort.
struct Known {
    id: Box<str>,
    state: Option<Box<str>>,
}

fn known_id(obj: &DynamicObject) -> String {
    let m = &obj.metadata;
    format!(
        "{}/{}",
        m.uid.as_deref().unwrap_or_default(),
        m.resource_version.as_deref().unwrap_or_default()
    )
}

impl Known {
    fn of(obj: &DynamicObject, keep_state: bool) -> Self {
        Self {
            id: known_id(obj).into_boxed_str(),
            // A DynamicObject (string keys, JSON values) always serializes.
            state: keep_state.then(|| serde_json::to_string(obj).unwrap_or_default().into_boxed_str()),
        }
    }

    /// Whether `obj` is the uid and version kept (compared in place: this runs for every event).
    fn is(&self, obj: &DynamicObject) -> bool {
        let m = &obj.metadata;
        self.id.split_once('/')
            == Some((
                m.uid.as_deref().unwrap_or_default(),
                m.resource_version.as_deref().unwrap_or_default(),
            ))
    }

    fn uid(&self) -> Option<String> {
        let (uid, _) = self.id.split_once('/')?;
        (!uid.is_empty()).then(|| uid.to_string())
    }

    /// The object as last seen, or (without a kept state) its [`tombstone`].
    fn last_seen(self, key: &str) -> Option<DynamicObject> {
        let Some(state) = self.state else {
            return Some(tombstone(key, self.uid()));
        };
        match serde_json::from_str(&state) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(error = %e, "a kept object does not parse back; skipped");
                None
            }
        }
    }
}

/// A deleted object of which only the name, namespace and uid are known: `data` is null, which
/// tells the typed handlers there is no state to read (see
/// [`crate::pipeline::ResourceEventHandler::keeps_last_state`]).
fn tombstone(key: &str, uid: Option<String>) -> DynamicObject {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    DynamicObject {
        types: None,
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: (!ns.is_empty()).then(|| ns.to_string()),
            uid,
            ..ObjectMeta::default()
        },
        data: serde_json::Value::Null,
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
    /// Keeping the last state of every object (see [`KnownObjects`]) or not.
    pub fn new(keep_state: bool) -> Self {
        Self {
            keep_state,
            ..Self::default()
        }
    }

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
                let gone: Vec<Box<str>> = self
                    .objects
                    .keys()
                    .filter(|k| !seen.contains(&***k))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .filter_map(|k| {
                        let known = self.objects.remove(&k)?;
                        known.last_seen(&k)
                    })
                    .map(|obj| (EventType::Deleted, obj))
                    .collect()
            }
            WEvent::Apply(obj) => self.upsert(obj).into_iter().collect(),
            WEvent::Delete(obj) => {
                self.objects.remove(key_of(&obj).as_str());
                vec![(EventType::Deleted, obj)]
            }
        }
    }

    fn upsert(&mut self, obj: DynamicObject) -> Option<(EventType, DynamicObject)> {
        let key = key_of(&obj);
        let ty = match self.objects.get(key.as_str()) {
            // Same resourceVersion after a re-list: nothing changed, nothing to do.
            Some(old) if old.is(&obj) => {
                return None;
            }
            Some(_) => EventType::Modified,
            None => EventType::Added,
        };
        self.objects
            .insert(key.into_boxed_str(), Known::of(&obj, self.keep_state));
        Some((ty, obj))
    }

    /// Whether `obj` is the version of it the watch delivered last. A re-send's later pages
    /// are the API server's snapshot at its first page: an object changed or deleted since is
    /// there as it was, and re-sent it would undo what the watch delivered (a deleted pod
    /// wired again, a label flipped back).
    pub fn holds(&self, obj: &DynamicObject) -> bool {
        self.objects
            .get(key_of(obj).as_str())
            .is_some_and(|known| known.is(obj))
    }

    /// Whether a re-list is under way: until it is done, what changed meanwhile (a deletion
    /// above all) is not known yet, and [`Self::holds`] could pass an object that is gone.
    pub fn relisting(&self) -> bool {
        self.relisting.is_some()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// The periodic re-send, a page of objects at a time as they are now, paced by the pipeline's
/// backlog: re-sent objects are parsed and queued, and ten thousand at once were most of the
/// controller's memory in a burst.
struct Resend {
    api: Api<WatchedObject>,
    params: ListParams,
    /// The listed objects not sent yet.
    page: VecDeque<DynamicObject>,
    /// Where the next page starts; `None` once the last page was read.
    next: Option<String>,
}

impl Resend {
    fn start(api: &Api<WatchedObject>, selector: &WatchSelector) -> Self {
        let mut params = ListParams::default().limit(RESEND_PAGE);
        if let Some(l) = &selector.labels {
            params = params.labels(l);
        }
        if let Some(f) = &selector.fields {
            params = params.fields(f);
        }
        Self {
            api: api.clone(),
            params,
            page: VecDeque::new(),
            next: Some(String::new()),
        }
    }

    /// Up to [`RESEND_BATCH`] objects to re-send (none when a page must be asked again);
    /// `Ok(None)` once every object was.
    async fn batch(&mut self) -> Result<Option<Vec<DynamicObject>>, kube::Error> {
        if self.page.is_empty() {
            let Some(token) = self.next.take() else {
                return Ok(None);
            };
            let mut params = self.params.clone();
            if !token.is_empty() {
                params = params.continue_token(&token);
            }
            let list = match self.api.list(&params).await {
                Ok(list) => list,
                // Paced by the backlog, a re-send can outlast the server's history (410): it
                // re-sends objects as they are now, so the server's offer to go on from the same
                // place at the current version is just as good.
                Err(kube::Error::Api(s)) if s.code == 410 && !token.is_empty() => {
                    match s
                        .metadata
                        .as_ref()
                        .and_then(|m| m.continue_.clone())
                        .filter(|t| !t.is_empty())
                    {
                        Some(offered) => {
                            self.next = Some(offered);
                            return Ok(Some(Vec::new()));
                        }
                        None => return Err(kube::Error::Api(s)),
                    }
                }
                Err(e) => return Err(e),
            };
            self.next = list.metadata.continue_.filter(|t| !t.is_empty());
            self.page = list.items.into_iter().map(|o| o.0).collect();
            if self.page.is_empty() && self.next.is_none() {
                return Ok(None);
            }
        }
        let n = RESEND_BATCH.min(self.page.len());
        Ok(Some(
            self.page
                .drain(..n)
                .map(|mut o| {
                    slim(&mut o);
                    o
                })
                .collect(),
        ))
    }
}

/// The watch's event with its objects as the pipeline takes them (a move, not a copy).
fn unwrap_event(ev: WEvent<WatchedObject>) -> WEvent<DynamicObject> {
    match ev {
        WEvent::Apply(o) => WEvent::Apply(o.0),
        WEvent::Delete(o) => WEvent::Delete(o.0),
        WEvent::Init => WEvent::Init,
        WEvent::InitApply(o) => WEvent::InitApply(o.0),
        WEvent::InitDone => WEvent::InitDone,
    }
}

/// Watches one kind until `stop` is cancelled. `keep_state`: see [`KnownObjects`].
#[allow(clippy::too_many_arguments)]
pub async fn run_watch(
    client: Client,
    resource: Arc<ApiResource>,
    selector: WatchSelector,
    reconcile_period: Duration,
    keep_state: bool,
    sink: Arc<dyn EventHandler>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let api: Api<WatchedObject> = Api::all_with(client, resource.as_ref());
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
    let mut known = KnownObjects::new(keep_state);
    let mut tick = tokio::time::interval(reconcile_period.max(Duration::from_secs(1)));
    tick.tick().await;
    let mut resend: Option<Resend> = None;
    let mut pace = tokio::time::interval(RESEND_PACE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                tracing::debug!(kind = %resource.kind, objects = known.len(), "periodic reconcile");
                // Re-send every object (heals handlers whose retries ran out) and re-list (heals
                // anything the watch itself missed: the re-list's changes and deletions follow).
                // A re-send still going from the last period goes on from where it is.
                resend.get_or_insert_with(|| Resend::start(&api, &selector));
                stream = start();
            }
            _ = pace.tick(), if resend.is_some() => {
                if known.relisting() || sink.backlog().await >= RESEND_BACKLOG {
                    continue;
                }
                let Some(r) = resend.as_mut() else { continue };
                match r.batch().await {
                    Ok(Some(objects)) => {
                        // Only what the watch holds as it is: what changed since the re-send's
                        // first page comes (or came) through the watch.
                        for obj in objects.into_iter().filter(|o| known.holds(o)) {
                            let _ = sink.handle(Event::resync(resource.clone(), obj)).await;
                        }
                    }
                    Ok(None) => resend = None,
                    Err(e) => {
                        tracing::warn!(kind = %resource.kind, error = %e, "periodic re-send: listing failed; next period");
                        resend = None;
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
                    for (ty, obj) in known.apply(unwrap_event(ev)) {
                        metrics.watch_event(&resource.kind, ty.as_str());
                        let _ = sink.handle(Event::new(ty, resource.clone(), obj)).await;
                    }
                }
            }
        }
    }
}
