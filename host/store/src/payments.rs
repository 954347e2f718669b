//! Payment orders, their amounts, attempts, captures and refunds: the rows,
//! their creation, and the read side the API and the orchestrator use.

use crate::db::{int, json, opt_int, opt_text, parsed, text, Conn};
use crate::door::batch::Write;
use crate::door::{Step, MAX_CAS_TRIES};
use crate::history::{self, AnyQuery, NewHistory, Provenance};
use crate::merchants::ConnectorCredentials;
use crate::{ids, Backend, Store, StoreError};
use sluice_core::{
    decide_order, Amounts, AttemptSnapshot, AttemptState, CaptureMode, CaptureSnapshot,
    CaptureState, Currency, Decision, EventIdentity, Failure, FailureCategory, Money, OrderCommand,
    OrderSnapshot, OrderState, RefundSnapshot, RefundState, RejectReason,
};
use sqlx::any::AnyRow;
use sqlx::AnyConnection;
use sqlx::Row;

/// Seed 000's business fulfilment block: the long-lived goal, its deadline
/// (not to be confused with `next_retry_time`, which is only scheduling).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fulfillment {
    pub biz_key: Option<String>,
    pub deadline: Option<i64>,
    pub mode: Option<String>,
    pub state: Option<String>,
    /// The following are written only by the fulfillment door (read-only
    /// here; ignored by `create_payment`).
    /// The attempt that took the money, bound when the payment succeeded.
    pub attempt_reference: Option<String>,
    /// The compensation refund's reference (`cmp_<attempt reference>`).
    pub compensation_refund_reference: Option<String>,
    /// `fulfillment_deadline_passed` or `fulfilled_elsewhere`.
    pub compensation_reason: Option<String>,
    /// Why the fulfillment is (or was last) in manual review, in words.
    pub review_reason: Option<String>,
    /// When the fulfillment is checked next (unix ms), if scheduled.
    pub next_check_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PaymentOrder {
    pub id: String,
    pub merchant_id: String,
    pub merchant_order_no: String,
    /// Amount and currency, frozen at creation.
    pub amount: Money,
    pub capture_mode: CaptureMode,
    pub state: OrderState,
    /// The payment version: moves with every applied change of the payment or
    /// any of its attempts, captures, refunds and amounts.
    pub version: i64,
    pub payment_method_token: Option<String>,
    pub return_url: Option<String>,
    pub description: Option<String>,
    pub metadata: serde_json::Value,
    pub fulfillment: Fulfillment,
    pub manual_review: bool,
    pub manual_review_reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentAmounts {
    pub currency: Currency,
    pub amount_minor: i64,
    pub authorized_minor: i64,
    pub capture_reserved_minor: i64,
    pub captured_minor: i64,
    pub refund_reserved_minor: i64,
    pub refunded_minor: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PaymentAttempt {
    pub id: String,
    pub payment_id: String,
    pub attempt_no: i64,
    /// Stable reference sent to the PSP as idempotency key and merchant reference.
    pub reference: String,
    pub adapter: String,
    pub connector_account_id: String,
    pub psp_reference: Option<String>,
    pub amount: Money,
    pub capture_mode: CaptureMode,
    pub payment_method_token: Option<String>,
    /// The payment method type it was routed for (`card`, ...; None before
    /// migration 0017): a label of the PSP call metrics.
    pub payment_method_type: Option<String>,
    pub state: AttemptState,
    pub version: i64,
    pub next_retry_time: Option<i64>,
    pub retry_count: i64,
    /// When the host last sent a request or query to the PSP for it.
    pub last_psp_call_at: Option<i64>,
    pub timeout_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub last_event: Option<EventIdentity>,
    pub next_action_url: Option<String>,
    pub failure: Option<Failure>,
    /// When the door recorded the authorization (the validity watch starts here).
    pub authorized_at: Option<i64>,
    /// When the door recorded a void of the authorization as sent.
    pub void_requested_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The adapter version that builds the attempt's requests: pinned when it is
    /// first sent (a canary's attempts stay on the canary); `None` before that, and
    /// for attempts sent before pins were recorded (they follow the active version).
    pub adapter_pin: Option<crate::adapter_releases::AdapterPin>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    pub id: String,
    pub payment_id: String,
    pub attempt_id: String,
    pub reference: String,
    pub adapter: String,
    pub psp_reference: Option<String>,
    pub amount: Money,
    pub state: CaptureState,
    pub version: i64,
    pub next_retry_time: Option<i64>,
    pub retry_count: i64,
    /// When the host last sent a request or query to the PSP for it.
    pub last_psp_call_at: Option<i64>,
    pub last_event: Option<EventIdentity>,
    pub failure: Option<Failure>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    pub id: String,
    pub payment_id: String,
    pub attempt_id: String,
    pub reference: String,
    pub adapter: String,
    pub psp_reference: Option<String>,
    pub amount: Money,
    pub reason: Option<String>,
    pub state: RefundState,
    pub version: i64,
    pub next_retry_time: Option<i64>,
    pub retry_count: i64,
    /// When the host last sent a request or query to the PSP for it.
    pub last_psp_call_at: Option<i64>,
    pub last_event: Option<EventIdentity>,
    pub failure: Option<Failure>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Everything about one payment, read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentDetails {
    pub order: PaymentOrder,
    pub amounts: PaymentAmounts,
    pub attempts: Vec<PaymentAttempt>,
    pub captures: Vec<Capture>,
    pub refunds: Vec<Refund>,
}

/// What a merchant creates a payment with.
#[derive(Debug, Clone)]
pub struct NewPayment {
    pub merchant_id: String,
    pub merchant_order_no: String,
    pub amount: Money,
    pub capture_mode: CaptureMode,
    pub payment_method_token: Option<String>,
    pub return_url: Option<String>,
    pub description: Option<String>,
    pub metadata: serde_json::Value,
    pub fulfillment: Fulfillment,
}

/// What the orchestrator starts an attempt with. The adapter is the
/// connector account's; amount, currency and capture mode are the order's.
#[derive(Debug, Clone, Default)]
pub struct NewAttempt {
    pub payment_id: String,
    pub connector_account_id: String,
    /// Defaults to the order's token.
    pub payment_method_token: Option<String>,
    /// The payment method type routing used (`card`, ...).
    pub payment_method_type: Option<String>,
    pub timeout_at: Option<i64>,
    pub expires_at: Option<i64>,
    /// When the recovery scanner should first look at the attempt.
    pub next_retry_time: Option<i64>,
    /// Why routing chose this connector account (rule, split, failover),
    /// recorded in the attempt's creation history row.
    pub route_reason: Option<String>,
}

/// A page of a cursor-paginated list; pass `next_cursor` back to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

/// Position in a recovery scan: rows after (next_retry_time, id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanCursor {
    pub next_retry_time: i64,
    pub id: String,
}

pub(crate) const ORDER_COLS: &str = "id, merchant_id, merchant_order_no, amount_minor, currency, \
    capture_mode, state, version, payment_method_token, return_url, description, metadata_json, \
    biz_key, fulfillment_deadline, fulfillment_mode, fulfillment_state, manual_review, \
    manual_review_reason, created_at, updated_at, fulfillment_attempt_reference, \
    compensation_refund_reference, compensation_reason, fulfillment_review_json, \
    fulfillment_next_check_at";
pub(crate) const AMOUNT_COLS: &str = "currency, amount_minor, authorized_minor, \
    capture_reserved_minor, captured_minor, refund_reserved_minor, refunded_minor";
pub(crate) const ATTEMPT_COLS: &str = "id, payment_id, attempt_no, reference, adapter, \
    connector_account_id, psp_reference, amount_minor, currency, capture_mode, payment_method_token, \
    payment_method_type, state, version, next_retry_time, retry_count, last_psp_call_at, timeout_at, expires_at, \
    last_event_identity, \
    next_action_url, failure_code, failure_category, failure_message, authorized_at, \
    void_requested_at, created_at, updated_at, adapter_version, adapter_digest";
pub(crate) const CAPTURE_COLS: &str = "id, payment_id, attempt_id, reference, adapter, \
    psp_reference, amount_minor, currency, state, version, next_retry_time, retry_count, \
    last_psp_call_at, last_event_identity, failure_code, failure_category, failure_message, created_at, updated_at";
pub(crate) const REFUND_COLS: &str = "id, payment_id, attempt_id, reference, adapter, \
    psp_reference, amount_minor, currency, reason, state, version, next_retry_time, retry_count, \
    last_psp_call_at, last_event_identity, failure_code, failure_category, failure_message, created_at, updated_at";

fn money(row: &AnyRow, table: &'static str) -> Result<Money, StoreError> {
    let currency = currency(row, table)?;
    Ok(Money {
        amount_minor: int(row, "amount_minor")?,
        currency,
    })
}

fn currency(row: &AnyRow, table: &'static str) -> Result<Currency, StoreError> {
    let raw = text(row, "currency")?;
    Currency::parse(&raw).map_err(|e| StoreError::corrupt(table, format!("currency: {e}")))
}

fn last_event(row: &AnyRow, table: &'static str) -> Result<Option<EventIdentity>, StoreError> {
    opt_text(row, "last_event_identity")?
        .map(|raw| {
            serde_json::from_str(&raw)
                .map_err(|e| StoreError::corrupt(table, format!("last_event_identity: {e}")))
        })
        .transpose()
}

fn failure(row: &AnyRow) -> Result<Option<Failure>, StoreError> {
    let category = opt_text(row, "failure_category")?.and_then(|c| FailureCategory::parse(&c));
    Ok(match category {
        Some(category) => Some(Failure {
            category,
            code: opt_text(row, "failure_code")?.unwrap_or_default(),
            message: opt_text(row, "failure_message")?.unwrap_or_default(),
        }),
        None => None,
    })
}

pub(crate) fn order_from(row: &AnyRow) -> Result<PaymentOrder, StoreError> {
    const T: &str = "payment_orders";
    Ok(PaymentOrder {
        id: text(row, "id")?,
        merchant_id: text(row, "merchant_id")?,
        merchant_order_no: text(row, "merchant_order_no")?,
        amount: money(row, T)?,
        capture_mode: parsed(row, T, "capture_mode", CaptureMode::parse)?,
        state: parsed(row, T, "state", OrderState::parse)?,
        version: int(row, "version")?,
        payment_method_token: opt_text(row, "payment_method_token")?,
        return_url: opt_text(row, "return_url")?,
        description: opt_text(row, "description")?,
        metadata: json(row, T, "metadata_json")?,
        fulfillment: Fulfillment {
            biz_key: opt_text(row, "biz_key")?,
            deadline: opt_int(row, "fulfillment_deadline")?,
            mode: opt_text(row, "fulfillment_mode")?,
            state: opt_text(row, "fulfillment_state")?,
            attempt_reference: opt_text(row, "fulfillment_attempt_reference")?,
            compensation_refund_reference: opt_text(row, "compensation_refund_reference")?,
            compensation_reason: opt_text(row, "compensation_reason")?,
            review_reason: opt_text(row, "fulfillment_review_json")?
                .and_then(|raw| serde_json::from_str::<sluice_core::ReviewReason>(&raw).ok())
                .map(|reason| reason.to_string()),
            next_check_at: opt_int(row, "fulfillment_next_check_at")?,
        },
        manual_review: int(row, "manual_review")? != 0,
        manual_review_reason: opt_text(row, "manual_review_reason")?,
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

pub(crate) fn amounts_from(row: &AnyRow) -> Result<PaymentAmounts, StoreError> {
    amounts_named(row, "currency", "amount_minor")
}

/// The amounts of a row where their currency and amount columns are named
/// apart from the order's (a joined read).
fn amounts_named(
    row: &AnyRow,
    currency_col: &str,
    amount_col: &str,
) -> Result<PaymentAmounts, StoreError> {
    let raw = text(row, currency_col)?;
    let currency = Currency::parse(&raw)
        .map_err(|e| StoreError::corrupt("payment_amounts", format!("currency: {e}")))?;
    Ok(PaymentAmounts {
        currency,
        amount_minor: int(row, amount_col)?,
        authorized_minor: int(row, "authorized_minor")?,
        capture_reserved_minor: int(row, "capture_reserved_minor")?,
        captured_minor: int(row, "captured_minor")?,
        refund_reserved_minor: int(row, "refund_reserved_minor")?,
        refunded_minor: int(row, "refunded_minor")?,
    })
}

pub(crate) fn attempt_from(row: &AnyRow) -> Result<PaymentAttempt, StoreError> {
    attempt_from_prefixed(row, "")
}

/// A column's name in a read that prefixes one table's columns (`t_id`, ...)
/// to keep them apart from another table's of the same name.
fn col<'a>(prefix: &str, name: &'a str) -> std::borrow::Cow<'a, str> {
    if prefix.is_empty() {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(format!("{prefix}{name}"))
    }
}

/// An attempt from a row whose attempt columns are named `{prefix}{column}`.
fn attempt_from_prefixed(row: &AnyRow, p: &str) -> Result<PaymentAttempt, StoreError> {
    const T: &str = "payment_attempts";
    let t = |name| -> Result<String, StoreError> { text(row, &col(p, name)) };
    let ot = |name| -> Result<Option<String>, StoreError> { opt_text(row, &col(p, name)) };
    let i = |name| -> Result<i64, StoreError> { int(row, &col(p, name)) };
    let oi = |name| -> Result<Option<i64>, StoreError> { opt_int(row, &col(p, name)) };
    let currency = Currency::parse(&t("currency")?)
        .map_err(|e| StoreError::corrupt(T, format!("currency: {e}")))?;
    let last_event = ot("last_event_identity")?
        .map(|raw| {
            serde_json::from_str(&raw)
                .map_err(|e| StoreError::corrupt(T, format!("last_event_identity: {e}")))
        })
        .transpose()?;
    let failure = ot("failure_category")?
        .and_then(|c| FailureCategory::parse(&c))
        .map(|category| -> Result<Failure, StoreError> {
            Ok(Failure {
                category,
                code: ot("failure_code")?.unwrap_or_default(),
                message: ot("failure_message")?.unwrap_or_default(),
            })
        })
        .transpose()?;
    let adapter_pin = ot("adapter_version")?
        .zip(ot("adapter_digest")?)
        .map(|(version, digest)| crate::adapter_releases::AdapterPin { version, digest });
    Ok(PaymentAttempt {
        id: t("id")?,
        payment_id: t("payment_id")?,
        attempt_no: i("attempt_no")?,
        reference: t("reference")?,
        adapter: t("adapter")?,
        connector_account_id: t("connector_account_id")?,
        psp_reference: ot("psp_reference")?,
        amount: Money {
            amount_minor: i("amount_minor")?,
            currency,
        },
        capture_mode: parsed(row, T, &col(p, "capture_mode"), CaptureMode::parse)?,
        payment_method_token: ot("payment_method_token")?,
        payment_method_type: ot("payment_method_type")?,
        state: parsed(row, T, &col(p, "state"), AttemptState::parse)?,
        version: i("version")?,
        next_retry_time: oi("next_retry_time")?,
        retry_count: i("retry_count")?,
        last_psp_call_at: oi("last_psp_call_at")?,
        timeout_at: oi("timeout_at")?,
        expires_at: oi("expires_at")?,
        last_event,
        next_action_url: ot("next_action_url")?,
        failure,
        authorized_at: oi("authorized_at")?,
        void_requested_at: oi("void_requested_at")?,
        created_at: i("created_at")?,
        updated_at: i("updated_at")?,
        adapter_pin,
    })
}

pub(crate) fn capture_from(row: &AnyRow) -> Result<Capture, StoreError> {
    const T: &str = "captures";
    Ok(Capture {
        id: text(row, "id")?,
        payment_id: text(row, "payment_id")?,
        attempt_id: text(row, "attempt_id")?,
        reference: text(row, "reference")?,
        adapter: text(row, "adapter")?,
        psp_reference: opt_text(row, "psp_reference")?,
        amount: money(row, T)?,
        state: parsed(row, T, "state", CaptureState::parse)?,
        version: int(row, "version")?,
        next_retry_time: opt_int(row, "next_retry_time")?,
        retry_count: int(row, "retry_count")?,
        last_psp_call_at: opt_int(row, "last_psp_call_at")?,
        last_event: last_event(row, T)?,
        failure: failure(row)?,
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

pub(crate) fn refund_from(row: &AnyRow) -> Result<Refund, StoreError> {
    const T: &str = "refunds";
    Ok(Refund {
        id: text(row, "id")?,
        payment_id: text(row, "payment_id")?,
        attempt_id: text(row, "attempt_id")?,
        reference: text(row, "reference")?,
        adapter: text(row, "adapter")?,
        psp_reference: opt_text(row, "psp_reference")?,
        amount: money(row, T)?,
        reason: opt_text(row, "reason")?,
        state: parsed(row, T, "state", RefundState::parse)?,
        version: int(row, "version")?,
        next_retry_time: opt_int(row, "next_retry_time")?,
        retry_count: int(row, "retry_count")?,
        last_psp_call_at: opt_int(row, "last_psp_call_at")?,
        last_event: last_event(row, T)?,
        failure: failure(row)?,
        created_at: int(row, "created_at")?,
        updated_at: int(row, "updated_at")?,
    })
}

impl PaymentAmounts {
    /// The core's view; refuses stored values that break an invariant.
    pub fn to_core(&self) -> Result<Amounts, StoreError> {
        Amounts::from_parts(
            self.authorized_minor,
            self.capture_reserved_minor,
            self.captured_minor,
            self.refund_reserved_minor,
            self.refunded_minor,
        )
        .map_err(|e| StoreError::corrupt("payment_amounts", e.to_string()))
    }

    /// The same payment's amounts as the core moved them (currency and
    /// amount are frozen at creation).
    pub fn moved_to(&self, moved: Amounts) -> PaymentAmounts {
        PaymentAmounts {
            authorized_minor: moved.authorized,
            capture_reserved_minor: moved.capture_reserved,
            captured_minor: moved.captured,
            refund_reserved_minor: moved.refund_reserved,
            refunded_minor: moved.refunded,
            ..*self
        }
    }

    pub fn refundable_minor(&self) -> i64 {
        self.captured_minor - self.refunded_minor - self.refund_reserved_minor
    }

    pub fn capturable_minor(&self) -> i64 {
        self.authorized_minor - self.captured_minor - self.capture_reserved_minor
    }
}

impl PaymentOrder {
    /// The snapshot the core decides on.
    pub fn snapshot(&self, amounts: &PaymentAmounts) -> Result<OrderSnapshot, StoreError> {
        Ok(OrderSnapshot {
            state: self.state,
            version: self.version,
            amount: self.amount,
            amounts: amounts.to_core()?,
        })
    }
}

impl PaymentAttempt {
    pub fn snapshot(&self) -> AttemptSnapshot {
        AttemptSnapshot {
            reference: self.reference.clone(),
            state: self.state,
            version: self.version,
            capture_mode: self.capture_mode,
            amount: self.amount,
            psp_reference: self.psp_reference.clone(),
            last_event: self.last_event.clone(),
        }
    }
}

impl Capture {
    pub fn snapshot(&self) -> CaptureSnapshot {
        CaptureSnapshot {
            reference: self.reference.clone(),
            state: self.state,
            version: self.version,
            amount: self.amount,
            psp_reference: self.psp_reference.clone(),
            last_event: self.last_event.clone(),
        }
    }
}

impl Refund {
    pub fn snapshot(&self) -> RefundSnapshot {
        RefundSnapshot {
            reference: self.reference.clone(),
            state: self.state,
            version: self.version,
            amount: self.amount,
            psp_reference: self.psp_reference.clone(),
            last_event: self.last_event.clone(),
        }
    }
}

// ---- reads inside a transaction (the door uses these) -------------------------

pub(crate) async fn order_in(tx: &mut Conn, payment_id: &str) -> Result<PaymentOrder, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ORDER_COLS} FROM payment_orders WHERE id = $1"
    ))
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("payment", payment_id))?;
    order_from(&row)
}

/// The order joined with its amounts, `extra` columns after them.
fn order_and_amounts_sql(extra: &str) -> String {
    order_head_sql(
        extra,
        "FROM payment_orders o JOIN payment_amounts a ON a.payment_id = o.id WHERE o.id = $1",
    )
}

/// The order's columns (`o`) and its amounts' (`a`), `extra` columns after them,
/// from and where the caller says.
fn order_head_sql(extra: &str, from_where: &str) -> String {
    let order: Vec<String> = ORDER_COLS
        .split(',')
        .map(|c| format!("o.{}", c.trim()))
        .collect();
    format!(
        "SELECT {}, a.currency AS amounts_currency, a.amount_minor AS amounts_amount_minor, \
         a.authorized_minor, a.capture_reserved_minor, a.captured_minor, \
         a.refund_reserved_minor, a.refunded_minor{extra} {from_where}",
        order.join(", ")
    )
}

async fn order_and_amounts_row(
    conn: &mut AnyConnection,
    sql: &str,
    payment_id: &str,
) -> Result<(PaymentOrder, PaymentAmounts, AnyRow), StoreError> {
    let row = sqlx::query(sql)
        .bind(payment_id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::not_found("payment", payment_id))?;
    let amounts = amounts_named(&row, "amounts_currency", "amounts_amount_minor")?;
    Ok((order_from(&row)?, amounts, row))
}

/// The order and its amounts in one statement. Every step of the door reads
/// both; one round trip instead of two is about 5 statements per payment.
pub(crate) async fn order_and_amounts_in(
    conn: &mut AnyConnection,
    payment_id: &str,
) -> Result<(PaymentOrder, PaymentAmounts), StoreError> {
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| order_and_amounts_sql(""));
    let (order, amounts, _) = order_and_amounts_row(conn, &SQL, payment_id).await?;
    Ok((order, amounts))
}

