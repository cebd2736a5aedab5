//! Single port creates that are asked while others are on their way go to Neutron together, as one
//! bulk request (group commit).
//!
//! A burst of pods on the `noop` pool asks for one port each, hundreds at once: sent one by one,
//! each is a round trip and a request for the server to parse, authorize and commit, and on a
//! neutron-server with two API workers they queue behind each other anyway. Here a few create
//! requests are out per client; creates asked meanwhile wait and go in the next request, up to
//! [`MAX_BATCH`] ports. How many requests and how many ports in each follow the server's answers
//! ([`pace`](super::pace)): a slow server is not handed a queue that its other requests (an
//! ACTIVE poll) would wait behind. A lone create goes at once and alone, as before.
//!
//! Guarantees:
//! - every create gets its own answer: Neutron's bulk create is atomic (nothing is made when one
//!   port is refused), so a bulk refused for something in it (4xx) is asked again one port at a
//!   time and each port gets the answer it would have had alone (the neutron-contract suite
//!   checks the atomicity on the real server, for quota and address conflicts; a 500 is asked
//!   again too, as an ML2 driver may have failed on one port's network); a bulk that failed for
//!   no one port's sake (busy or unreachable server, authentication, an unreadable answer) fails
//!   for each of its ports with that error, without asking again, as their own creates would
//!   have;
//! - the quota gate sees each create as before: admitted before it waits, and told the answer
//!   of the request that carried it;
//! - a create whose caller stopped waiting (its handler cancelled) before it was sent is not
//!   sent; a port made for one that stopped waiting later is deleted, not left behind; if that
//!   delete fails, its tags leave it to the orphan sweep;
//! - a sender that ends without emptying the queue (its task panicked or was dropped) gives its
//!   place back, and the creates it leaves are answered with an error when no sender is left.
//! - bulk creates ([`NeutronClient::create_ports`], the pools' refills) count among the requests
//!   out: one waits for a place, a sender that has sent a request gives its place up while one
//!   waits, and a place that frees goes to the queued creates when none of their senders is out,
//!   else to a waiting bulk, else to the queue - never left unused while work waits, and neither
//!   kind starves the other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use reqwest::Method;
use serde_json::Value;
use tokio::sync::oneshot;

use super::pace::{MAX_BATCH, MAX_SENDERS, Pace, Sent};
use super::{Call, NeutronClient, Reply, over_quota};
use crate::error::{Error, Result};
use crate::quota_gate::Pass;
use crate::types::Port;

/// The operation name (metrics label, error text) of a bulk request carrying the pods' own
/// creates; `create_ports` stays the name of the bulks asked for as such (the pools' refills), so
/// an operator tells the two apart.
pub(crate) const COALESCED_OP: &str = "create_ports_coalesced";

/// One create waiting for a request to carry it.
struct Waiting {
    body: Value,
    project: String,
    pass: Option<Pass>,
    answer: oneshot::Sender<Result<Port>>,
}

