//! `sluice-adapter-kit`: plain-Rust helpers the adapters share for reading PSP settlement
//! reports. No IO, no clock, no dependency on the host: it compiles into every adapter's
//! `wasm32-wasip2` component as it compiles natively for the golden tests.
//!
//! - [`csv`]: RFC 4180 CSV with a header row, read by column name;
//! - [`amount`]: decimal amounts in major units (`"12.34"`) → integer minor units, by the
//!   currency's ISO 4217 exponent;
//! - [`time`]: report timestamps (`"2013-06-03 11:26:49"` plus a zone) → Unix millis;
//! - [`memcmp`]: a word-at-a-time `memcmp` that replaces wasi-libc's byte loop in every
//!   guest that links this crate (`use sluice_adapter_kit as _;` is enough);
//! - [`allocator`]: the guests' global allocator, free lists of small blocks in front of
//!   talc, instead of wasi-libc's dlmalloc, in every guest that links this crate too.

pub mod allocator;
pub mod amount;
pub mod csv;
pub mod memcmp;
pub mod time;
