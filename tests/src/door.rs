//! Store-level fixtures: a merchant with one connector account, and payments
//! brought into a state through the store's one door (so history and outbox
//! rows are real), for the tests of the store and of what reads it.

use sluice_core::{
    CaptureMode, Currency, EventKind, EvidenceSource, Failure, FailureCategory, Money, PaymentEvent,
};
use sluice_store::{
    AccountScope, ApplyEvent, ConnectorAccount, EventTarget, Merchant, NewAttempt,
    NewConnectorAccount, NewPayment, PaymentAttempt, PaymentOrder, Provenance, Store,
};

/// The adapter name the fixtures' connector accounts carry.
pub const FIXTURE_ADAPTER: &str = "sandbox";

pub fn eur(amount_minor: i64) -> Money {
    Money {
        amount_minor,
        currency: Currency::parse("EUR").expect("EUR is an ISO 4217 code"),
    }
}

/// A system actor's provenance.
pub fn sys() -> Provenance {
    Provenance::actor("system:test").with_trace("trace-test")
}

/// The provenance of an event an adapter normalised.
pub fn adapter_provenance() -> Provenance {
    Provenance::adapter(FIXTURE_ADAPTER, "0.1.0", "sha256:abc").with_trace("trace-webhook")
}

/// An event of `kind` with the raw status an adapter would report.
pub fn event(kind: EventKind, evidence: EvidenceSource) -> PaymentEvent {
    let mut ev = PaymentEvent::new(kind, evidence);
    ev.raw_status = kind.as_str().to_lowercase();
    ev
}

/// A card decline.
pub fn declined(evidence: EvidenceSource) -> PaymentEvent {
    let mut ev = event(EventKind::PaymentFailed, evidence);
    ev.failure = Some(Failure {
        category: FailureCategory::Declined,
        code: "card_declined".into(),
        message: "Your card was declined.".into(),
    });
    ev
}

fn on(target: EventTarget, event: PaymentEvent) -> ApplyEvent {
    ApplyEvent {
        target,
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

pub fn on_attempt(attempt: &PaymentAttempt, event: PaymentEvent) -> ApplyEvent {
    on(EventTarget::Attempt(attempt.reference.clone()), event)
}

pub fn on_refund(reference: &str, event: PaymentEvent) -> ApplyEvent {
    on(EventTarget::Refund(reference.to_owned()), event)
}

pub fn on_capture(reference: &str, event: PaymentEvent) -> ApplyEvent {
    on(EventTarget::Capture(reference.to_owned()), event)
}

/// A merchant with one connector account on adapter [`FIXTURE_ADAPTER`].
pub struct Shop {
    pub merchant: Merchant,
    pub account: ConnectorAccount,
}

impl Shop {
    pub async fn new(store: &Store, name: &str) -> Shop {
        let merchant = store.create_merchant(name).await.expect("merchant");
        let account = store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant.id.clone(),
                adapter: FIXTURE_ADAPTER.into(),
                label: "main".into(),
                config: serde_json::json!({"base_url": "http://127.0.0.1:9"}),
                secrets: serde_json::json!({"api_key": "sk_test_secret"}),
            })
            .await
            .expect("connector account");
        Shop { merchant, account }
    }

    /// The tenant boundary of events that come through this shop's account.
    pub fn scope(&self) -> AccountScope {
        AccountScope::new(&self.account.id, FIXTURE_ADAPTER)
    }

    pub async fn payment(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
    ) -> PaymentOrder {
        let new = new_payment(&self.merchant.id, order_no, amount, mode);
        store.create_payment(&new, &sys()).await.expect("payment")
    }

    pub async fn attempt(&self, store: &Store, payment: &PaymentOrder) -> PaymentAttempt {
        let new = NewAttempt {
            payment_id: payment.id.clone(),
            connector_account_id: self.account.id.clone(),
            ..NewAttempt::default()
        };
        store.create_attempt(&new, &sys()).await.expect("attempt")
    }

    /// A payment with one attempt, already submitted to the PSP.
    pub async fn submitted(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
        mode: CaptureMode,
    ) -> (PaymentOrder, PaymentAttempt) {
        let payment = self.payment(store, order_no, amount, mode).await;
        let attempt = self.attempt(store, &payment).await;
        let submitted = event(EventKind::AttemptSubmitted, EvidenceSource::SyncResponse);
        store
            .apply_event(&on_attempt(&attempt, submitted))
            .await
            .expect("submitted");
        (payment, attempt)
    }

    /// A succeeded automatic-capture payment of `amount` (captured = amount).
    pub async fn succeeded(
        &self,
        store: &Store,
        order_no: &str,
        amount: i64,
    ) -> (PaymentOrder, PaymentAttempt) {
        let (payment, attempt) = self
            .submitted(store, order_no, amount, CaptureMode::Automatic)
            .await;
        let mut ev = event(EventKind::PaymentSucceeded, EvidenceSource::SyncResponse);
        ev.psp_reference = Some(format!("pi_{order_no}"));
        store
            .apply_event(&on_attempt(&attempt, ev))
            .await
            .expect("succeeded");
        (payment, attempt)
    }
}

/// A card payment of `merchant_id` in EUR, without fulfillment or metadata.
pub fn new_payment(
    merchant_id: &str,
    order_no: &str,
    amount: i64,
    mode: CaptureMode,
) -> NewPayment {
    NewPayment {
        merchant_id: merchant_id.to_owned(),
        merchant_order_no: order_no.into(),
        amount: eur(amount),
        capture_mode: mode,
        payment_method_token: Some("pm_card_visa".into()),
        return_url: None,
        description: None,
        metadata: serde_json::json!({}),
        fulfillment: Default::default(),
    }
}

/// Count rows with a raw query (tests only read raw; they never write state raw
/// except to prove the database refuses it).
pub async fn count(store: &Store, sql: &str, arg: &str) -> i64 {
    use sqlx::Row;
    let row = sqlx::query(sql)
        .bind(arg)
        .fetch_one(store.pool())
        .await
        .expect("count query");
    row.try_get::<i64, _>(0).expect("count")
}
