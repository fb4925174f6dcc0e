//! When a watch tries again after a failure.
//!
//! kube-runtime's default (client-go's reflector backoff: 0.8 s doubling to
//! 30 s) keeps growing while the API server is down, so an agent could sit
//! out many seconds after the server is back. Failures are told apart here:
//! - the API server did not answer (connection refused or reset, timeout,
//!   TLS): try again soon, 0.1 s doubling to 1 s. A connection nobody
//!   accepts costs the server nothing, and the agent is back within about a
//!   second of the server;
//! - the API server answered with an error (429, 5xx, 403, ...): client-go's
//!   backoff, 0.8 s doubling to 30 s, to be kind to a struggling server;
//! - the watch position expired (410 Gone): list again at once (the watcher
//!   already tried to resume the watch before, and only a relist helps now).
//!
//! Every delay carries jitter (a random part of up to half of it, taken
//! off, so the nodes of a cluster do not all come back in the same
//! instant), and any success starts the schedule afresh.
use std::time::Duration;

use kube::runtime::watcher;

/// Why a watch failed, as far as when to try again is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer from the API server.
    Unreachable,
    /// The API server answered with an error status.
    Answered,
    /// The watch position is too old (410 Gone): a full relist follows.
    Expired,
}

const GONE: u16 = 410;

impl Failure {
    #[must_use]
    pub(crate) fn of(err: &watcher::Error) -> Self {
        match err {
            watcher::Error::WatchError(status) => Self::of_status(status.code),
            watcher::Error::InitialListFailed(err)
            | watcher::Error::WatchStartFailed(err)
            | watcher::Error::WatchFailed(err) => match err {
                kube::Error::Api(status) => Self::of_status(status.code),
                // A body the server sent that does not decode is an answer.
                kube::Error::SerdeError(_) => Self::Answered,
                _ => Self::Unreachable,
            },
            watcher::Error::NoResourceVersion => Self::Answered,
        }
    }

    fn of_status(code: u16) -> Self {
        if code == GONE { Self::Expired } else { Self::Answered }
    }
}

/// The delays of one watch.
#[derive(Debug, Default)]
pub struct RetrySchedule {
    /// Failures in a row (of the current kind of failure).
    attempts: u32,
    last: Option<Failure>,
}

/// Backoff steps: first delay and cap.
const UNREACHABLE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));
const ANSWERED: (Duration, Duration) = (Duration::from_millis(800), Duration::from_secs(30));

impl RetrySchedule {
    /// The delay before trying again after `failure`; `random` is drawn
    /// uniformly from [0, 1) and sets the jitter.
    pub fn next_delay(&mut self, failure: Failure, random: f64) -> Duration {
        if self.last != Some(failure) {
            self.attempts = 0;
        }
        self.last = Some(failure);
        let (first, cap) = match failure {
            Failure::Expired => return Duration::ZERO,
            Failure::Unreachable => UNREACHABLE,
            Failure::Answered => ANSWERED,
        };
        let full = first.saturating_mul(1 << self.attempts.min(16)).min(cap);
        self.attempts = self.attempts.saturating_add(1);
        full.mul_f64(1.0 - 0.5 * random.clamp(0.0, 1.0))
    }

    /// A success: the next failure starts from the first delay.
    pub(crate) fn reset(&mut self) {
        self.attempts = 0;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delays(failure: Failure, n: usize, random: f64) -> Vec<Duration> {
        let mut s = RetrySchedule::default();
        (0..n).map(|_| s.next_delay(failure, random)).collect()
    }

    #[test]
    fn an_unreachable_server_is_tried_again_at_least_every_second() {
        let ms = |v: Vec<Duration>| v.iter().map(Duration::as_millis).collect::<Vec<_>>();
        assert_eq!(ms(delays(Failure::Unreachable, 8, 0.0)), [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        // With the most jitter, half of that.
        assert_eq!(ms(delays(Failure::Unreachable, 5, 0.999_999)), [50, 100, 200, 400, 500]);
    }

    /// client-go's reflector backoff (k8s.io/client-go/tools/cache,
    /// NewReflectorWithOptions: 800 ms initial, 30 s max, factor 2).
    #[test]
    fn a_server_answering_errors_gets_client_gos_backoff() {
        let s: Vec<u64> = delays(Failure::Answered, 8, 0.0).iter().map(Duration::as_secs).collect();
        assert_eq!(s, [0, 1, 3, 6, 12, 25, 30, 30]);
    }

    #[test]
    fn an_expired_position_relists_at_once() {
        assert_eq!(delays(Failure::Expired, 3, 0.5), [Duration::ZERO; 3]);
    }

    #[test]
    fn success_and_a_new_kind_of_failure_start_afresh() {
        let mut s = RetrySchedule::default();
        for _ in 0..10 {
            s.next_delay(Failure::Answered, 0.0);
        }
        assert_eq!(s.next_delay(Failure::Answered, 0.0), Duration::from_secs(30));
        // The server went away altogether: its answers no longer slow us.
        assert_eq!(s.next_delay(Failure::Unreachable, 0.0), Duration::from_millis(100));
        s.next_delay(Failure::Unreachable, 0.0);
        s.reset();
        assert_eq!(s.next_delay(Failure::Unreachable, 0.0), Duration::from_millis(100));
    }

    #[test]
    fn failures_are_classified() {
        let status = |code: u16| kube::core::Status { code, ..kube::core::Status::default() };
        assert_eq!(Failure::of(&watcher::Error::WatchError(Box::new(status(410)))), Failure::Expired);
        assert_eq!(Failure::of(&watcher::Error::WatchError(Box::new(status(500)))), Failure::Answered);
        let api = |code| kube::Error::Api(Box::new(status(code)));
        assert_eq!(Failure::of(&watcher::Error::InitialListFailed(api(410))), Failure::Expired);
        assert_eq!(Failure::of(&watcher::Error::WatchStartFailed(api(429))), Failure::Answered);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let transport = kube::Error::Service(Box::new(refused));
        assert_eq!(Failure::of(&watcher::Error::WatchFailed(transport)), Failure::Unreachable);
        assert_eq!(Failure::of(&watcher::Error::NoResourceVersion), Failure::Answered);
    }
}