/// An attempt with its order and the order's amounts, in one statement and so
/// from one snapshot: the door's read for an event about an attempt (before,
/// locating the attempt, then reading the order and the attempt again took
/// three). `column` is `id` or `reference`, both unique. When `inbox` names
/// the inbox row the event came from, also whether that row is already
/// processed, in the same statement: a webhook's decision read both in two
/// round trips before.
pub(crate) async fn attempt_head_in(
    conn: &mut AnyConnection,
    column: AttemptKey,
    key: &str,
    inbox: Option<&str>,
) -> Result<Option<AttemptRead>, StoreError> {
    static SQL: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
        [
            attempt_with_order_sql("id", false),
            attempt_with_order_sql("reference", false),
            attempt_with_order_sql("id", true),
            attempt_with_order_sql("reference", true),
        ]
    });
    let column_index = match column {
        AttemptKey::Id => 0,
        AttemptKey::Reference => 1,
    };
    let sql = &SQL[column_index + if inbox.is_some() { 2 } else { 0 }];
    let mut query = sqlx::query(sql).bind(key);
    if let Some(inbox_id) = inbox {
        query = query.bind(inbox_id);
    }
    let Some(row) = query.fetch_optional(conn).await? else {
        return Ok(None);
    };
    let inbox_status = match inbox {
        None => None,
        Some(_) => opt_text(&row, "inbox_status")?,
    };
    let head = AttemptHead {
        order: order_from(&row)?,
        amounts: amounts_named(&row, "amounts_currency", "amounts_amount_minor")?,
        attempt: attempt_from_prefixed(&row, ATTEMPT_PREFIX)?,
    };
    Ok(Some(AttemptRead { head, inbox_status }))
}

