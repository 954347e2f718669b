//! The CPU time of the calling thread, which is what a guest call costs: a guest
//! waiting for a core under contention is not charged for the wait.

use std::time::{Duration, Instant};

/// Measures one call on its thread: thread CPU time where the OS offers it, else
/// elapsed time (an upper bound of it).
pub(crate) struct CallTimer {
    started: Instant,
    cpu_started: Option<Duration>,
}

impl CallTimer {
    pub fn start() -> Self {
        CallTimer {
            started: Instant::now(),
            cpu_started: thread_cpu_time(),
        }
    }

    pub fn used(&self) -> Duration {
        match (self.cpu_started, thread_cpu_time()) {
            (Some(start), Some(end)) => end.saturating_sub(start),
            _ => self.started.elapsed(),
        }
    }
}

#[cfg(unix)]
fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes one timespec through the pointer, which points
    // at a live, properly aligned local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

#[cfg(not(unix))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_is_charged_at_most_its_elapsed_time() {
        let timer = CallTimer::start();
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let used = timer.used();
        assert!(used <= timer.started.elapsed(), "{used:?}");
        assert!(thread_cpu_time().is_some());
    }
}