impl Queue {
    /// A sender ended without being counted out (its task died, or could not be started): its
    /// place is given back, and with no sender left what is queued is answered with an error (the
    /// answers dropped) rather than left waiting.
    fn sender_gone(&mut self) {
        self.senders = self.senders.saturating_sub(1);
        if self.senders == 0 {
            self.waiting.clear();
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Requests out: tasks sending the queue's creates (each until the queue is empty) and bulk
    /// creates holding a [`Place`].
    senders: usize,
    /// Bulk creates waiting for a place, and holding one.
    bulks_waiting: usize,
    bulks_out: usize,
    pace: Pace,
}

/// The port creates of one client.
#[derive(Default)]
pub(crate) struct PortCreates {
    queue: Mutex<Queue>,
    /// Woken when a place may have freed for a waiting bulk create.
    freed: tokio::sync::Notify,
}

impl PortCreates {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, w: Waiting) {
        self.lock().waiting.push_back(w);
    }

    /// The next request's creates; empty (and the sender counted out) when none wait, or when
    /// more senders are out than the pace allows now (the others carry on). Creates whose callers
    /// stopped waiting (their handler cancelled) are dropped here, not sent.
    ///
    /// `sent_one`: this sender has sent a request already. Only then does it give its place to a
    /// waiting bulk create (a pool's refill; the queue gets the place back when the bulk is
    /// answered) - a new sender would otherwise leave at once, and the next one too.
    fn next_batch(&self, sent_one: bool) -> Vec<Waiting> {
        let mut q = self.lock();
        let to_a_bulk = sent_one && q.bulks_waiting > 0 && q.senders >= q.pace.senders();
        if q.senders > q.pace.senders() || to_a_bulk {
            q.senders -= 1;
            return Vec::new();
        }
        let most = q.pace.batch();
        let mut batch = Vec::with_capacity(q.waiting.len().min(most));
        while batch.len() < most {
            match q.waiting.pop_front() {
                Some(w) if w.answer.is_closed() => {}
                Some(w) => batch.push(w),
                None => break,
            }
        }
        if batch.is_empty() {
            // Under the lock `push` takes: a create queued after this finds one place free.
            q.senders -= 1;
        }
        batch
    }

    /// Takes a place among the requests out for a bulk create if the pace has one free.
    fn try_take_place(&self) -> bool {
        let mut q = self.lock();
        let free = q.senders < q.pace.senders();
        if free {
            q.senders += 1;
            q.bulks_out += 1;
        }
        free
    }

    /// What the pace tags a request sent now with.
    fn sent(&self) -> Sent {
        self.lock().pace.sent()
    }
}

/// A sender's place. A sender that found the queue empty was counted out then; one whose task
/// ended otherwise (a panic, or dropped with its runtime) gives its place back here, and if it
/// was the last one, what is still queued is answered with an error rather than left waiting.
struct SenderSlot<'a> {
    creates: &'a PortCreates,
    out: bool,
}

impl Drop for SenderSlot<'_> {
    fn drop(&mut self) {
        if self.out {
            return;
        }
        self.creates.lock().sender_gone();
        // The place it held may be a waiting bulk's now.
        self.creates.freed.notify_waiters();
    }
}

/// A bulk create's place among the requests out, held while its request is out.
pub(super) struct Place(NeutronClient);

impl Drop for Place {
    fn drop(&mut self) {
        {
            let mut q = self.0.creates.lock();
            q.senders = q.senders.saturating_sub(1);
            q.bulks_out = q.bulks_out.saturating_sub(1);
        }
        self.0.hand_on_place();
    }
}

/// Counts a bulk create among those waiting for a place; one that stops waiting (it got a place,
/// or its caller gave up) hands on what may be free, so that a place it was woken for is used.
struct BulkWaiting<'a>(&'a NeutronClient);

impl<'a> BulkWaiting<'a> {
    fn new(client: &'a NeutronClient) -> Self {
        client.creates.lock().bulks_waiting += 1;
        Self(client)
    }
}

impl Drop for BulkWaiting<'_> {
    fn drop(&mut self) {
        {
            let mut q = self.0.creates.lock();
            q.bulks_waiting = q.bulks_waiting.saturating_sub(1);
        }
        self.0.hand_on_place();
    }
}

/// Whether a failed bulk may have failed for one of its ports: Neutron refusing something in the
/// request (4xx but 429), or a 500 (an ML2 driver failing on one port's network). Nothing was made
/// then (the bulk is atomic), and the ports are asked for again one by one.
fn maybe_one_ports_fault(e: &Error) -> bool {
    e.api()
        .is_some_and(|a| (400..500).contains(&a.status) && a.status != 429 || a.status == 500)
}

impl NeutronClient {
    /// How many ports one create request should carry now: what this Neutron answers in about
    /// two seconds, from its recent answers (see `client/pace.rs`); 20 before the first answer.
    /// Bulk creates larger than this are sent as they are; callers that can split theirs (pool
    /// refills) should.
    pub fn ports_per_request(&self) -> usize {
        self.creates.lock().pace.within_target().unwrap_or(MAX_BATCH)
    }

    /// `POST /v2.0/ports` for one port. Creates asked while others are out may be sent with them
    /// as one bulk request (see [`coalesce`](self)); the answer is this port's either way.
    pub async fn create_port(&self, req: &crate::types::PortCreate) -> Result<Port> {
        const OP: &str = "create_port";
        let (body, project, pass) = self.admit(OP, "port", req)?;
        let (answer, rx) = oneshot::channel();
        self.creates.push(Waiting {
            body,
            project,
            pass,
            answer,
        });
        self.hand_on_place();
        rx.await.unwrap_or_else(|_| {
            Err(Error::Config(format!(
                "{OP}: the request carrying this create was dropped (the runtime shutting down, or its sender failed)"
            )))
        })
    }