/// An attempt, its order and the order's amounts at one version of the
/// order: as one statement read them, or as the create that wrote them left
/// them. What a step of the attempt is decided from.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptHead {
    pub order: PaymentOrder,
    pub amounts: PaymentAmounts,
    pub attempt: PaymentAttempt,
}

/// What [`attempt_head_in`] read, from one snapshot.
pub(crate) struct AttemptRead {
    pub(crate) head: AttemptHead,
    /// The status of the inbox row asked about, when there is one.
    inbox_status: Option<String>,
}

impl AttemptRead {
    /// Whether `inbox`, the inbox row the read asked about, is processed
    /// (false without one). Asked only once the caller checked the attempt:
    /// a row of another account is refused before this could be.
    pub(crate) fn inbox_processed(&self, inbox: Option<&str>) -> Result<bool, StoreError> {
        match (inbox, &self.inbox_status) {
            (None, _) => Ok(false),
            (Some(_), Some(status)) => Ok(status == "processed"),
            (Some(inbox_id), None) => Err(StoreError::not_found("inbox entry", inbox_id)),
        }
    }
}

/// Which unique column of an attempt a read goes by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptKey {
    Id,
    Reference,
}

const ATTEMPT_PREFIX: &str = "t_";

fn attempt_with_order_sql(column: &str, with_inbox: bool) -> String {
    let attempt: Vec<String> = ATTEMPT_COLS
        .split(',')
        .map(|c| format!("t.{0} AS {ATTEMPT_PREFIX}{0}", c.trim()))
        .collect();
    let inbox = if with_inbox {
        ", (SELECT i.status FROM webhook_inbox i WHERE i.id = $2) AS inbox_status"
    } else {
        ""
    };
    order_head_sql(
        &format!(", {}{inbox}", attempt.join(", ")),
        &format!(
            "FROM payment_attempts t JOIN payment_orders o ON o.id = t.payment_id \
             JOIN payment_amounts a ON a.payment_id = o.id WHERE t.{column} = $1"
        ),
    )
}

/// The head of a payment's details, in one statement and so from one
/// snapshot: the order, its amounts, its attempts, and whether it has any
/// capture or refund row at all (most payments have neither, and then the two
/// reads of them are skipped).
struct DetailsHead {
    order: PaymentOrder,
    amounts: PaymentAmounts,
    attempts: Vec<PaymentAttempt>,
    has_captures: bool,
    has_refunds: bool,
}

