//! `memcmp` for the `wasm32` guests, eight bytes at a time.
//!
//! Every comparison of two strings or byte slices in a guest (`Ord` and `==` on `str`,
//! `String`, `[u8]`) ends in a call to `memcmp`. The one the `wasm32-wasip2` target links
//! by default is wasi-libc's (musl's), a loop of one byte per iteration, and it was the
//! largest single function of a 2 KB webhook call: about 10 % of the call, mostly the key
//! comparisons of serde_json's `BTreeMap` objects, where native code uses glibc's
//! vectorised `memcmp` (BENCHMARKS.md, adapter runtime, 2026-12-05 session 4). This
//! definition takes the place of wasi-libc's at link time (the linker takes a symbol from
//! the program's own objects before it looks in `libc.a`), in every adapter that links
//! this crate. It is not compiled for native targets: there the platform's `memcmp` is
//! already fast, and the native tests and benchmarks keep using it.
//!
//! It is guest code like any other: whatever it did wrong would stay inside the adapter's
//! own sandbox. Its result is the one the C standard asks for (the sign of the difference
//! of the first differing bytes, as unsigned), checked against the byte loop by
//! [`compare`]'s tests, which run natively.

use core::cmp::Ordering;

/// Compares `a` and `b` (equal lengths) the way `memcmp` does: eight bytes at a time,
/// then four, then byte by byte (most keys and field names are short). Written without
/// slice comparison, which would call `memcmp` again.
pub fn compare(a: &[u8], b: &[u8]) -> Ordering {
    let len = a.len().min(b.len());
    let mut at = 0;
    // Big-endian words order like their bytes do, so the first differing word decides.
    while at + 8 <= len {
        let (x, y) = (word::<8>(a, at), word::<8>(b, at));
        if x != y {
            return x.cmp(&y);
        }
        at += 8;
    }
    if at + 4 <= len {
        let (x, y) = (word::<4>(a, at), word::<4>(b, at));
        if x != y {
            return x.cmp(&y);
        }
        at += 4;
    }
    while at < len {
        if a[at] != b[at] {
            return a[at].cmp(&b[at]);
        }
        at += 1;
    }
    Ordering::Equal
}

/// The big-endian value of the `N` (at most 8) bytes of `bytes` from `at`.
fn word<const N: usize>(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0u8; 8];
    buf[8 - N..].copy_from_slice(&bytes[at..at + N]);
    u64::from_be_bytes(buf)
}

/// The C symbol. Only the guests define it (see the module's documentation).
///
/// # Safety
///
/// The C contract of `memcmp`: `a` and `b` each point at `n` readable bytes.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    if n == 0 {
        // The pointers of an empty comparison may be null or dangling.
        return 0;
    }
    // SAFETY: the caller guarantees `n` readable bytes at each pointer (memcmp's
    // contract), and `n > 0` so neither pointer is null.
    let (a, b) = unsafe {
        (
            core::slice::from_raw_parts(a, n),
            core::slice::from_raw_parts(b, n),
        )
    };
    match compare(a, b) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn byte_loop(a: &[u8], b: &[u8]) -> Ordering {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }

    #[test]
    fn compare_orders_like_a_byte_loop_at_every_length_and_position() {
        for len in 0..40usize {
            let base: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            assert_eq!(compare(&base, &base), Ordering::Equal);
            for at in 0..len {
                for delta in [1u8, 0x80, 0xff] {
                    let mut other = base.clone();
                    other[at] = other[at].wrapping_add(delta);
                    assert_eq!(
                        compare(&base, &other),
                        byte_loop(&base, &other),
                        "{len} {at}"
                    );
                    assert_eq!(
                        compare(&other, &base),
                        byte_loop(&other, &base),
                        "{len} {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn bytes_compare_as_unsigned() {
        assert_eq!(compare(&[0x7f], &[0x80]), Ordering::Less);
        assert_eq!(
            compare(&[0, 0, 0, 0, 0, 0, 0, 0xff], &[0; 8]),
            Ordering::Greater
        );
    }
}