    /// Tells the pace a request of `ports` creates, sent at `sent`, was answered in `took`; a
    /// place the pace opens goes to waiting work at once (queued creates would otherwise wait
    /// for the next create asked to start a sender).
    fn answered(&self, sent: Sent, ports: usize, took: std::time::Duration) {
        self.creates.lock().pace.answered(sent, ports, took);
        self.hand_on_place();
    }

    /// A place among the requests out for a bulk create, once the pace has one free; coalesced
    /// creates' senders give theirs up between requests while a bulk waits.
    pub(super) async fn bulk_place(&self) -> Place {
        let _waiting = BulkWaiting::new(self);
        loop {
            // Registered before the look, so that a place freed in between is not missed.
            let freed = self.creates.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.creates.try_take_place() {
                return Place(self.clone());
            }
            freed.await;
        }
    }

    /// Free places go to waiting work: to the queued creates first when none of their senders is
    /// out (bulks back to back must not starve the pods' own creates), then to waiting bulk
    /// creates (woken; the first to look takes one), then to the queue (a sender per free place,
    /// at most one per queued create): a free place is never left unused while work waits.
    fn hand_on_place(&self) {
        let (start, wake) = {
            let mut q = self.creates.lock();
            let free = q.pace.senders().saturating_sub(q.senders);
            let queue_served = q.senders > q.bulks_out;
            let start = match (q.waiting.len(), q.bulks_waiting) {
                (0, _) => 0,
                (_, 0) => free.min(q.waiting.len()),
                _ if queue_served => 0,
                _ => free.min(1),
            };
            q.senders += start;
            (start, free > start && q.bulks_waiting > 0)
        };
        if wake {
            self.creates.freed.notify_waiters();
        }
        for _ in 0..start {
            // A task of its own: a request carries many callers' creates, which must not be lost
            // if the caller that started it is cancelled.
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let client = self.clone();
                    rt.spawn(async move { client.send_creates().await });
                }
                // No runtime to send with (it is shutting down): nothing can be sent any more.
                Err(_) => self.creates.lock().sender_gone(),
            }
        }
    }

    /// Sends `call` (a port create request of `ports` ports) and tells the pace how long the
    /// server took to answer it: the answered attempt's round trip, not the client's own waits
    /// (a token fetch, the concurrency cap, a retry's backoff), which say nothing of the server's
    /// queue.
    pub(super) async fn paced(
        &self,
        ports: usize,
        call: impl std::future::Future<Output = Result<Reply>>,
    ) -> Result<Reply> {
        let sent = self.creates.sent();
        let answer = call.await;
        match &answer {
            Ok(reply) => {
                tracing::debug!(
                    ports,
                    took_ms = reply.took().as_millis() as u64,
                    "port create answered"
                );
                self.answered(sent, ports, reply.took());
            }
            Err(e) => tracing::debug!(ports, error = %e, "port create failed"),
        }
        answer
    }

    async fn send_creates(&self) {
        let mut slot = SenderSlot {
            creates: &self.creates,
            out: false,
        };
        let mut sent_one = false;
        loop {
            let batch = self.creates.next_batch(sent_one);
            sent_one = true;
            match batch.len() {
                0 => {
                    slot.out = true;
                    self.hand_on_place();
                    return;
                }
                1 => {
                    let [one] =
                        <[Waiting; 1]>::try_from(batch).unwrap_or_else(|_| unreachable!("one create"));
                    self.send_alone(one).await;
                }
                _ => self.send_bulk(batch).await,
            }
        }
    }

    async fn send_alone(&self, w: Waiting) {
        let answer = self
            .paced(1, self.post_ports("create_port", "port", &w.body))
            .await
            .and_then(|r| r.unwrap("port"));
        if let Some(pass) = w.pass {
            self.gate.observe("port", &w.project, pass, over_quota(&answer));
        }
        self.hand_over(w.answer, answer).await;
    }

    async fn send_bulk(&self, batch: Vec<Waiting>) {
        let bodies: Vec<&Value> = batch.iter().map(|w| &w.body).collect();
        let answer: Result<Vec<Port>> = self
            .paced(batch.len(), self.post_ports(COALESCED_OP, "ports", &bodies))
            .await
            .and_then(|r| r.unwrap("ports"));
        match answer {
            Ok(ports) if ports.len() == batch.len() => {
                let mut unclaimed = Vec::new();
                for (w, port) in batch.into_iter().zip(ports) {
                    if let Some(pass) = w.pass {
                        self.gate.observe("port", &w.project, pass, Some(false));
                    }
                    if let Err(Ok(port)) = w.answer.send(Ok(port)) {
                        unclaimed.push(port.id);
                    }
                }
                // Every caller has its port before the leftovers are cleaned up.
                for id in unclaimed {
                    self.delete_unclaimed(&id).await;
                }
            }
            Ok(ports) => {
                // Not Neutron's behaviour; which port is whose is unknown, so none is kept.
                tracing::warn!(
                    asked = batch.len(),
                    answered = ports.len(),
                    "a bulk port create answered a different number of ports; deleting them and creating one by one"
                );
                for p in &ports {
                    self.delete_unclaimed(&p.id).await;
                }
                self.send_each(batch).await;
            }
            Err(e) if maybe_one_ports_fault(&e) => {
                tracing::debug!(ports = batch.len(), error = %e, "bulk port create refused; asking for each port alone");
                self.send_each(batch).await;
            }
            Err(e) => {
                // Not any one port's fault (the server busy or unreachable, authentication, an
                // answer that cannot be read - whose bulk may well have been made): each port fails
                // with it, as its own create would have, and its caller backs off; asking again port
                // by port would only repeat it, or make the ports twice.
                let shared = Arc::new(e);
                for w in batch {
                    self.hand_over(w.answer, Err(Error::Shared(shared.clone()))).await;
                }
            }
        }
    }

    /// `POST /v2.0/ports` with `{key: body}`.
    async fn post_ports<B: serde::Serialize + ?Sized>(
        &self,
        op: &'static str,
        key: &str,
        body: &B,
    ) -> Result<Reply> {
        let call =
            Call::new(op, Method::POST, &["ports"]).json(&std::collections::BTreeMap::from([(key, body)]))?;
        self.execute(call).await
    }

    /// The ports of a refused bulk one by one, a few at a time (as many as requests may be out).
    async fn send_each(&self, batch: Vec<Waiting>) {
        use futures::StreamExt;
        futures::stream::iter(batch)
            .for_each_concurrent(MAX_SENDERS, |w| self.send_alone(w))
            .await;
    }

    /// Gives `answer` to its caller; a port nobody waits for any more is deleted.
    async fn hand_over(&self, to: oneshot::Sender<Result<Port>>, answer: Result<Port>) {
        if let Err(Ok(port)) = to.send(answer) {
            self.delete_unclaimed(&port.id).await;
        }
    }

    async fn delete_unclaimed(&self, id: &str) {
        match self.delete_port(id).await {
            Ok(()) => tracing::debug!(port = id, "deleted a port its creator no longer waited for"),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(port = id, error = %e, "cannot delete a port its creator no longer waited for; the orphan sweep collects it by its tags")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::Router;
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::{delete, post};
    use serde_json::json;

    use super::*;
    use crate::auth::ClientOptions;
    use crate::error::ErrorKind;
    use crate::types::PortCreate;

    /// A Neutron that answers port creates after a pause (20 ms, so that creates pile up behind
    /// the ones out; 500 ms for a `slow-*` port), fails a whole request for one of its ports
    /// (`bad-*` 400, `broken-*` 500, `busy-*` 503: Neutron's bulk is atomic), and records what it
    /// was asked.
    #[derive(Default)]
    struct Seen {
        /// Ports per create request, in arrival order.
        requests: Vec<usize>,
        made: usize,
        deleted: Vec<String>,
        /// Create requests being answered now, and the most at once.
        out: usize,
        most_out: usize,
    }

    /// Counts a create request as out while its handler runs.
    struct Out(Shared);

    impl Out {
        fn new(seen: &Shared) -> Self {
            let mut s = seen.lock().expect("lock");
            s.out += 1;
            s.most_out = s.most_out.max(s.out);
            Self(seen.clone())
        }
    }

    impl Drop for Out {
        fn drop(&mut self) {
            self.0.lock().expect("lock").out -= 1;
        }
    }

    type Shared = Arc<Mutex<Seen>>;

    async fn create(State(seen): State<Shared>, axum::Json(body): axum::Json<Value>) -> Response {
        let (items, bulk) = match (body.get("port"), body.get("ports").and_then(Value::as_array)) {
            (Some(one), None) => (vec![one.clone()], false),
            (None, Some(many)) => (many.clone(), true),
            _ => return StatusCode::BAD_REQUEST.into_response(),
        };
        seen.lock().expect("lock").requests.push(items.len());
        let _out = Out::new(&seen);
        let named = |prefix: &str| {
            items
                .iter()
                .any(|p| p["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        };
        let pause = if named("slow") { 500 } else { 20 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if named("busy") {
            let e = json!({"NeutronError": {"type": "ServiceUnavailable", "message": "busy", "detail": ""}});
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(e)).into_response();
        }
        if named("bad") {
            let e = json!({"NeutronError": {"type": "InvalidInput", "message": "Invalid input for name.", "detail": ""}});
            return (StatusCode::BAD_REQUEST, axum::Json(e)).into_response();
        }
        if named("broken") {
            // An ML2 driver failing on one port's network.
            let e = json!({"NeutronError": {"type": "MechanismDriverError", "message": "create_port_postcommit failed.", "detail": ""}});
            return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(e)).into_response();
        }
        let mut s = seen.lock().expect("lock");
        let ports: Vec<Value> = items
            .iter()
            .map(|p| {
                s.made += 1;
                json!({"id": format!("port-{}", s.made), "name": p["name"], "network_id": p["network_id"],
                       "status": "DOWN", "mac_address": "fa:16:3e:00:00:01", "fixed_ips": []})
            })
            .collect();
        let body = if bulk {
            json!({ "ports": ports })
        } else {
            json!({ "port": ports[0] })
        };
        (StatusCode::CREATED, axum::Json(body)).into_response()
    }

    async fn remove(State(seen): State<Shared>, Path(id): Path<String>) -> StatusCode {
        seen.lock().expect("lock").deleted.push(id);
        StatusCode::NO_CONTENT
    }

    async fn serve() -> (NeutronClient, Shared) {
        serve_with(|o| o).await
    }

    /// [`serve`], with the client's options as `options` makes them.
    async fn serve_with(options: impl FnOnce(ClientOptions) -> ClientOptions) -> (NeutronClient, Shared) {
        let seen = Shared::default();
        let app = Router::new()
            .route("/v2.0/ports", post(create))
            .route("/v2.0/ports/{id}", delete(remove))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client =
            NeutronClient::new(&options(ClientOptions::noauth(format!("http://{addr}")))).expect("client");
        (client, seen)
    }

    fn port(name: &str) -> PortCreate {
        PortCreate {
            network_id: "net".into(),
            name: Some(name.into()),
            ..PortCreate::default()
        }
    }

    fn requests(seen: &Shared) -> Vec<usize> {
        seen.lock().expect("lock").requests.clone()
    }

    /// `pod-0` .. `pod-{n-1}`, with `odd` named otherwise (the server's cue for a failure).
    fn names(n: usize, odd: Option<(usize, &str)>) -> Vec<String> {
        (0..n)
            .map(|i| match odd {
                Some((at, name)) if at == i => name.to_string(),
                _ => format!("pod-{i}"),
            })
            .collect()
    }

    /// One create per name, all asked at once.
    async fn create_all(client: &NeutronClient, names: &[String]) -> Vec<Result<Port>> {
        futures::future::join_all(names.iter().map(|n| {
            let client = client.clone();
            async move { client.create_port(&port(n)).await }
        }))
        .await
    }

    #[tokio::test]
    async fn a_lone_create_goes_at_once_and_alone() {
        let (client, seen) = serve().await;
        for i in 0..3 {
            let p = client
                .create_port(&port(&format!("p{i}")))
                .await
                .expect("created");
            assert_eq!(p.name, format!("p{i}"));
        }
        assert_eq!(
            requests(&seen),
            vec![1, 1, 1],
            "one after another: one port per request"
        );
    }

    #[tokio::test]
    async fn creates_asked_together_share_requests_and_each_gets_its_own_port() {
        let (client, seen) = serve().await;
        let names = names(60, None);
        let answers = create_all(&client, &names).await;
        for (name, answer) in names.iter().zip(&answers) {
            assert_eq!(
                &answer.as_ref().expect("created").name,
                name,
                "each caller gets the port it asked for"
            );
        }
        let reqs = requests(&seen);
        assert_eq!(
            reqs.iter().sum::<usize>(),
            60,
            "every port asked exactly once: {reqs:?}"
        );
        assert!(
            reqs.len() <= MAX_SENDERS + 60 / MAX_BATCH + 1,
            "60 creates in {} requests: {reqs:?}",
            reqs.len()
        );
        assert!(
            reqs.iter().all(|&n| n <= MAX_BATCH),
            "no request over {MAX_BATCH} ports: {reqs:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_bulk_is_asked_again_port_by_port() {
        // Refused for what one port asks (400), or an ML2 driver failing on one port (500).
        for (bad, status) in [("bad-7", 400), ("broken-7", 500)] {
            let (client, seen) = serve().await;
            let names = names(12, Some((7, bad)));
            let answers = create_all(&client, &names).await;
            for (name, answer) in names.iter().zip(&answers) {
                match answer {
                    Ok(p) => assert_eq!(&p.name, name),
                    Err(e) => {
                        assert_eq!(name, bad, "only the refused port fails: {e}");
                        assert_eq!(e.status(), Some(status), "{e}");
                        assert_eq!(
                            e.api().map(|a| a.operation),
                            Some("create_port"),
                            "its own request's error"
                        );
                    }
                }
            }
            assert!(answers[7].is_err(), "the refused port's caller is told");
            let s = seen.lock().expect("lock");
            assert!(
                s.requests.iter().any(|&n| n > 1),
                "a bulk was tried: {:?}",
                s.requests
            );
            assert_eq!(
                s.made, 11,
                "the eleven good ports made once each: {:?}",
                s.requests
            );
            assert!(s.deleted.is_empty());
        }
    }

    #[tokio::test]
    async fn a_bulk_the_server_failed_fails_for_each_port_without_asking_again() {
        let (client, seen) = serve().await;
        let answers = create_all(&client, &names(12, Some((3, "busy-3")))).await;
        for answer in &answers {
            let e = answer.as_ref().expect_err("the whole request failed");
            assert!(e.is_transient(), "{e}");
            assert_eq!(
                (e.status(), e.kind()),
                (Some(503), Some(&ErrorKind::ServiceUnavailable)),
                "{e}"
            );
            assert_eq!(
                e.api().map(|a| a.operation),
                Some(COALESCED_OP),
                "named apart from a pool's bulk create: {e}"
            );
        }
        let s = seen.lock().expect("lock");
        assert_eq!(s.requests, vec![12], "one request, not asked again port by port");
        assert_eq!(s.made, 0);
    }

    #[tokio::test]
    async fn a_create_whose_caller_left_before_it_was_sent_is_not_sent() {
        let (client, seen) = serve().await;
        // Every request place taken by a slow create (each alone: the next one is asked once the
        // server has the last), then one more create waits in the queue and its caller leaves.
        let mut busy = Vec::new();
        for i in 0..MAX_SENDERS {
            let c = client.clone();
            busy.push(tokio::spawn(async move {
                c.create_port(&port(&format!("slow-{i}"))).await
            }));
            while requests(&seen).len() <= i {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let left = {
            let c = client.clone();
            tokio::spawn(async move { c.create_port(&port("left")).await })
        };
        while client.creates.lock().waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        left.abort();
        assert!(
            left.await.is_err_and(|e| e.is_cancelled()),
            "its caller left while it waited"
        );
        for b in busy {
            b.await.expect("task").expect("created");
        }
        // A create asked now goes through the emptied queue.
        client.create_port(&port("after")).await.expect("created");
        let s = seen.lock().expect("lock");
        assert_eq!(
            s.requests,
            vec![1; MAX_SENDERS + 1],
            "the left create was never sent"
        );
        assert_eq!(s.made, MAX_SENDERS + 1);
        assert!(s.deleted.is_empty());
    }

    #[tokio::test]
    async fn a_port_whose_caller_stopped_waiting_is_deleted() {
        let (client, seen) = serve().await;
        // The caller gives up once the server has the request (it answers 500 ms later).
        let gave_up = {
            let client = client.clone();
            tokio::spawn(async move { client.create_port(&port("slow-gave-up")).await })
        };
        while requests(&seen).is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gave_up.abort();
        assert!(
            gave_up.await.is_err_and(|e| e.is_cancelled()),
            "the caller gave up first"
        );
        let kept = client.create_port(&port("kept")).await.expect("created");
        for _ in 0..200 {
            if !seen.lock().expect("lock").deleted.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = seen.lock().expect("lock");
        assert_eq!(s.made, 2);
        assert_eq!(
            s.deleted.len(),
            1,
            "the unclaimed port, and only it: {:?}",
            s.deleted
        );
        assert_ne!(s.deleted[0], kept.id, "not the port that was taken");
    }

    /// `n` ports named `prefix-i`, for one bulk create.
    fn bulk(prefix: &str, n: usize) -> Vec<PortCreate> {
        (0..n).map(|i| port(&format!("{prefix}-{i}"))).collect()
    }

    #[tokio::test]
    async fn bulk_creates_take_a_place_among_the_requests_out() {
        let (client, seen) = serve().await;
        let answers = tokio::time::timeout(
            Duration::from_secs(10),
            futures::future::join_all((0..8).map(|i| {
                let client = client.clone();
                async move { client.create_ports(&bulk(&format!("slow{i}"), 2)).await }
            })),
        )
        .await
        .expect("every bulk got a place");
        for a in &answers {
            assert_eq!(a.as_ref().expect("created").len(), 2);
        }
        let s = seen.lock().expect("lock");
        assert_eq!(s.requests.len(), 8);
        assert!(
            (2..=MAX_SENDERS).contains(&s.most_out),
            "{} requests out at once",
            s.most_out
        );
    }

    #[tokio::test]
    async fn the_pace_reads_the_servers_time_not_the_clients_own_waits() {
        // One request at a time on the client's side: the second of two bulks asked together
        // waits ~500 ms for the first before it is sent. The server answers each in ~500 ms.
        let (client, _seen) = serve_with(|o| ClientOptions {
            max_concurrent_requests: 1,
            ..o
        })
        .await;
        client
            .create_ports(&bulk("slow-first", 1))
            .await
            .expect("created");
        let started = std::time::Instant::now();
        let (first, second) = (bulk("slow-a", 1), bulk("slow-b", 1));
        let (a, b) = tokio::join!(client.create_ports(&first), client.create_ports(&second));
        a.expect("created");
        b.expect("created");
        assert!(
            started.elapsed() >= Duration::from_millis(1000),
            "the cap held one back"
        );
        // Timed from the caller's side, the one held back took twice what its size predicts
        // and would have cut a request.
        assert_eq!(client.creates.lock().pace.senders(), MAX_SENDERS);
    }

    #[tokio::test]
    async fn creates_asked_while_bulks_hold_every_place_are_sent_when_one_is_answered() {
        let (client, seen) = serve().await;
        let bulks: Vec<_> = (0..MAX_SENDERS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.create_ports(&bulk(&format!("slow{i}"), 2)).await })
            })
            .collect();
        // Every place taken by a bulk before the creates are asked.
        while requests(&seen).len() < MAX_SENDERS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let answers = tokio::time::timeout(Duration::from_secs(5), create_all(&client, &names(6, None)))
            .await
            .expect("the creates were sent once a bulk was answered");
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        for b in bulks {
            assert_eq!(b.await.expect("joined").expect("created").len(), 2);
        }
    }

    #[tokio::test]
    async fn a_bulk_create_gets_a_place_while_creates_keep_coming() {
        let (client, _seen) = serve().await;
        // Slow creates asked faster than they are answered (400/s against 4 requests of 20 per
        // 500 ms): the queue never empties, so the senders never run out of work.
        let feeder = {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0.. {
                    let client = client.clone();
                    tokio::spawn(async move { client.create_port(&port(&format!("slow-{i}"))).await });
                    tokio::time::sleep(Duration::from_micros(2500)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got =
            tokio::time::timeout(Duration::from_secs(3), client.create_ports(&bulk("slow-pool", 3))).await;
        feeder.abort();
        assert_eq!(
            got.expect("the bulk got a place while creates kept coming")
                .expect("created")
                .len(),
            3
        );
    }

    #[tokio::test]
    async fn creates_get_a_place_while_bulks_keep_coming() {
        let (client, _seen) = serve().await;
        // More pools refilling back to back than there are places: a bulk always waits.
        let feeders: Vec<_> = (0..2 * MAX_SENDERS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    loop {
                        let _ = client.create_ports(&bulk(&format!("slow-pool{i}"), 2)).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let got = tokio::time::timeout(Duration::from_secs(3), create_all(&client, &names(3, None))).await;
        for f in feeders {
            f.abort();
        }
        let answers = got.expect("the creates got a place while bulks kept coming");
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    }
}