async fn details_head(
    conn: &mut AnyConnection,
    payment_id: &str,
) -> Result<DetailsHead, StoreError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let attempt: Vec<String> = ATTEMPT_COLS
            .split(',')
            .map(|c| format!("t.{0} AS {ATTEMPT_PREFIX}{0}", c.trim()))
            .collect();
        order_head_sql(
            &format!(
                ", CASE WHEN EXISTS (SELECT 1 FROM captures c WHERE c.payment_id = o.id) \
                 THEN 1 ELSE 0 END AS has_captures, \
                 CASE WHEN EXISTS (SELECT 1 FROM refunds r WHERE r.payment_id = o.id) \
                 THEN 1 ELSE 0 END AS has_refunds, {}",
                attempt.join(", ")
            ),
            "FROM payment_orders o JOIN payment_amounts a ON a.payment_id = o.id \
             LEFT JOIN payment_attempts t ON t.payment_id = o.id \
             WHERE o.id = $1 ORDER BY t.attempt_no",
        )
    });
    let rows = sqlx::query(&SQL).bind(payment_id).fetch_all(conn).await?;
    // One row per attempt, or one without an attempt.
    let first = rows
        .first()
        .ok_or_else(|| StoreError::not_found("payment", payment_id))?;
    let mut attempts = Vec::with_capacity(rows.len());
    for row in &rows {
        if opt_text(row, &format!("{ATTEMPT_PREFIX}id"))?.is_some() {
            attempts.push(attempt_from_prefixed(row, ATTEMPT_PREFIX)?);
        }
    }
    Ok(DetailsHead {
        order: order_from(first)?,
        amounts: amounts_named(first, "amounts_currency", "amounts_amount_minor")?,
        attempts,
        has_captures: int(first, "has_captures")? != 0,
        has_refunds: int(first, "has_refunds")? != 0,
    })
}

pub(crate) async fn amounts_in(
    tx: &mut Conn,
    payment_id: &str,
) -> Result<PaymentAmounts, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {AMOUNT_COLS} FROM payment_amounts WHERE payment_id = $1"
    ))
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("payment amounts", payment_id))?;
    amounts_from(&row)
}

pub(crate) async fn latest_attempt_in(
    tx: &mut Conn,
    payment_id: &str,
) -> Result<Option<PaymentAttempt>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ATTEMPT_COLS} FROM payment_attempts WHERE payment_id = $1 \
         ORDER BY attempt_no DESC LIMIT 1"
    ))
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?;
    row.as_ref().map(attempt_from).transpose()
}

pub(crate) async fn attempt_in(
    tx: &mut Conn,
    attempt_id: &str,
) -> Result<PaymentAttempt, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ATTEMPT_COLS} FROM payment_attempts WHERE id = $1"
    ))
    .bind(attempt_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("attempt", attempt_id))?;
    attempt_from(&row)
}

pub(crate) async fn capture_in(tx: &mut Conn, capture_id: &str) -> Result<Capture, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {CAPTURE_COLS} FROM captures WHERE id = $1"
    ))
    .bind(capture_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| StoreError::not_found("capture", capture_id))?;
    capture_from(&row)
}

pub(crate) async fn refund_in(tx: &mut Conn, refund_id: &str) -> Result<Refund, StoreError> {
    let row = sqlx::query(&format!("SELECT {REFUND_COLS} FROM refunds WHERE id = $1"))
        .bind(refund_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("refund", refund_id))?;
    refund_from(&row)
}

/// The history row for a command (as opposed to PSP evidence).
pub(crate) fn command_kind(command: OrderCommand) -> &'static str {
    match command {
        OrderCommand::StartAttempt => "COMMAND_START_ATTEMPT",
        OrderCommand::Cancel => "COMMAND_CANCEL",
        OrderCommand::Expire => "COMMAND_EXPIRE",
        OrderCommand::GiveUp => "COMMAND_GIVE_UP",
    }
}

/// A new payment order in state CREATED, as `create_payment` inserts it.
fn new_order(id: String, new: &NewPayment, now: i64) -> Result<PaymentOrder, StoreError> {
    if new.amount.amount_minor <= 0 {
        return Err(StoreError::Unapplicable(format!(
            "payment amount must be positive, got {}",
            new.amount.amount_minor
        )));
    }
    let mut fulfillment = new.fulfillment.clone();
    // A payment with a fulfillment block starts its fulfillment lifecycle at
    // once (seed 000: PENDING_PAYMENT).
    if fulfillment.mode.is_some() && fulfillment.state.is_none() {
        fulfillment.state = Some(
            sluice_core::FulfillmentState::PendingPayment
                .as_str()
                .into(),
        );
    }
    Ok(PaymentOrder {
        id,
        merchant_id: new.merchant_id.clone(),
        merchant_order_no: new.merchant_order_no.clone(),
        amount: new.amount,
        capture_mode: new.capture_mode,
        state: OrderState::Created,
        version: 0,
        payment_method_token: new.payment_method_token.clone(),
        return_url: new.return_url.clone(),
        description: new.description.clone(),
        metadata: new.metadata.clone(),
        fulfillment,
        manual_review: false,
        manual_review_reason: None,
        created_at: now,
        updated_at: now,
    })
}

/// The amounts of an order just inserted: nothing authorized, reserved,
/// captured or refunded yet (the columns' defaults).
fn new_amounts(order: &PaymentOrder) -> PaymentAmounts {
    PaymentAmounts {
        currency: order.amount.currency,
        amount_minor: order.amount.amount_minor,
        authorized_minor: 0,
        capture_reserved_minor: 0,
        captured_minor: 0,
        refund_reserved_minor: 0,
        refunded_minor: 0,
    }
}

/// The history row of an order's creation.
fn created_row<'a>(order: &'a PaymentOrder, provenance: &'a Provenance) -> NewHistory<'a> {
    NewHistory {
        payment_id: &order.id,
        aggregate_type: "order",
        aggregate_id: &order.id,
        to_state: OrderState::Created.as_str(),
        to_version: 0,
        event_kind: "COMMAND_CREATE",
        evidence_source: "command",
        amount_minor: Some(order.amount.amount_minor),
        currency: Some(order.amount.currency.as_str()),
        decision: "applied",
        reason: "payment created",
        provenance: Some(provenance),
        ..NewHistory::default()
    }
}

/// A payment and its first attempt built by [`Store::fresh_payment`], not
/// written yet.
#[derive(Debug, Clone)]
pub struct FreshPayment {
    order: PaymentOrder,
    amounts: PaymentAmounts,
    account: ConnectorCredentials,
    new: NewAttempt,
    attempt_id: String,
    plain: Option<PlainStart>,
}

/// A fresh order's first attempt that starts plainly: the order's new state
/// and the rule that moves it, and the attempt as inserted.
#[derive(Debug, Clone)]
struct PlainStart {
    new_state: OrderState,
    rule: &'static str,
    attempt: PaymentAttempt,
}

impl FreshPayment {
    /// The rows as the create leaves them when its start is plain, before
    /// any record of a send: what a first send's request is built from.
    pub fn head(&self) -> Option<AttemptHead> {
        self.plain.as_ref().map(|plain| self.head_of(plain))
    }

    fn head_of(&self, plain: &PlainStart) -> AttemptHead {
        AttemptHead {
            order: PaymentOrder {
                state: plain.new_state,
                version: self.order.version + 1,
                updated_at: plain.attempt.created_at,
                ..self.order.clone()
            },
            amounts: self.amounts,
            attempt: plain.attempt.clone(),
        }
    }
}

/// What a create with `confirm` committed.
#[derive(Debug, Clone)]
pub struct CreatedPayment {
    /// The rows as stored: after the first send's record when it was written.
    pub head: AttemptHead,
    /// The record of the first send, when it was written with the create
    /// (its [`crate::Applied::after`] is `head`).
    pub sent: Option<crate::Applied>,
}

impl CreatedPayment {
    fn logged(head: AttemptHead, sent: Option<crate::door::FreshSent>, ids: Vec<i64>) -> Self {
        let (order, first) = (&head.order, &head.attempt);
        tracing::info!(payment_id = %order.id, attempt_id = %first.id, adapter = %first.adapter,
            sent = sent.is_some(), "payment created with its first attempt");
        let sent = sent.map(|sent| crate::Applied {
            history_ids: ids,
            ..sent.applied
        });
        let head = (sent.as_ref().and_then(|s| s.after.clone())).unwrap_or(head);
        CreatedPayment { head, sent }
    }
}

async fn insert_new_order(tx: &mut Conn, order: &PaymentOrder) -> Result<(), StoreError> {
    insert_order(tx, order)
        .await
        .map_err(|e| order_insert_error(order, e))
}

/// What a failed insert of a new order means: its order number is used, or
/// its merchant does not exist.
fn order_insert_error(order: &PaymentOrder, e: StoreError) -> StoreError {
    if e.is_unique_violation() {
        StoreError::Conflict(format!(
            "merchant order number {:?} is already used",
            order.merchant_order_no
        ))
    } else if e.db_is_fk_violation() {
        StoreError::not_found("merchant", &order.merchant_id)
    } else {
        e
    }
}

/// What a new attempt starts from: its order and amounts as read (or just
/// created) in the transaction, and the payment's latest attempt.
struct AttemptBasis<'a> {
    order: &'a PaymentOrder,
    amounts: &'a PaymentAmounts,
    latest: Option<PaymentAttempt>,
    /// The new attempt's id when the caller drew it already.
    attempt_id: Option<String>,
}

