//! The background workers (inbox processor, outbox publisher, recovery scanner, key
//! pruning) run until shutdown; one that panics or fails is started again.
//!
//! Without this a worker's panic ended only that task: the gateway went on answering
//! merchants while, for instance, no event was delivered any more until the next restart
//! of the process. Starting a worker again is safe because all of them work from durable
//! rows under leases: what the dead one had claimed is taken over when its lease runs out,
//! exactly as after a crash of the whole process.

use std::future::Future;
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// How long a worker that ended early waits before it is started again: long enough
/// not to spin on a fault that repeats at once, short next to the leases it relies on.
pub const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// `sluice_worker_restarts_total{worker}`: background workers started again after a
/// panic or an early end.
#[derive(Clone, Debug)]
pub struct WorkerRestarts(IntCounterVec);

impl WorkerRestarts {
    pub fn register(registry: &Registry) -> Result<WorkerRestarts, prometheus::Error> {
        let counter = IntCounterVec::new(
            Opts::new(
                "sluice_worker_restarts_total",
                "Background workers started again after a panic or an early end.",
            ),
            &["worker"],
        )?;
        registry.register(Box::new(counter.clone()))?;
        Ok(WorkerRestarts(counter))
    }

    /// How often `worker` was started again.
    pub fn count(&self, worker: &str) -> u64 {
        self.0.with_label_values(&[worker]).get()
    }
}

/// Why a run of a worker ended.
pub type WorkerResult = Result<(), String>;

/// Runs `worker` (made afresh by `start` for every run) until `shutdown` turns true.
/// A run that panics, fails, or returns before shutdown is logged, counted and started
/// again after [`RESTART_PAUSE`]. Dropping the returned future stops the current run.
pub async fn supervise<S, F>(
    name: &'static str,
    mut start: S,
    mut shutdown: watch::Receiver<bool>,
    restarts: WorkerRestarts,
) where
    S: FnMut() -> F,
    F: Future<Output = WorkerResult> + Send + 'static,
{
    loop {
        // A set of one: dropping it (when this future is dropped) aborts the run.
        let mut run = JoinSet::new();
        run.spawn(start());
        let ended = match run.join_next().await {
            Some(Ok(Ok(()))) if *shutdown.borrow() => return,
            Some(Ok(Ok(()))) => "it returned before shutdown".to_owned(),
            Some(Ok(Err(error))) => error,
            Some(Err(join)) => join.to_string(),
            None => "it was never started".to_owned(),
        };
        restarts.0.with_label_values(&[name]).inc();
        tracing::error!(worker = name, reason = %ended, "background worker ended; starting it again");
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(RESTART_PAUSE) => {}
        }
    }
}

/// [`supervise`] for a worker that is `run(value, shutdown)`: each run gets a clone of
/// `value` and of the shutdown receiver.
pub fn supervise_run<T, R, F>(
    name: &'static str,
    value: T,
    shutdown: watch::Receiver<bool>,
    restarts: WorkerRestarts,
    run: R,
) -> impl Future<Output = ()> + Send + 'static
where
    T: Clone + Send + 'static,
    R: Fn(T, watch::Receiver<bool>) -> F + Send + 'static,
    F: Future<Output = WorkerResult> + Send + 'static,
{
    let stop = shutdown.clone();
    supervise(
        name,
        move || run(value.clone(), stop.clone()),
        shutdown,
        restarts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn restarts() -> WorkerRestarts {
        WorkerRestarts::register(&Registry::new()).expect("register")
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_panics_is_started_again_and_counted_until_shutdown() {
        let (stop, stopped) = watch::channel(false);
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = restarts();
        let (seen, watch_stop) = (Arc::clone(&runs), stopped.clone());
        let supervisor = tokio::spawn(supervise(
            "publisher",
            move || {
                let run = seen.fetch_add(1, Ordering::SeqCst);
                let mut stopped = watch_stop.clone();
                async move {
                    if run < 2 {
                        panic!("run {run} panics");
                    }
                    let _ = stopped.wait_for(|stop| *stop).await;
                    Ok(())
                }
            },
            stopped,
            counter.clone(),
        ));
        tokio::time::sleep(RESTART_PAUSE * 3).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a run that lasts"
        );
        assert_eq!(counter.count("publisher"), 2);
        stop.send(true).expect("supervisor listens");
        supervisor.await.expect("supervisor ends");
        assert_eq!(counter.count("publisher"), 2, "shutdown is not a restart");
    }

    /// Set when dropped: shows a run was stopped.
    struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_fails_or_returns_early_is_started_again_and_stops_with_its_supervisor() {
        let (_stop, stopped) = watch::channel(false);
        let runs = Arc::new(AtomicUsize::new(0));
        let third_dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counter = restarts();
        let (seen, flag) = (Arc::clone(&runs), Arc::clone(&third_dropped));
        let supervisor = tokio::spawn(supervise(
            "scanner",
            move || {
                let run = seen.fetch_add(1, Ordering::SeqCst);
                let held = (run >= 2).then(|| DropFlag(Arc::clone(&flag)));
                async move {
                    match run {
                        0 => Err("the database went away".to_owned()),
                        1 => Ok(()),
                        _ => {
                            let _held = held;
                            std::future::pending().await
                        }
                    }
                }
            },
            stopped,
            counter.clone(),
        ));
        tokio::time::sleep(RESTART_PAUSE * 3).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(counter.count("scanner"), 2);
        assert!(
            !third_dropped.load(Ordering::SeqCst),
            "the third run is running"
        );
        supervisor.abort();
        let _ = supervisor.await;
        tokio::task::yield_now().await;
        assert!(
            third_dropped.load(Ordering::SeqCst),
            "the run is stopped with its supervisor, not left behind"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_ends_at_shutdown_is_not_started_again() {
        let (stop, stopped) = watch::channel(false);
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = restarts();
        let (seen, watch_stop) = (Arc::clone(&runs), stopped.clone());
        let supervisor = tokio::spawn(supervise(
            "inbox",
            move || {
                seen.fetch_add(1, Ordering::SeqCst);
                let mut stopped = watch_stop.clone();
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                    Ok(())
                }
            },
            stopped,
            counter.clone(),
        ));
        tokio::task::yield_now().await;
        stop.send(true).expect("supervisor listens");
        supervisor.await.expect("supervisor ends");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(counter.count("inbox"), 0);
    }
}
