//! What the store reads (inside the transaction) and hands to `decide_*`.

use serde::{Deserialize, Serialize};

use crate::amounts::Amounts;
use crate::event::EventIdentity;
use crate::money::Money;
use crate::state::{AttemptState, CaptureState, OrderState, RefundState};

/// How an attempt takes the money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMode {
    /// Sale: authorize and capture in one step. `PAYMENT_AUTHORIZED` is only
    /// progress here (the PSP captures by itself), and `PAYMENT_CAPTURED` /
    /// `CAPTURE_FAILED` without a capture record are the sale's own result.
    Automatic,
    /// Authorize first; captures (possibly partial, possibly several) and
    /// voids follow as separate commands.
    Manual,
}

impl CaptureMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            CaptureMode::Automatic => "automatic",
            CaptureMode::Manual => "manual",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "automatic" => Some(CaptureMode::Automatic),
            "manual" => Some(CaptureMode::Manual),
            _ => None,
        }
    }
}

/// The payment order (the merchant's intent) and its amount summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderSnapshot {
    pub state: OrderState,
    /// CAS version of the order row; bumped by every applied change to the
    /// order state or to `amounts`.
    pub version: i64,
    /// The payment's amount and frozen currency.
    pub amount: Money,
    pub amounts: Amounts,
}

/// One attempt at one PSP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptSnapshot {
    /// The host's stable attempt reference (the PSP idempotency key).
    pub reference: String,
    pub state: AttemptState,
    pub version: i64,
    pub capture_mode: CaptureMode,
    pub amount: Money,
    /// The PSP's payment id, once learned.
    pub psp_reference: Option<String>,
    /// The identity of the last event this attempt accepted.
    pub last_event: Option<EventIdentity>,
}

/// One refund.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundSnapshot {
    /// The host's stable refund reference (the PSP idempotency key).
    pub reference: String,
    pub state: RefundState,
    pub version: i64,
    pub amount: Money,
    pub psp_reference: Option<String>,
    pub last_event: Option<EventIdentity>,
}

/// One capture of an authorized attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSnapshot {
    /// The host's stable capture reference (the PSP idempotency key).
    pub reference: String,
    pub state: CaptureState,
    pub version: i64,
    pub amount: Money,
    pub psp_reference: Option<String>,
    pub last_event: Option<EventIdentity>,
}