impl Store {
    /// A fresh payment id, for a caller that routes the payment (routing
    /// splits by payment id) before [`Store::create_payment_with_attempt`]
    /// inserts it. Used once: the insert persists it or it is dropped.
    pub fn mint_payment_id(&self) -> String {
        ids::payment(&self.env)
    }

    /// Create a payment order (state CREATED) and its amount row.
    pub async fn create_payment(
        &self,
        new: &NewPayment,
        provenance: &Provenance,
    ) -> Result<PaymentOrder, StoreError> {
        let order = new_order(ids::payment(&self.env), new, self.now_ms())?;
        let mut tx = self.begin_write().await?;
        insert_new_order(&mut tx, &order).await?;
        history::append(&mut tx, &created_row(&order, provenance), order.created_at).await?;
        self.commit_write(tx).await?;
        Ok(order)
    }

    /// A payment (`payment_id` from [`Store::mint_payment_id`]) and its
    /// first attempt as a create with `confirm` will insert them, nothing
    /// written yet: the order, its amounts and the attempt's id drawn, and,
    /// when the start is plain (the merchant's own account, a start the rule
    /// allows), the attempt with its reference, so that the caller can build
    /// the first send's request and take its call slot before the create
    /// commits ([`Store::create_payment_with_attempt`]).
    pub async fn fresh_payment(
        &self,
        payment_id: &str,
        new: &NewPayment,
        attempt: &NewAttempt,
    ) -> Result<FreshPayment, StoreError> {
        let account = self
            .connector_credentials_cached(&attempt.connector_account_id)
            .await?;
        let order = new_order(payment_id.to_owned(), new, self.now_ms())?;
        let amounts = new_amounts(&order);
        let attempt_id = ids::attempt(&self.env);
        let plain = self.plain_start(&order, &amounts, attempt, &attempt_id, &account)?;
        Ok(FreshPayment {
            order,
            amounts,
            account,
            new: attempt.clone(),
            attempt_id,
            plain,
        })
    }

    /// The start of a fresh order's first attempt when it is plain, decided
    /// as [`Self::start_attempt_on`] decides it; `None` otherwise (another
    /// merchant's account, a refusal), whose errors and evidence the
    /// step-by-step path gives.
    fn plain_start(
        &self,
        order: &PaymentOrder,
        amounts: &PaymentAmounts,
        new: &NewAttempt,
        attempt_id: &str,
        account: &ConnectorCredentials,
    ) -> Result<Option<PlainStart>, StoreError> {
        if account.merchant_id != order.merchant_id {
            return Ok(None);
        }
        let decision = decide_order(&order.snapshot(amounts)?, None, OrderCommand::StartAttempt);
        let Decision::Apply {
            new_state, rule, ..
        } = decision
        else {
            return Ok(None);
        };
        let now = self.now_ms();
        let attempt = new_attempt(order, account, new, 1, attempt_id.to_owned(), self.at(now));
        Ok(Some(PlainStart {
            new_state,
            rule,
            attempt,
        }))
    }

    /// Create a `fresh` payment and start its first attempt in one
    /// transaction: a create with `confirm`. The attempt is decided by the
    /// same rule as [`Store::create_attempt`], so the two reads and the
    /// commit between the two writes are saved. With `first`, and when the
    /// start is plain, the record of the attempt's first send is decided on
    /// the rows being inserted and written in the same commit (`door::fresh`):
    /// [`CreatedPayment::sent`] says whether it was. All or nothing: a used
    /// order number is a conflict and nothing is written.
    pub async fn create_payment_with_attempt(
        &self,
        fresh: &FreshPayment,
        provenance: &Provenance,
        first: Option<&crate::FirstSend>,
    ) -> Result<CreatedPayment, StoreError> {
        if let Some(plain) = &fresh.plain {
            let head = fresh.head_of(plain);
            let sent = match first {
                Some(first) => self.first_send_on(&head, first, self.now_ms())?,
                None => None,
            };
            let history_ids = self
                .create_plainly(fresh, plain, sent.as_ref(), provenance)
                .await?;
            return Ok(CreatedPayment::logged(head, sent, history_ids));
        }
        let mut tx = self.begin_write().await?;
        let order = &fresh.order;
        insert_new_order(&mut tx, order).await?;
        let basis = AttemptBasis {
            order,
            amounts: &fresh.amounts,
            latest: None,
            attempt_id: Some(fresh.attempt_id.clone()),
        };
        let lead = created_row(order, provenance);
        let (new, account) = (&fresh.new, &fresh.account);
        let started = self
            .start_attempt_on(&mut tx, basis, new, account, provenance, Some(lead))
            .await?;
        // A fresh order, locked by this transaction: the rule applies and the
        // version check holds; anything else rolls the creation back too.
        let Step::Done(Ok(first)) = started else {
            tx.rollback().await?;
            return Err(StoreError::Conflict(format!(
                "payment {}: its first attempt could not start with it",
                order.id
            )));
        };
        self.commit_write(tx).await?;
        let head = AttemptHead {
            order: PaymentOrder {
                state: OrderState::Processing,
                version: order.version + 1,
                updated_at: first.created_at,
                ..order.clone()
            },
            amounts: fresh.amounts,
            attempt: first,
        };
        Ok(CreatedPayment::logged(head, None, Vec::new()))
    }

    /// [`Self::insert_plainly`], committed; the ids of the first send's
    /// history rows when `sent` was written with it.
    async fn create_plainly(
        &self,
        fresh: &FreshPayment,
        plain: &PlainStart,
        sent: Option<&crate::door::FreshSent>,
        provenance: &Provenance,
    ) -> Result<Vec<i64>, StoreError> {
        match self.backend {
            Backend::Postgres => {
                // One statement outside a transaction.
                let mut conn = self.begin_alone().await?;
                let ids = self
                    .insert_plainly(&mut conn, fresh, plain, sent, provenance)
                    .await?;
                self.env.reached(crate::env::AwaitPoint::AfterCommit).await;
                Ok(ids)
            }
            Backend::Sqlite => {
                let mut tx = self.begin_write().await?;
                let ids = self
                    .insert_plainly(&mut tx, fresh, plain, sent, provenance)
                    .await?;
                self.commit_write(tx).await?;
                Ok(ids)
            }
        }
    }

