//! The world's one seeded generator. Every choice of the simulation (the
//! workload, the network's faults, time jumps) draws from it in a fixed
//! order, so a seed replays exactly.

use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A cloneable handle on one generator.
#[derive(Debug, Clone)]
pub struct SimRng(Arc<Mutex<StdRng>>);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))))
    }

    fn with<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        // Any generator state is valid, so a poisoned lock is still usable.
        let mut rng = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rng)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.with(|rng| rng.random_range(0..n))
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        self.with(|rng| rng.random_range(lo..=hi))
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// One of `items` (None when empty).
    pub fn pick<'a, T>(&self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len() as u64) as usize)
    }

    /// One of `choices`, each with its weight.
    pub fn weighted<T: Copy>(&self, choices: &[(u64, T)]) -> Option<T> {
        let total: u64 = choices.iter().map(|(w, _)| w).sum();
        let mut draw = self.below(total);
        for (weight, choice) in choices {
            if draw < *weight {
                return Some(*choice);
            }
            draw -= weight;
        }
        None
    }

    pub fn next_u64(&self) -> u64 {
        self.with(|rng| rng.random())
    }
}
