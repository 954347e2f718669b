//! How long a merchant's request waited for PSPs: the part of its latency
//! that is the PSP's, not the gateway's. The merchant API opens a
//! [`PspWait`] per request and reports it in the `Server-Timing` response
//! header (`psp;dur=…`), so a merchant, and the benchmark of issue 17, can
//! tell the gateway's own share of a payment's latency from the PSP's.
//!
//! The time is the transport's: from handing the request to the PSP
//! transport until its answer or failure, summed over every call the request
//! made (a failover makes several). A request task that spawns work it waits
//! for carries its [`PspWait`] into that task ([`PspWait::current`] and
//! [`PspWait::scope`]); work nobody opened a `PspWait` for (the scanner, the
//! inbox processor) records nothing.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

tokio::task_local! {
    static WAIT: PspWait;
}

/// The PSP time of one request, shared by the tasks that work for it.
#[derive(Debug, Clone, Default)]
pub struct PspWait(Arc<AtomicU64>);

impl PspWait {
    pub fn new() -> Self {
        Self::default()
    }

    /// The PSP time of the request running on this task, if one was opened.
    pub fn current() -> Option<PspWait> {
        WAIT.try_with(Clone::clone).ok()
    }

    /// Run `work` with this request's PSP time in scope.
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        WAIT.scope(self, work).await
    }

    /// The time spent waiting for PSPs so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    fn add(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        // Saturating: a request cannot wait 584 years, but the sum must not wrap.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
                Some(was.saturating_add(nanos))
            });
    }
}

/// Count `waited` towards the request running on this task, if any.
pub(crate) fn record(waited: Duration) {
    let _ = WAIT.try_with(|wait| wait.add(waited));
}

/// Run `work` in the scope of the current request's PSP time, if there is one:
/// for a task spawned on the request's behalf.
pub fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let wait = PspWait::current();
    async move {
        match wait {
            Some(wait) => wait.scope(work).await,
            None => work.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_recorded_inside_a_scope_add_up_and_outside_of_one_are_dropped() {
        record(Duration::from_millis(5));
        let wait = PspWait::new();
        wait.clone()
            .scope(async {
                record(Duration::from_millis(2));
                record(Duration::from_micros(1500));
            })
            .await;
        assert_eq!(wait.total(), Duration::from_micros(3500));
    }

    #[tokio::test]
    async fn a_task_spawned_with_carried_counts_towards_the_request_that_spawned_it() {
        let wait = PspWait::new();
        wait.clone()
            .scope(async {
                let task = tokio::spawn(carried(async { record(Duration::from_millis(7)) }));
                task.await.expect("the spawned task does not panic");
                // Spawned without carrying: not this request's.
                let stray = tokio::spawn(async { record(Duration::from_millis(100)) });
                stray.await.expect("the spawned task does not panic");
            })
            .await;
        assert_eq!(wait.total(), Duration::from_millis(7));
    }

    #[tokio::test]
    async fn a_sum_that_would_overflow_saturates() {
        let wait = PspWait::new();
        wait.add(Duration::from_nanos(u64::MAX - 1));
        wait.add(Duration::from_secs(1));
        assert_eq!(wait.total(), Duration::from_nanos(u64::MAX));
    }
}