    /// A fresh order and its first attempt in one round trip: the same
    /// decision, instant, ids and rows as [`insert_new_order`] and
    /// [`Self::start_attempt_on`], with the order inserted as that decision
    /// leaves it instead of inserted and then moved (one round trip instead
    /// of five; the database's CHECKs, foreign keys and unique indexes apply
    /// as before), and with `sent`, the record of the first send, as its
    /// rows are after it, its history and outbox writes appended. On
    /// PostgreSQL one statement run outside any transaction: it commits all
    /// of its rows or, failing, none, without `BEGIN` and `COMMIT` round
    /// trips. On SQLite a script of the inserts in the caller's write
    /// transaction. Returns the ids of `sent`'s history rows.
    async fn insert_plainly(
        &self,
        tx: &mut Conn,
        fresh: &FreshPayment,
        plain: &PlainStart,
        sent: Option<&crate::door::FreshSent>,
        provenance: &Provenance,
    ) -> Result<Vec<i64>, StoreError> {
        let (order, attempt) = (&fresh.order, &plain.attempt);
        let reason = created_reason(&fresh.new);
        let started = Started {
            order,
            attempt,
            new_state: plain.new_state,
            rule: plain.rule,
            reason: &reason,
        };
        let rows: Vec<NewHistory<'_>> = std::iter::once(created_row(order, provenance))
            .chain(started.history(provenance))
            .collect();
        let head = fresh.head_of(plain);
        let (moved, attempt) = match sent {
            Some(sent) => (&sent.after.order, &sent.after.attempt),
            None => (&head.order, attempt),
        };
        let sent_rows = sent.map_or(0, |sent| sent.history_rows);
        let outbox = sent.map_or(&[][..], |sent| &sent.outbox[..]);
        let sql = plain_sql(self.backend, rows.len() + sent_rows, outbox);
        let query = bind_attempt(
            bind_order(sqlx::query(&sql), moved, moved.updated_at),
            attempt,
        );
        let mut query = query;
        for row in &rows {
            query = history::bind_row(query, row, attempt.created_at);
        }
        let binds = (sent.into_iter())
            .flat_map(|sent| std::iter::once(&sent.history).chain(&sent.outbox))
            .flat_map(|write| write.binds.iter().cloned());
        let found = crate::door::batch::bind_all(query, binds)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| order_insert_error(order, e.into()))?;
        let mut ids = found
            .iter()
            .map(|row| row.try_get::<i64, _>("id"))
            .collect::<Result<Vec<_>, _>>()?;
        // Drawn in the order of the insert's rows, so sorted they are that
        // order: the record's are the last.
        ids.sort_unstable();
        Ok(ids.split_off(ids.len().saturating_sub(sent_rows)))
    }

    /// Start a new attempt on a payment. Allowed only when the order is open
    /// and no earlier attempt is live (not FAILED or CANCELED): never while
    /// one is UNKNOWN or in flight. The rule is the core's `decide_order`,
    /// backed by a unique partial index in the database.
    pub async fn create_attempt(
        &self,
        new: &NewAttempt,
        provenance: &Provenance,
    ) -> Result<PaymentAttempt, StoreError> {
        // Only the account's merchant and adapter are used, and neither ever
        // changes, so the payment path's cached read is exact here.
        let account = self
            .connector_credentials_cached(&new.connector_account_id)
            .await?;
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            match self
                .create_attempt_once(&mut tx, new, &account, provenance)
                .await?
            {
                Step::Done(Ok(attempt)) => {
                    self.commit_write(tx).await?;
                    tracing::info!(
                        payment_id = %attempt.payment_id,
                        attempt_id = %attempt.id,
                        adapter = %attempt.adapter,
                        "attempt created"
                    );
                    return Ok(attempt);
                }
                Step::Done(Err(refusal)) => {
                    // The refusal's history row is evidence: keep it.
                    self.commit_write(tx).await?;
                    return Err(refusal);
                }
                Step::Retry => {
                    tx.rollback().await?;
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(tries) * 2))
                        .await;
                }
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "order",
            id: new.payment_id.clone(),
            tries: MAX_CAS_TRIES,
        })
    }

    async fn create_attempt_once(
        &self,
        tx: &mut Conn,
        new: &NewAttempt,
        account: &ConnectorCredentials,
        provenance: &Provenance,
    ) -> Result<Step<Result<PaymentAttempt, StoreError>>, StoreError> {
        let (order, amounts) = order_and_amounts_in(tx, &new.payment_id).await?;
        let latest = latest_attempt_in(tx, &order.id).await?;
        let basis = AttemptBasis {
            order: &order,
            amounts: &amounts,
            latest,
            attempt_id: None,
        };
        self.start_attempt_on(tx, basis, new, account, provenance, None)
            .await
    }

    /// The decision and writes of a new attempt on `basis`; `lead` is a
    /// history row written before the attempt's own (the order's creation,
    /// when both happen in one transaction).
    async fn start_attempt_on(
        &self,
        tx: &mut Conn,
        basis: AttemptBasis<'_>,
        new: &NewAttempt,
        account: &ConnectorCredentials,
        provenance: &Provenance,
        lead: Option<NewHistory<'_>>,
    ) -> Result<Step<Result<PaymentAttempt, StoreError>>, StoreError> {
        let AttemptBasis {
            order,
            amounts,
            latest,
            attempt_id,
        } = basis;
        if account.merchant_id != order.merchant_id {
            return Err(StoreError::not_found(
                "connector account",
                &new.connector_account_id,
            ));
        }
        let decision = decide_order(
            &order.snapshot(amounts)?,
            latest.as_ref().map(|a| a.state),
            OrderCommand::StartAttempt,
        );
        let now = self.now_ms();
        let Decision::Apply {
            new_state, rule, ..
        } = decision
        else {
            let refusal = refusal_error(order, latest.as_ref(), &decision);
            crate::door::record_order_refusal(
                tx,
                order,
                OrderCommand::StartAttempt,
                &decision,
                provenance,
                now,
            )
            .await?;
            return Ok(Step::Done(Err(refusal)));
        };
        if !bump_order(tx, order, new_state, now).await? {
            return Ok(Step::Retry);
        }
        let attempt_no = latest.as_ref().map_or(1, |a| a.attempt_no + 1);
        let attempt_id = attempt_id.unwrap_or_else(|| ids::attempt(&self.env));
        let attempt = new_attempt(order, account, new, attempt_no, attempt_id, self.at(now));
        if let Err(e) = insert_attempt(tx, &attempt).await {
            if e.is_unique_violation() {
                // The partial unique index is the last net behind decide_order.
                return Err(StoreError::AttemptInFlight {
                    payment_id: order.id.clone(),
                    attempt_id: latest.map(|a| a.id).unwrap_or_default(),
                    state: "live".into(),
                });
            }
            return Err(e);
        }
        let created_reason = created_reason(new);
        let started = Started {
            order,
            attempt: &attempt,
            new_state,
            rule,
            reason: &created_reason,
        };
        let rows = started.history(provenance);
        let rows: Vec<NewHistory<'_>> = lead.into_iter().chain(rows).collect();
        history::append_all(tx, &rows, now).await?;
        Ok(Step::Done(Ok(attempt)))
    }

    /// A payment, scoped to a merchant when `merchant_id` is given.
    pub async fn get_payment(
        &self,
        merchant_id: Option<&str>,
        payment_id: &str,
    ) -> Result<PaymentOrder, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM payment_orders \
             WHERE id = $1 AND ($2 IS NULL OR merchant_id = $2)"
        ))
        .bind(payment_id)
        .bind(merchant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("payment", payment_id))?;
        order_from(&row)
    }

    pub async fn get_payment_by_order_no(
        &self,
        merchant_id: &str,
        merchant_order_no: &str,
    ) -> Result<PaymentOrder, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM payment_orders \
             WHERE merchant_id = $1 AND merchant_order_no = $2"
        ))
        .bind(merchant_id)
        .bind(merchant_order_no)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("payment", merchant_order_no))?;
        order_from(&row)
    }

    /// A merchant's payments, newest first. `cursor` is the `next_cursor` of
    /// the previous page.
    pub async fn list_payments(
        &self,
        merchant_id: &str,
        limit: i64,
        cursor: Option<&str>,
    ) -> Result<Page<PaymentOrder>, StoreError> {
        let limit = limit.clamp(1, 200);
        let rows = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM payment_orders \
             WHERE merchant_id = $1 AND ($2 IS NULL OR id < $2) \
             ORDER BY id DESC LIMIT $3"
        ))
        .bind(merchant_id)
        .bind(cursor)
        .bind(limit + 1)
        .fetch_all(&self.pool)
        .await?;
        let mut items = rows.iter().map(order_from).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|o| o.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    pub async fn payment_amounts(&self, payment_id: &str) -> Result<PaymentAmounts, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {AMOUNT_COLS} FROM payment_amounts WHERE payment_id = $1"
        ))
        .bind(payment_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("payment amounts", payment_id))?;
        amounts_from(&row)
    }

    /// Order, amounts, attempts, captures and refunds read in one transaction.
    pub async fn payment_details(
        &self,
        merchant_id: Option<&str>,
        payment_id: &str,
    ) -> Result<PaymentDetails, StoreError> {
        match self.backend {
            // PostgreSQL's READ COMMITTED gives each statement its own snapshot
            // inside a transaction too, so BEGIN and COMMIT would add two round
            // trips and no consistency.
            crate::Backend::Postgres => {
                let mut conn = self.pool.acquire().await?;
                details_on(&mut conn, merchant_id, payment_id).await
            }
            // SQLite's read transaction holds one snapshot for all three reads.
            crate::Backend::Sqlite => {
                let mut tx = self.pool.begin().await?;
                let details = details_on(&mut tx, merchant_id, payment_id).await?;
                // A read: no await point (it wrote nothing a kill could cut off).
                tx.commit().await?;
                Ok(details)
            }
        }
    }

    pub async fn list_attempts(&self, payment_id: &str) -> Result<Vec<PaymentAttempt>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ATTEMPT_COLS} FROM payment_attempts WHERE payment_id = $1 ORDER BY attempt_no"
        ))
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(attempt_from).collect()
    }

    pub async fn list_captures(&self, payment_id: &str) -> Result<Vec<Capture>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {CAPTURE_COLS} FROM captures WHERE payment_id = $1 ORDER BY created_at, id"
        ))
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(capture_from).collect()
    }

    pub async fn list_refunds(&self, payment_id: &str) -> Result<Vec<Refund>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {REFUND_COLS} FROM refunds WHERE payment_id = $1 ORDER BY created_at, id"
        ))
        .bind(payment_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(refund_from).collect()
    }

    pub async fn get_attempt(&self, attempt_id: &str) -> Result<PaymentAttempt, StoreError> {
        self.one(
            ATTEMPT_COLS,
            "payment_attempts",
            "id",
            attempt_id,
            "attempt",
            attempt_from,
        )
        .await
    }

    /// An attempt, its order and the order's amounts, in one statement (one
    /// snapshot): what a step of the attempt is decided from.
    pub async fn get_attempt_head(&self, attempt_id: &str) -> Result<AttemptHead, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let read = attempt_head_in(&mut conn, AttemptKey::Id, attempt_id, None)
            .await?
            .ok_or_else(|| StoreError::not_found("attempt", attempt_id))?;
        Ok(read.head)
    }

    pub async fn get_attempt_by_reference(
        &self,
        reference: &str,
    ) -> Result<PaymentAttempt, StoreError> {
        self.one(
            ATTEMPT_COLS,
            "payment_attempts",
            "reference",
            reference,
            "attempt",
            attempt_from,
        )
        .await
    }

    pub async fn get_capture(&self, capture_id: &str) -> Result<Capture, StoreError> {
        self.one(
            CAPTURE_COLS,
            "captures",
            "id",
            capture_id,
            "capture",
            capture_from,
        )
        .await
    }

    pub async fn get_capture_by_reference(&self, reference: &str) -> Result<Capture, StoreError> {
        self.one(
            CAPTURE_COLS,
            "captures",
            "reference",
            reference,
            "capture",
            capture_from,
        )
        .await
    }

    pub async fn get_refund(&self, refund_id: &str) -> Result<Refund, StoreError> {
        self.one(
            REFUND_COLS,
            "refunds",
            "id",
            refund_id,
            "refund",
            refund_from,
        )
        .await
    }

    pub async fn get_refund_by_reference(&self, reference: &str) -> Result<Refund, StoreError> {
        self.one(
            REFUND_COLS,
            "refunds",
            "reference",
            reference,
            "refund",
            refund_from,
        )
        .await
    }

    /// Non-terminal attempts whose `next_retry_time` has come, in scan order,
    /// after `cursor` (per-round cursors keep one slow row from starving the rest).
    /// Served by the partial index `payment_attempts_scan`.
    pub async fn due_attempts(
        &self,
        now: i64,
        limit: i64,
        cursor: Option<&ScanCursor>,
    ) -> Result<Vec<PaymentAttempt>, StoreError> {
        let rows = self
            .scan(ATTEMPT_COLS, PendingKind::Attempt, now, limit, cursor)
            .await?;
        rows.iter().map(attempt_from).collect()
    }

    /// Non-terminal refunds due for recovery (partial index `refunds_scan`).
    pub async fn due_refunds(
        &self,
        now: i64,
        limit: i64,
        cursor: Option<&ScanCursor>,
    ) -> Result<Vec<Refund>, StoreError> {
        let rows = self
            .scan(REFUND_COLS, PendingKind::Refund, now, limit, cursor)
            .await?;
        rows.iter().map(refund_from).collect()
    }

    /// Non-terminal captures due for recovery (partial index `captures_scan`).
    pub async fn due_captures(
        &self,
        now: i64,
        limit: i64,
        cursor: Option<&ScanCursor>,
    ) -> Result<Vec<Capture>, StoreError> {
        let rows = self
            .scan(CAPTURE_COLS, PendingKind::Capture, now, limit, cursor)
            .await?;
        rows.iter().map(capture_from).collect()
    }

    /// Scheduling bookkeeping after a recovery round that learned nothing new:
    /// the PSP was called now, one more query counted, next look `delay_ms`
    /// from now (the same instant, so the next look is never earlier than
    /// the backoff the policy counts from the last call). Not a state change;
    /// refused once the row is terminal.
    pub async fn reschedule_after(
        &self,
        kind: PendingKind,
        id: &str,
        delay_ms: i64,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let sql = format!(
            "UPDATE {} SET next_retry_time = $2, retry_count = retry_count + 1, \
                last_psp_call_at = $3 \
             WHERE id = $1 AND state NOT IN ({})",
            kind.table(),
            kind.terminal_states()
        );
        let done = sqlx::query(&sql)
            .bind(id)
            .bind(now.saturating_add(delay_ms.max(1)))
            .bind(now)
            .execute(&self.writer)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found("non-terminal row", id));
        }
        Ok(())
    }

    /// Record that a request for this attempt, capture or refund is about to
    /// go to the PSP (bookkeeping for the recovery backoff, not a state change).
    pub async fn note_psp_call(&self, kind: PendingKind, id: &str) -> Result<(), StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE {} SET last_psp_call_at = $2 WHERE id = $1",
            kind.table()
        ))
        .bind(id)
        .bind(self.now_ms())
        .execute(&self.writer)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::not_found(kind.entity(), id));
        }
        Ok(())
    }

    async fn scan(
        &self,
        cols: &str,
        kind: PendingKind,
        now: i64,
        limit: i64,
        cursor: Option<&ScanCursor>,
    ) -> Result<Vec<AnyRow>, StoreError> {
        // The predicate repeats the partial index's own text so both planners use it.
        let (table, terminal) = (kind.table(), kind.terminal_states());
        let sql = format!(
            "SELECT {cols} FROM {table} \
             WHERE state NOT IN ({terminal}) AND next_retry_time <= $1 \
               AND ($2 IS NULL OR next_retry_time > $2 OR (next_retry_time = $2 AND id > $3)) \
             ORDER BY next_retry_time, id LIMIT $4"
        );
        Ok(sqlx::query(&sql)
            .bind(now)
            .bind(cursor.map(|c| c.next_retry_time))
            .bind(cursor.map(|c| c.id.as_str()).unwrap_or(""))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    async fn one<T>(
        &self,
        cols: &str,
        table: &str,
        key_col: &str,
        key: &str,
        entity: &'static str,
        decode: fn(&AnyRow) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let row = sqlx::query(&format!("SELECT {cols} FROM {table} WHERE {key_col} = $1"))
            .bind(key)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found(entity, key))?;
        decode(&row)
    }
}

