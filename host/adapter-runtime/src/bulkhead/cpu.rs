//! The CPU time of the calling thread, which is what a guest call costs: a guest
//! waiting for a core under contention is not charged for the wait.
//!
//! Reading the thread's CPU clock is a system call (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`
//! has no vDSO fast path) and on a VM it was about 7 % of a 2 KB webhook call with two
//! reads per poll (BENCHMARKS.md, adapter runtime, 2026-12-05 session 5). A poll reads it
//! once, at its end; its start is bounded by the thread's previous reading instead, and
//! the charge is the smaller of two upper bounds of the CPU time the poll used:
//!
//! - the thread's CPU time since its previous reading (taken before the poll started, so
//!   it can only add CPU time the thread spent between two polls, never remove any);
//! - the poll's elapsed time, plus 1/1024 of it: a thread cannot run longer than the time
//!   that passes, and the margin covers the rate difference between the monotonic clock
//!   (slewed by NTP, by at most 500 ppm) and the scheduler's clock the CPU time is counted in.
//!
//! Against two reads, the charge is never lower, and higher by at most the smaller of the
//! CPU the thread spent since its previous reading and the time within the poll the
//! thread did not run (preempted, or blocked in a host import) plus the margin: where the
//! thread ran the whole poll, the two agree to within the margin. A poll on a thread with
//! no reading yet reads the clock at its start too, and is charged exactly what it used.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// This thread's CPU time at its latest reading by a [`CallTimer`]; `None` before the
    /// first, or where the OS has no thread CPU clock.
    static LAST_READING: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Measures one poll of a call on its thread: an upper bound of the thread CPU time it
/// used (see the module's documentation), or its elapsed time where the OS offers no
/// thread CPU clock.
pub(crate) struct CallTimer {
    started: Instant,
    /// A reading of this thread's CPU clock taken no later than `started`.
    cpu_before: Option<Duration>,
}

impl CallTimer {
    pub fn start() -> Self {
        // Read before `started`, so either way the reading is not later than the start.
        let cpu_before = LAST_READING.get().or_else(read_thread_cpu_time);
        CallTimer {
            started: Instant::now(),
            cpu_before,
        }
    }

    pub fn used(&self) -> Duration {
        // The CPU clock first: the elapsed time then covers the whole span it measured.
        let cpu_now = read_thread_cpu_time();
        let elapsed = self.started.elapsed();
        match (self.cpu_before, cpu_now) {
            (Some(before), Some(now)) => now
                .saturating_sub(before)
                .min(elapsed.saturating_add(elapsed / 1024)),
            _ => elapsed,
        }
    }
}

/// The thread's CPU time now, remembered as its latest reading.
fn read_thread_cpu_time() -> Option<Duration> {
    let now = thread_cpu_time();
    LAST_READING.set(now);
    now
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
    fn a_busy_thread_is_charged_at_most_its_elapsed_time_plus_the_clock_margin() {
        let timer = CallTimer::start();
        spin(200_000);
        let used = timer.used();
        // Read after `used`, so at least the elapsed time `used` bounded the charge by;
        // the bound allows 1/1024 more for the two clocks' rates (see the module).
        let elapsed = timer.started.elapsed();
        assert!(
            used <= elapsed + elapsed / 1024,
            "charged {used:?} in {elapsed:?}"
        );
        assert!(thread_cpu_time().is_some());
    }

    fn spin(iterations: u64) {
        let mut x = 0u64;
        for i in 0..iterations {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }

    /// The charge is an upper bound of the CPU the poll used, whichever bound decides:
    /// on a fresh thread (the clock is read at the start), and after the thread worked
    /// between two polls (its previous reading is then far behind the start).
    #[test]
    fn a_poll_is_charged_at_least_the_cpu_time_it_used() {
        std::thread::spawn(|| {
            for work_between in [0, 2_000_000] {
                spin(work_between);
                let timer = CallTimer::start();
                let cpu_at_start = thread_cpu_time().expect("thread CPU clock");
                spin(200_000);
                let cpu_at_end = thread_cpu_time().expect("thread CPU clock");
                let used = timer.used();
                assert!(
                    used >= cpu_at_end - cpu_at_start,
                    "charged {used:?}, used {:?}",
                    cpu_at_end - cpu_at_start
                );
            }
        })
        .join()
        .expect("timing thread");
    }

    /// A poll that did not run (here: asleep) is not charged the time that passed, only
    /// CPU time its thread used since the previous reading.
    #[test]
    fn a_poll_that_did_not_run_is_charged_cpu_time_not_elapsed_time() {
        std::thread::spawn(|| {
            let earlier = CallTimer::start();
            let _ = earlier.used();
            let timer = CallTimer::start();
            std::thread::sleep(Duration::from_millis(50));
            let used = timer.used();
            assert!(used < Duration::from_millis(10), "charged {used:?}");
        })
        .join()
        .expect("timing thread");
    }
}
