//! Ids and small formatting functions.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The sandbox's source of randomness: ids and webhook reordering. Seedable so a
/// test run can be replayed.
pub struct Ids {
    rng: Mutex<StdRng>,
}

const ALNUM: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const UPPER_ALNUM: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

impl Ids {
    pub fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self {
            rng: Mutex::new(rng),
        }
    }

    /// A Stripe-style id: `prefix_` and 24 alphanumerics.
    pub fn stripe(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.draw(ALNUM, 24))
    }

    /// An Adyen-style pspReference: 16 upper-case alphanumerics.
    pub fn adyen_psp_reference(&self) -> String {
        self.draw(UPPER_ALNUM, 16)
    }

    pub fn shuffle<T>(&self, items: &mut [T]) {
        items.shuffle(&mut *lock(&self.rng));
    }

    fn draw(&self, alphabet: &[u8], len: usize) -> String {
        let mut rng = lock(&self.rng);
        (0..len)
            .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
            .collect()
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every
/// critical section in this crate leaves the data consistent before any call that
/// could panic, so the data behind a poisoned lock is still valid.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `YYYY-MM-DDTHH:MM:SS+00:00` for a Unix time, as Adyen writes `eventDate`.
pub fn iso8601_utc(unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00",
        secs_of_day / 3600,
        (secs_of_day % 3600) / 60,
        secs_of_day % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_formats_known_instants() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00+00:00");
        assert_eq!(iso8601_utc(1_407_325_143), "2014-08-06T11:39:03+00:00");
        assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00+00:00");
    }

    #[test]
    fn seeded_ids_repeat_and_have_the_psp_shapes() {
        let a = Ids::new(Some(7));
        let b = Ids::new(Some(7));
        let pi = a.stripe("pi");
        assert_eq!(pi, b.stripe("pi"));
        assert!(pi.starts_with("pi_") && pi.len() == 27);
        let psp = a.adyen_psp_reference();
        assert_eq!(psp.len(), 16);
        assert!(psp
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
    }
}