/// The three kinds of PSP-facing rows the recovery scanner looks after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingKind {
    Attempt,
    Refund,
    Capture,
}

impl PendingKind {
    fn table(self) -> &'static str {
        match self {
            PendingKind::Attempt => "payment_attempts",
            PendingKind::Refund => "refunds",
            PendingKind::Capture => "captures",
        }
    }

    fn entity(self) -> &'static str {
        match self {
            PendingKind::Attempt => "attempt",
            PendingKind::Refund => "refund",
            PendingKind::Capture => "capture",
        }
    }

    /// Must match the partial scan indexes' predicates.
    fn terminal_states(self) -> &'static str {
        match self {
            PendingKind::Attempt | PendingKind::Refund => "'SUCCEEDED', 'FAILED', 'CANCELED'",
            PendingKind::Capture => "'SUCCEEDED', 'FAILED'",
        }
    }
}

/// The order, its amounts and every child row, on one connection.
async fn details_on(
    conn: &mut AnyConnection,
    merchant_id: Option<&str>,
    payment_id: &str,
) -> Result<PaymentDetails, StoreError> {
    let DetailsHead {
        order,
        amounts,
        attempts,
        has_captures,
        has_refunds,
    } = details_head(conn, payment_id).await?;
    if merchant_id.is_some_and(|m| m != order.merchant_id) {
        return Err(StoreError::not_found("payment", payment_id));
    }
    let mut captures = Vec::new();
    if has_captures {
        captures = fetch_all(conn, CAPTURE_COLS, "captures", "created_at, id", payment_id)
            .await?
            .iter()
            .map(capture_from)
            .collect::<Result<_, _>>()?;
    }
    let mut refunds = Vec::new();
    if has_refunds {
        refunds = fetch_all(conn, REFUND_COLS, "refunds", "created_at, id", payment_id)
            .await?
            .iter()
            .map(refund_from)
            .collect::<Result<_, _>>()?;
    }
    Ok(PaymentDetails {
        order,
        amounts,
        attempts,
        captures,
        refunds,
    })
}

async fn fetch_all(
    conn: &mut AnyConnection,
    cols: &str,
    table: &str,
    order_by: &str,
    payment_id: &str,
) -> Result<Vec<AnyRow>, StoreError> {
    Ok(sqlx::query(&format!(
        "SELECT {cols} FROM {table} WHERE payment_id = $1 ORDER BY {order_by}"
    ))
    .bind(payment_id)
    .fetch_all(&mut *conn)
    .await?)
}

fn refusal_error<S>(
    order: &PaymentOrder,
    latest: Option<&PaymentAttempt>,
    decision: &Decision<S>,
) -> StoreError {
    match (decision, latest) {
        (Decision::Reject(RejectReason::AttemptInFlight(state)), Some(attempt)) => {
            StoreError::AttemptInFlight {
                payment_id: order.id.clone(),
                attempt_id: attempt.id.clone(),
                state: state.to_string(),
            }
        }
        _ => StoreError::InvalidState {
            entity: "payment",
            id: order.id.clone(),
            state: order.state.to_string(),
            reason: decision.explain(),
        },
    }
}

/// Attempt `attempt_no` of `order` at `account`, in state CREATED, with its
/// stable reference.
fn new_attempt(
    order: &PaymentOrder,
    account: &ConnectorCredentials,
    new: &NewAttempt,
    attempt_no: i64,
    id: String,
    at: crate::ids::At<'_>,
) -> PaymentAttempt {
    let now = at.now;
    PaymentAttempt {
        id,
        payment_id: order.id.clone(),
        attempt_no,
        reference: ids::attempt_reference(&order.id, attempt_no),
        adapter: account.adapter.clone(),
        connector_account_id: account.connector_account_id.clone(),
        psp_reference: None,
        amount: order.amount,
        capture_mode: order.capture_mode,
        payment_method_token: new
            .payment_method_token
            .clone()
            .or_else(|| order.payment_method_token.clone()),
        payment_method_type: new.payment_method_type.clone(),
        state: AttemptState::Created,
        version: 0,
        next_retry_time: new.next_retry_time,
        retry_count: 0,
        last_psp_call_at: None,
        timeout_at: new.timeout_at,
        expires_at: new.expires_at,
        last_event: None,
        next_action_url: None,
        failure: None,
        authorized_at: None,
        void_requested_at: None,
        created_at: now,
        updated_at: now,
        adapter_pin: None,
    }
}

