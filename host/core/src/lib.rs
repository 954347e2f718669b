//! Sluice's pure payment core.
//!
//! Everything here is deterministic: no IO, no clock, no randomness, no async.
//! Callers pass in a snapshot, an event and (where time matters) `now`, and get
//! back a decision. The store applies decisions through its one door.

pub mod event;
pub mod money;
pub mod state;

pub use event::{EventKind, EvidenceSource, FailureCategory};
pub use money::{Currency, Money, MoneyError};
pub use state::{AttemptState, CaptureState, OrderState, RefundState};
