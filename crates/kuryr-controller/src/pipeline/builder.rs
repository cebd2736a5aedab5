//! ControllerPipeline: assembles the wrappers and runs one watch per registered kind.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::ApiResource;
use kube::core::GroupVersionKind;
use tokio_util::sync::CancellationToken;

use super::{
    Async, Dispatcher, EventHandler, LogExceptions, ResourceEventHandler, Retry, RetryPolicy, Typed,
    WatchSelector,
};
use crate::k8s::ObjectSource;
use crate::metrics::Metrics;

/// A handler ready to be plugged into the pipeline: its kind, watch selector and type-erased handler.
pub struct RegisteredHandler {
    pub name: String,
    pub resource: ApiResource,
    pub selector: WatchSelector,
    /// See [`ResourceEventHandler::keeps_last_state`].
    pub keeps_last_state: bool,
    /// See [`ResourceEventHandler::longest_wait`].
    pub longest_wait: Duration,
    pub handler: Arc<dyn EventHandler>,
}

impl RegisteredHandler {
    pub fn new<H: ResourceEventHandler>(handler: H) -> Self {
        Self::build(handler, None)
    }

    /// [`RegisteredHandler::new`], and an object of its kind that cannot be parsed becomes a
    /// Warning Event on the object, naming the field.
    pub fn telling<H: ResourceEventHandler>(handler: H, events: kuryr_crds::events::Events) -> Self {
        Self::build(handler, Some(events))
    }

    fn build<H: ResourceEventHandler>(handler: H, events: Option<kuryr_crds::events::Events>) -> Self {
        let handler = Arc::new(handler);
        let typed = Typed::new(handler.clone());
        let typed = match events {
            Some(events) => typed.telling(events),
            None => typed,
        };
        Self {
            name: handler.name().to_string(),
            resource: Typed::<H>::api_resource(),
            selector: typed.selector(),
            keeps_last_state: typed.keeps_last_state(),
            longest_wait: handler.longest_wait(),
            handler: Arc::new(typed),
        }
    }

    pub fn gvk(&self) -> GroupVersionKind {
        GroupVersionKind::gvk(&self.resource.group, &self.resource.version, &self.resource.kind)
    }
}

/// The one watch of a kind, for all its handlers.
struct Watch {
    resource: Arc<ApiResource>,
    /// The selector all its handlers share, or None when they disagree (everything is watched).
    selector: Option<WatchSelector>,
    /// Whether any of them keeps the last state of deleted objects.
    keep_state: bool,
}

pub struct ControllerPipeline {
    dispatcher: Dispatcher,
    watches: HashMap<GroupVersionKind, Watch>,
    source: Arc<dyn ObjectSource>,
    retry: RetryPolicy,
    metrics: Metrics,
    names: Vec<String>,
    /// The leadership term the handlers run in.
    term: CancellationToken,
}

impl ControllerPipeline {
    pub fn new(
        source: Arc<dyn ObjectSource>,
        retry: RetryPolicy,
        metrics: Metrics,
        term: CancellationToken,
    ) -> Self {
        Self {
            dispatcher: Dispatcher::new(),
            watches: HashMap::new(),
            source,
            retry,
            metrics,
            names: vec![],
            term,
        }
    }

    /// Wraps the handler as LogExceptions(Retry(handler)) and registers it for its kind.
    pub fn register(&mut self, h: RegisteredHandler) {
        let gvk = h.gvk();
        let policy = self.retry.allowing(h.longest_wait);
        let wrapped = LogExceptions::new(
            Retry::new(h.handler, self.source.clone(), policy, self.metrics.clone()),
            self.metrics.clone(),
            self.term.clone(),
        );
        self.dispatcher.register(gvk.clone(), Arc::new(wrapped));
        self.names.push(h.name);
        self.watches
            .entry(gvk)
            .and_modify(|w| {
                if w.selector.as_ref() != Some(&h.selector) {
                    w.selector = None;
                }
                w.keep_state |= h.keeps_last_state;
            })
            .or_insert(Watch {
                resource: Arc::new(h.resource),
                selector: Some(h.selector),
                keep_state: h.keeps_last_state,
            });
    }

    pub fn handler_names(&self) -> &[String] {
        &self.names
    }

    /// Runs the watches until `stop` is cancelled.
    pub async fn run(
        self,
        client: Client,
        reconcile_period: Duration,
        max_concurrency: usize,
        stop: CancellationToken,
    ) {
        let watches = self.watches;
        let metrics = self.metrics.clone();
        // Dropping this future (lost leadership, an aborted task) or `stop` ends every queue.
        let queues_stop = stop.child_token();
        let _cancel_queues_on_drop = queues_stop.clone().drop_guard();
        let sink = Arc::new(Async::with_stop(self.dispatcher, max_concurrency, queues_stop));
        let mut tasks = tokio::task::JoinSet::new();
        for (_, w) in watches {
            tasks.spawn(crate::watcher::run_watch(
                client.clone(),
                w.resource,
                w.selector.unwrap_or_default(),
                reconcile_period,
                w.keep_state,
                sink.clone() as Arc<dyn EventHandler>,
                metrics.clone(),
                stop.clone(),
            ));
        }
        // Export the queue depth while running.
        let depth_sink = sink.clone();
        let depth_stop = stop.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = depth_stop.cancelled() => return,
                    _ = tick.tick() => metrics.set_queue_depth(depth_sink.depth().await),
                }
            }
        });
        while tasks.join_next().await.is_some() {}
    }
}
