//! How many port create requests a client keeps out (coalesced creates and bulk creates alike),
//! and how many ports a coalesced request carries.
//!
//! A neutron-server's API workers take requests first come, first served (uWSGI processes of one
//! thread each), so whatever a client keeps queued there, each of its other requests waits behind:
//! an ACTIVE poll's list call sent after two bulks of 20 bound ports each waits ~4 s for a worker.
//! The pace keeps that queue short without leaving the workers idle (an answer's time is the
//! answered attempt's round trip: the server's, its queue included, not the client's own waits):
//! - a request carries about [`TARGET`] of the server's time: its ports are capped at `TARGET`
//!   over the least time per port the recent answers took (the server's own cost, the answer that
//!   queued least);
//! - requests out: one more while answers take what their size predicts (none queued: the
//!   recent answers of a like size tell), one fewer when an answer takes more than [`QUEUED`]
//!   times that (it waited behind others), between 1
//!   and [`MAX_SENDERS`]; only requests sent since the last cut can cut again (the ones already
//!   out queued behind the old number, and would cut it to 1). An answer within [`QUICK`] tells of no queue worth keeping short: the
//!   pace is then what it was before it existed, [`MAX_SENDERS`] requests of [`MAX_BATCH`] ports.
//!
//! On the measured server profile (2 workers, ~180 ms per bound port in a bulk) this settles at 2-3
//! requests of ~11 ports, and a 200-pod burst's median pod is wired 25-35% sooner at the server's
//! bound (docs/benchmarks.md); against an instant Neutron nothing changes.

use std::collections::VecDeque;
use std::time::Duration;

/// The most create requests out at once per client.
pub(crate) const MAX_SENDERS: usize = 4;

/// The most ports in one request: a real neutron-server takes ~180 ms per bound port in a bulk,
/// so 20 are answered in about 4 s, well within the client's timeout.
pub(crate) const MAX_BATCH: usize = 20;

/// About how long one request should keep a server worker.
pub(crate) const TARGET: Duration = Duration::from_secs(2);

/// An answer this quick says nothing about a queue worth keeping short.
pub(crate) const QUICK: Duration = Duration::from_millis(100);

/// An answer taking more than this many times what its size predicts waited behind others.
pub(crate) const QUEUED: f64 = 1.5;

/// Answers whose time per port is remembered (the least of them is the server's cost).
const REMEMBERED: usize = 32;

/// When a request was sent, as the pace counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent(u64);

#[derive(Debug)]
pub(crate) struct Pace {
    senders: usize,
    /// Bumped at each cut of `senders`.
    cuts: u64,
    /// The last answers: ports, and seconds per port.
    per_port: VecDeque<(usize, f64)>,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            senders: MAX_SENDERS,
            cuts: 0,
            per_port: VecDeque::with_capacity(REMEMBERED),
        }
    }
}

impl Pace {
    /// Create requests that may be out at once.
    pub(crate) fn senders(&self) -> usize {
        self.senders
    }

    /// The most ports the next coalesced request carries.
    pub(crate) fn batch(&self) -> usize {
        self.within_target().unwrap_or(MAX_BATCH).clamp(1, MAX_BATCH)
    }

    /// The ports a request may carry to take about [`TARGET`] of the server's time (at least
    /// one); `None` before the first answer.
    pub(crate) fn within_target(&self) -> Option<usize> {
        let p = self.least_per_port()?;
        // Saturates: a server answering in no measurable time takes any number.
        Some((TARGET.as_secs_f64() / p.max(f64::MIN_POSITIVE)).max(1.0) as usize)
    }

    fn least_per_port(&self) -> Option<f64> {
        self.per_port.iter().map(|(_, p)| *p).reduce(f64::min)
    }

    /// What a request of `ports` ports should take unqueued: the least time per port of the
    /// recent answers of a like size (half to twice as many ports: a request's fixed cost weighs
    /// more on a lone port than on a bulk), times `ports`; `None` without such answers.
    fn predicted(&self, ports: usize) -> Option<f64> {
        self.per_port
            .iter()
            .filter(|(n, _)| 2 * n >= ports && *n <= 2 * ports)
            .map(|(_, p)| *p)
            .reduce(f64::min)
            .map(|p| p * ports as f64)
    }

    /// What a request sent now is tagged with, for [`Pace::answered`].
    pub(crate) fn sent(&self) -> Sent {
        Sent(self.cuts)
    }

