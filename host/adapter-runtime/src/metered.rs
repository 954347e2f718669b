//! A guest call's CPU time, charged to its bulkhead key however the call ends.

use crate::bulkhead::cpu::CallTimer;
use crate::bulkhead::pool::Usage;
use crate::bulkhead::SlotGuard;
use crate::error::AdapterError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Runs a call in a held slot and measures the thread CPU time of each poll: the guest
/// runs on a fiber inside `poll`, on whichever worker polls it, and yields between
/// epoch ticks, so the sum over polls is what it used. Dropped before it finished (the
/// caller gave up), it still charges what was used so far.
pub(crate) struct Metered<F> {
    /// `None` once dropped: the store goes before the slot is given back.
    inner: Option<Pin<Box<F>>>,
    slot: Option<SlotGuard>,
    cpu: Duration,
}

impl<F> Metered<F> {
    pub(crate) fn new(slot: SlotGuard, call: F) -> Self {
        Metered {
            inner: Some(Box::pin(call)),
            slot: Some(slot),
            cpu: Duration::ZERO,
        }
    }

    fn finish(&mut self, deadline_hit: bool) {
        if let Some(slot) = self.slot.take() {
            slot.finish(Usage {
                cpu: self.cpu,
                deadline_hit,
            });
        }
    }
}

impl<F, R> Future for Metered<F>
where
    F: Future<Output = Result<R, AdapterError>>,
{
    type Output = Result<R, AdapterError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err(AdapterError::Internal(
                "adapter call polled after it finished".into(),
            )));
        };
        let timer = CallTimer::start();
        let polled = inner.as_mut().poll(cx);
        self.cpu = self.cpu.saturating_add(timer.used());
        if let Poll::Ready(result) = &polled {
            let deadline_hit = matches!(result, Err(AdapterError::Timeout));
            self.inner = None;
            self.finish(deadline_hit);
        }
        polled
    }
}

impl<F> Drop for Metered<F> {
    fn drop(&mut self) {
        self.inner = None;
        self.finish(false);
    }
}
