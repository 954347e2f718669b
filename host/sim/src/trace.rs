//! The trace of one seed: every step and every network decision, stamped with
//! virtual time. Its hash is what the determinism check compares; its tail is
//! what a failing seed prints.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use sluice_store::{Clock, ManualClock};

/// How many of the latest lines a failure report shows (all are hashed).
const KEPT_LINES: usize = 400;

#[derive(Debug)]
struct Inner {
    start_ms: i64,
    clock: ManualClock,
    hasher: Sha256,
    lines: u64,
    tail: VecDeque<String>,
    echo: bool,
}

/// A cloneable handle on one seed's trace.
#[derive(Debug, Clone)]
pub struct Trace(Arc<Mutex<Inner>>);

impl Trace {
    /// `echo`: also print every line as it happens (replaying one seed).
    pub fn new(clock: ManualClock, echo: bool) -> Self {
        Trace(Arc::new(Mutex::new(Inner {
            start_ms: clock.now_ms(),
            clock,
            hasher: Sha256::new(),
            lines: 0,
            tail: VecDeque::with_capacity(KEPT_LINES),
            echo,
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A trace is append-only; a poisoned lock still holds whole lines.
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut inner)
    }

    pub fn line(&self, text: impl AsRef<str>) {
        self.with(|inner| {
            let line = format!(
                "{:>12} {}",
                inner.clock.now_ms() - inner.start_ms,
                text.as_ref()
            );
            inner.hasher.update(line.as_bytes());
            inner.hasher.update(b"\n");
            inner.lines += 1;
            // For diagnosis beside other logs (`SLUICE_SIM_LOG=sluice_sim=debug,
            // sqlx::query=debug` shows each step's statements under its line).
            tracing::debug!(target: "sluice_sim::trace", "{line}");
            if inner.echo {
                println!("{line}");
            }
            if inner.tail.len() == KEPT_LINES {
                inner.tail.pop_front();
            }
            inner.tail.push_back(line);
        });
    }

    /// The hash of every line so far, hex.
    pub fn hash(&self) -> String {
        self.with(|inner| hex::encode(&inner.hasher.clone().finalize()[..16]))
    }

    pub fn len(&self) -> u64 {
        self.with(|inner| inner.lines)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn tail(&self) -> Vec<String> {
        self.with(|inner| inner.tail.iter().cloned().collect())
    }
}