    /// A request of `ports` ports, sent at `sent`, was answered in `took`.
    pub(crate) fn answered(&mut self, sent: Sent, ports: usize, took: Duration) {
        let ports = ports.max(1);
        let took_s = took.as_secs_f64();
        // Judged against the answers before it: compared with itself it would never be queued.
        let predicted = self.predicted(ports);
        if self.per_port.len() == REMEMBERED {
            self.per_port.pop_front();
        }
        self.per_port.push_back((ports, took_s / ports as f64));
        if took <= QUICK {
            self.senders = MAX_SENDERS;
            return;
        }
        let Some(predicted) = predicted else {
            return;
        };
        if took_s > QUEUED * predicted {
            if sent.0 == self.cuts && self.senders > 1 {
                self.senders -= 1;
                self.cuts += 1;
            }
        } else {
            self.senders = (self.senders + 1).min(MAX_SENDERS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    impl Pace {
        /// A request sent now and answered in `took`.
        fn answer(&mut self, ports: usize, took: Duration) {
            let sent = self.sent();
            self.answered(sent, ports, took);
        }
    }

    #[test]
    fn quick_answers_keep_the_full_pace() {
        let mut p = Pace::default();
        for n in [1, 20, 7, 20, 3] {
            p.answer(n, ms(2));
        }
        assert_eq!((p.senders(), p.batch()), (MAX_SENDERS, MAX_BATCH));
        // Even after slow ones: a quick answer brings the full pace back.
        for _ in 0..5 {
            p.answer(20, ms(8000));
        }
        p.answer(20, ms(3));
        assert_eq!(p.senders(), MAX_SENDERS);
    }

    #[test]
    fn a_slow_server_gets_requests_of_about_the_target_and_fewer_of_them_when_they_queue() {
        let mut p = Pace::default();
        // Two workers, 180 ms per port: the first two bulks of 20 are served at once ...
        p.answer(20, ms(3630));
        p.answer(20, ms(3630));
        assert_eq!(p.batch(), 11, "2 s at 181.5 ms per port");
        assert_eq!(p.senders(), MAX_SENDERS);
        // ... the next two waited behind them: sent before any cut, they cut once.
        let before = p.sent();
        p.answered(before, 20, ms(7260));
        p.answered(before, 20, ms(7260));
        assert_eq!(p.senders(), 3);
        p.answer(11, ms(4000));
        assert_eq!(p.senders(), 2);
        // Requests of the new size, served at once: one more may go out.
        p.answer(11, ms(2010));
        assert_eq!(p.senders(), 3);
        // That one queued: back to two.
        p.answer(11, ms(3600));
        assert_eq!(p.senders(), 2);
        // Never fewer than one.
        for _ in 0..10 {
            p.answer(11, ms(9000));
        }
        assert_eq!(p.senders(), 1);
    }

    #[test]
    fn the_cost_per_port_follows_the_server_when_it_slows_down() {
        let mut p = Pace::default();
        p.answer(10, ms(1000));
        assert_eq!(p.batch(), 20);
        // The server now takes 500 ms per port, answers unqueued. While the old cost is
        // remembered they look queued; once it is forgotten requests shrink to ~2 s and, answered
        // as their size predicts, more go out again.
        for _ in 0..REMEMBERED {
            p.answer(4, ms(2000));
        }
        assert_eq!(p.batch(), 4);
        for _ in 0..MAX_SENDERS {
            p.answer(4, ms(2000));
        }
        assert_eq!(p.senders(), MAX_SENDERS);
    }

    #[test]
    fn bulks_beyond_the_coalesced_size_are_sized_by_time_alone() {
        let mut p = Pace::default();
        assert_eq!(p.within_target(), None);
        p.answer(50, ms(25));
        assert_eq!(p.within_target(), Some(4000), "0.5 ms per port");
        assert_eq!(p.batch(), MAX_BATCH);
        p.answer(50, ms(0));
        assert_eq!(p.within_target(), Some(usize::MAX));
    }

    #[test]
    fn an_answer_of_a_new_size_neither_cuts_nor_adds() {
        let mut p = Pace::default();
        p.answer(20, ms(3630));
        let before = p.sent();
        p.answered(before, 20, ms(7260));
        assert_eq!(p.senders(), MAX_SENDERS - 1);
        // 3 ports in 4 s: nothing of a like size to compare with, so no judgement either way.
        p.answer(3, ms(4000));
        assert_eq!(p.senders(), MAX_SENDERS - 1);
        // The next one of that size is judged against it.
        p.answer(3, ms(9000));
        assert_eq!(p.senders(), MAX_SENDERS - 2);
    }

    #[test]
    fn a_lone_create_is_not_judged_by_the_bulks_cost_per_port() {
        let mut p = Pace::default();
        p.answer(20, ms(3630));
        // 300 ms for one port is its fixed cost, not a queue: no bulk of a like size to compare.
        for _ in 0..5 {
            p.answer(1, ms(300));
        }
        assert_eq!(p.senders(), MAX_SENDERS);
        // Against lone creates of its own kind, one that queued is seen.
        p.answer(1, ms(900));
        assert_eq!(p.senders(), MAX_SENDERS - 1);
    }

    #[test]
    fn a_very_slow_port_still_goes_alone() {
        let mut p = Pace::default();
        p.answer(1, ms(5000));
        assert_eq!(p.batch(), 1);
    }
}
