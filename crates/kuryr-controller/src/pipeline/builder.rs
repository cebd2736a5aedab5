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
    pub handler: Arc<dyn EventHandler>,
}

impl RegisteredHandler {
    pub fn new<H: ResourceEventHandler>(handler: H) -> Self {
        let handler = Arc::new(handler);
        let typed = Typed::new(handler.clone());
        Self {
            name: handler.name().to_string(),
            resource: Typed::<H>::api_resource(),
            selector: typed.selector(),
            handler: Arc::new(typed),
        }
    }

    pub fn gvk(&self) -> GroupVersionKind {
        GroupVersionKind::gvk(&self.resource.group, &self.resource.version, &self.resource.kind)
    }
}

pub struct ControllerPipeline {
    dispatcher: Dispatcher,
    /// kind -> (resource, selector shared by all its handlers, or None when they disagree)
    watches: HashMap<GroupVersionKind, (Arc<ApiResource>, Option<WatchSelector>)>,
    source: Arc<dyn ObjectSource>,
    retry: RetryPolicy,
    metrics: Metrics,
    names: Vec<String>,
}

impl ControllerPipeline {
    pub fn new(source: Arc<dyn ObjectSource>, retry: RetryPolicy, metrics: Metrics) -> Self {
        Self {
            dispatcher: Dispatcher::new(),
            watches: HashMap::new(),
            source,
            retry,
            metrics,
            names: vec![],
        }
    }

    /// Wraps the handler as LogExceptions(Retry(handler)) and registers it for its kind.
    pub fn register(&mut self, h: RegisteredHandler) {
        let gvk = h.gvk();
        let wrapped = LogExceptions::new(
            Retry::new(
                h.handler,
                self.source.clone(),
                self.retry.clone(),
                self.metrics.clone(),
            ),
            self.metrics.clone(),
        );
        self.dispatcher.register(gvk.clone(), Arc::new(wrapped));
        self.names.push(h.name);
        self.watches
            .entry(gvk)
            .and_modify(|(_, sel)| {
                if sel.as_ref() != Some(&h.selector) {
                    *sel = None;
                }
            })
            .or_insert((Arc::new(h.resource), Some(h.selector)));
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
        for (_, (resource, selector)) in watches {
            tasks.spawn(crate::watcher::run_watch(
                client.clone(),
                resource,
                selector.unwrap_or_default(),
                reconcile_period,
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