/// A new attempt's two history rows: the order's move and the attempt's creation.
/// The reason an attempt's creation is recorded with.
fn created_reason(new: &NewAttempt) -> String {
    match &new.route_reason {
        Some(route) => {
            format!("attempt created with a stable reference before any PSP call; routed: {route}")
        }
        None => "attempt created with a stable reference before any PSP call".to_owned(),
    }
}

struct Started<'a> {
    order: &'a PaymentOrder,
    attempt: &'a PaymentAttempt,
    new_state: OrderState,
    rule: &'a str,
    reason: &'a str,
}

impl<'a> Started<'a> {
    fn history(&self, provenance: &'a Provenance) -> [NewHistory<'a>; 2] {
        let (order, attempt) = (self.order, self.attempt);
        [
            NewHistory {
                payment_id: &order.id,
                aggregate_type: "order",
                aggregate_id: &order.id,
                from_state: Some(order.state.as_str()),
                to_state: self.new_state.as_str(),
                from_version: Some(order.version),
                to_version: order.version + 1,
                event_kind: command_kind(OrderCommand::StartAttempt),
                evidence_source: "command",
                decision: "applied",
                reason: self.rule,
                provenance: Some(provenance),
                ..NewHistory::default()
            },
            NewHistory {
                payment_id: &order.id,
                aggregate_type: "attempt",
                aggregate_id: &attempt.id,
                to_state: AttemptState::Created.as_str(),
                to_version: 0,
                event_kind: command_kind(OrderCommand::StartAttempt),
                evidence_source: "command",
                amount_minor: Some(attempt.amount.amount_minor),
                currency: Some(attempt.amount.currency.as_str()),
                decision: "applied",
                reason: self.reason,
                provenance: Some(provenance),
                ..NewHistory::default()
            },
        ]
    }
}

/// The order's CAS to `new_state` for a new attempt: false when another
/// writer moved its version first.
async fn bump_order(
    tx: &mut Conn,
    order: &PaymentOrder,
    new_state: OrderState,
    now: i64,
) -> Result<bool, StoreError> {
    let bumped = sqlx::query(
        "UPDATE payment_orders SET state = $3, version = version + 1, updated_at = $4 \
         WHERE id = $1 AND version = $2",
    )
    .bind(&order.id)
    .bind(order.version)
    .bind(new_state.as_str())
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(bumped.rows_affected() == 1)
}

const INSERT_ORDER: &str = "INSERT INTO payment_orders (id, merchant_id, merchant_order_no, \
    amount_minor, currency, capture_mode, state, version, payment_method_token, return_url, \
    description, metadata_json, biz_key, fulfillment_deadline, fulfillment_mode, fulfillment_state, \
    manual_review, created_at, updated_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, 0, $17, $18)";
const INSERT_AMOUNTS: &str =
    "INSERT INTO payment_amounts (payment_id, currency, amount_minor) VALUES ($1, $5, $4)";
/// Parameters of [`INSERT_ORDER`] (and of [`INSERT_AMOUNTS`], which uses three of them).
const ORDER_PARAMS: usize = 18;

/// Binds [`INSERT_ORDER`]'s parameters: the order as it is, updated at `updated_at`.
fn bind_order<'q>(query: AnyQuery<'q>, order: &'q PaymentOrder, updated_at: i64) -> AnyQuery<'q> {
    query
        .bind(&order.id)
        .bind(&order.merchant_id)
        .bind(&order.merchant_order_no)
        .bind(order.amount.amount_minor)
        .bind(order.amount.currency.as_str())
        .bind(order.capture_mode.as_str())
        .bind(order.state.as_str())
        .bind(order.version)
        .bind(order.payment_method_token.as_deref())
        .bind(order.return_url.as_deref())
        .bind(order.description.as_deref())
        .bind(order.metadata.to_string())
        .bind(order.fulfillment.biz_key.as_deref())
        .bind(order.fulfillment.deadline)
        .bind(order.fulfillment.mode.as_deref())
        .bind(order.fulfillment.state.as_deref())
        .bind(order.created_at)
        .bind(updated_at)
}

async fn insert_order(tx: &mut Conn, order: &PaymentOrder) -> Result<(), StoreError> {
    bind_order(sqlx::query(INSERT_ORDER), order, order.created_at)
        .execute(&mut *tx)
        .await?;
    // The amounts' three parameters are the order's first, fifth and fourth.
    bind_order(sqlx::query(INSERT_AMOUNTS), order, order.created_at)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// An attempt's `INSERT`, its parameters numbered after the first `offset`.
fn insert_attempt_sql(offset: usize) -> String {
    let values: Vec<String> = [
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 14, 15, 16, 18, 17, 19, 20, 21, 22,
    ]
    .iter()
    .map(|&p| match p {
        0 => "0".to_owned(), // retry_count
        p => format!("${}", offset + p),
    })
    .collect();
    format!(
        "INSERT INTO payment_attempts (id, payment_id, attempt_no, reference, adapter, \
            connector_account_id, amount_minor, currency, capture_mode, payment_method_token, \
            state, version, next_retry_time, retry_count, timeout_at, expires_at, created_at, \
            updated_at, payment_method_type, last_psp_call_at, last_event_identity, \
            adapter_version, adapter_digest) VALUES ({})",
        values.join(", ")
    )
}

/// Parameters of an attempt's insert ([`bind_attempt`] binds them in order).
const ATTEMPT_PARAMS: usize = 22;

/// Binds an attempt's insert: the row as it is, a first send's record
/// (`door::fresh`) included.
fn bind_attempt<'q>(query: AnyQuery<'q>, a: &'q PaymentAttempt) -> AnyQuery<'q> {
    // The text the door writes for the same identity (`door::identity_json`).
    let last_event = (a.last_event.as_ref()).and_then(|e| serde_json::to_string(e).ok());
    let pin = a.adapter_pin.as_ref();
    query
        .bind(&a.id)
        .bind(&a.payment_id)
        .bind(a.attempt_no)
        .bind(&a.reference)
        .bind(&a.adapter)
        .bind(&a.connector_account_id)
        .bind(a.amount.amount_minor)
        .bind(a.amount.currency.as_str())
        .bind(a.capture_mode.as_str())
        .bind(a.payment_method_token.as_deref())
        .bind(a.state.as_str())
        .bind(a.version)
        .bind(a.next_retry_time)
        .bind(a.timeout_at)
        .bind(a.expires_at)
        .bind(a.created_at)
        .bind(a.payment_method_type.as_deref())
        .bind(a.updated_at)
        .bind(a.last_psp_call_at)
        .bind(last_event)
        .bind(pin.map(|p| p.version.as_str()))
        .bind(pin.map(|p| p.digest.as_str()))
}

/// The statement of [`Store::insert_plainly`]: the order, its amounts, the
/// attempt, `history_rows` history rows in one insert that returns their
/// ids, then the `outbox` writes of a first send's record.
fn plain_sql(backend: Backend, history_rows: usize, outbox: &[Write]) -> String {
    let attempt_sql = insert_attempt_sql(ORDER_PARAMS);
    let history_sql = history::append_sql(history_rows, ORDER_PARAMS + ATTEMPT_PARAMS);
    let mut offset = ORDER_PARAMS + ATTEMPT_PARAMS + history_rows * history::HISTORY_COLUMNS;
    let mut writes = vec![
        INSERT_ORDER.to_owned(),
        INSERT_AMOUNTS.to_owned(),
        attempt_sql,
        format!("{history_sql} RETURNING id"),
    ];
    for write in outbox {
        writes.push(crate::door::batch::renumber(&write.sql, offset));
        offset += write.binds.len();
    }
    match backend {
        Backend::Postgres => {
            let ctes: Vec<String> = (writes.iter().enumerate())
                .map(|(i, sql)| format!("w{i} AS ({sql})"))
                .collect();
            format!("WITH {} SELECT id FROM w3", ctes.join(", "))
        }
        // The same statements as a script, one round trip to the write
        // connection's worker, in the caller's transaction (`batch.rs`).
        Backend::Sqlite => writes.join(";\n"),
    }
}

async fn insert_attempt(tx: &mut Conn, a: &PaymentAttempt) -> Result<(), StoreError> {
    bind_attempt(sqlx::query(&insert_attempt_sql(0)), a)
        .execute(&mut *tx)
        .await?;
    Ok(())
}
