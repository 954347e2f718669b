//! The tenant boundary at the door (architecture invariant 8): an event that
//! came through one connector account never touches another account's
//! attempt, capture or refund, whatever reference it names.

use crate::common::*;
use sluice_core::{CaptureMode, EventKind, EvidenceSource, PaymentEvent};
use sluice_store::{
    AccountScope, ApplyEvent, CaptureRequest, EventTarget, InboxInsert, NewInboxEvent,
    RefundRequest, Store, StoreError,
};

/// Merchant A's money in every open shape, and the references naming it.
struct Victim {
    payment_ids: Vec<String>,
    /// (field of the event, value): every way an event can name A's aggregates.
    names: Vec<(&'static str, String)>,
}

async fn victim(store: &Store, a: &Fixture) -> Victim {
    let (paid, attempt) = a.succeeded(store, "A-PAID", 100).await;
    let refund = store
        .reserve_refund(
            &RefundRequest {
                payment_id: paid.id.clone(),
                merchant_id: None,
                amount: eur(40),
                reason: None,
                idempotency_key: None,
            },
            &sys(),
        )
        .await
        .unwrap();
    let mut pending = event(EventKind::RefundProcessing, EvidenceSource::SyncResponse);
    pending.psp_reference = Some("re_A".into());
    store
        .apply_event(&on_refund(&refund.record.reference, pending))
        .await
        .unwrap();

    let (held, held_attempt) = a.submitted(store, "A-HELD", 100, CaptureMode::Manual).await;
    let mut authorized = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
    authorized.psp_reference = Some("pi_A-HELD".into());
    store
        .apply_event(&on_attempt(&held_attempt, authorized))
        .await
        .unwrap();
    let capture = store
        .reserve_capture(
            &CaptureRequest {
                payment_id: held.id.clone(),
                merchant_id: None,
                amount: eur(60),
                idempotency_key: None,
            },
            &sys(),
        )
        .await
        .unwrap();

    let (waiting, waiting_attempt) = a
        .submitted(store, "A-WAIT", 100, CaptureMode::Automatic)
        .await;
    let mut action = event(
        EventKind::CustomerActionRequired,
        EvidenceSource::SyncResponse,
    );
    action.psp_reference = Some("pi_A-WAIT".into());
    store
        .apply_event(&on_attempt(&waiting_attempt, action))
        .await
        .unwrap();

    Victim {
        payment_ids: vec![paid.id, held.id, waiting.id],
        names: vec![
            ("attempt_reference", attempt.reference.clone()),
            ("attempt_reference", held_attempt.reference.clone()),
            ("attempt_reference", waiting_attempt.reference.clone()),
            ("action_reference", refund.record.reference.clone()),
            ("action_reference", capture.record.reference.clone()),
            ("psp_reference", "pi_A-PAID".into()),
            ("psp_reference", "pi_A-HELD".into()),
            ("psp_reference", "pi_A-WAIT".into()),
            ("psp_reference", "re_A".into()),
            ("psp_payment_reference", "pi_A-PAID".into()),
            ("psp_payment_reference", "pi_A-WAIT".into()),
        ],
    }
}

/// Everything about A's payments that an event could change.
async fn state_of(store: &Store, victim: &Victim) -> Vec<String> {
    let mut seen = Vec::new();
    for id in &victim.payment_ids {
        let details = store.payment_details(None, id).await.unwrap();
        let amounts = store.payment_amounts(id).await.unwrap();
        let history = store.timeline(id).await.unwrap().len();
        seen.push(format!("{details:?} {amounts:?} history={history}"));
    }
    seen
}

fn named(kind: EventKind, field: &str, value: &str, n: usize) -> PaymentEvent {
    let mut ev = event(kind, EvidenceSource::Webhook);
    ev.provider_event_id = Some(format!("evt_hostile_{n}"));
    ev.amount = Some(eur(100));
    let slot = match field {
        "attempt_reference" => &mut ev.attempt_reference,
        "action_reference" => &mut ev.action_reference,
        "psp_reference" => &mut ev.psp_reference,
        _ => &mut ev.psp_payment_reference,
    };
    *slot = Some(value.to_owned());
    ev
}

fn through(scope: &AccountScope, target: Option<&str>, event: PaymentEvent) -> ApplyEvent {
    let target = match target {
        Some(psp) => EventTarget::PspReference {
            scope: scope.clone(),
            psp_reference: psp.into(),
        },
        None => EventTarget::FromEvent {
            scope: scope.clone(),
        },
    };
    ApplyEvent {
        target,
        event,
        provenance: adapter_provenance(),
        inbox_id: None,
        next_retry_time: None,
    }
}

dual_test! {
    async fn no_event_kind_through_another_account_changes_any_of_a_merchants_aggregates_by_any_reference(&db) {
        let store = &db.store;
        let a = Fixture::new(store, "Acme").await;
        let b = Fixture::new(store, "Acme").await;
        let victim = victim(store, &a).await;
        let before = state_of(store, &victim).await;
        let hostile = b.scope();
        let mut tried = 0;
        for kind in EventKind::ALL {
            for (field, value) in &victim.names {
                let psp_target = field.starts_with("psp").then_some(value.as_str());
                for target in [None, psp_target] {
                    tried += 1;
                    let input = through(&hostile, target, named(*kind, field, value, tried));
                    let result = store.apply_event(&input).await;
                    assert!(
                        matches!(result, Err(StoreError::OutOfScope { .. } | StoreError::NotFound { .. })),
                        "{kind} naming {field}={value} through B's account: {result:?}"
                    );
                }
            }
        }
        assert!(tried > 200, "{tried} hostile events tried");
        assert_eq!(state_of(store, &victim).await, before, "A's payments are untouched");
    }
}

dual_test! {
    async fn an_event_naming_another_accounts_reference_is_refused_as_out_of_scope_not_as_missing(&db) {
        let store = &db.store;
        let a = Fixture::new(store, "Acme").await;
        let b = Fixture::new(store, "Acme").await;
        let (_, attempt) = a.succeeded(store, "A-1", 100).await;
        let by_reference = named(EventKind::PaymentFailed, "attempt_reference", &attempt.reference, 1);
        let refused = store.apply_event(&through(&b.scope(), None, by_reference)).await;
        assert!(matches!(&refused, Err(StoreError::OutOfScope { entity: "attempt", account, .. }) if *account == b.account.id), "{refused:?}");
        let by_psp = named(EventKind::PaymentCanceled, "psp_reference", "pi_A-1", 2);
        let refused = store.apply_event(&through(&b.scope(), Some("pi_A-1"), by_psp)).await;
        assert!(matches!(refused, Err(StoreError::OutOfScope { .. })), "{refused:?}");

        // The same event through A's own account is applied as usual.
        let chargeback = named(EventKind::Chargeback, "psp_reference", "pi_A-1", 3);
        let applied = store.apply_event(&through(&a.scope(), None, chargeback)).await.unwrap();
        assert_eq!(applied.aggregate_id, attempt.id);
    }
}

dual_test! {
    /// The door reads an attempt named by our own reference together with its
    /// payment and the webhook's inbox row; a hostile tenant's queued webhook
    /// naming A's attempt is refused on the attempt's account, before the inbox
    /// row is looked at, and neither A's payment nor B's inbox row moves.
    async fn a_queued_webhook_naming_another_accounts_attempt_reference_is_refused_before_its_inbox_row_is_read(&db) {
        let store = &db.store;
        let a = Fixture::new(store, "Acme").await;
        let b = Fixture::new(store, "Acme").await;
        let (paid, attempt) = a.submitted(store, "A-Q1", 100, CaptureMode::Automatic).await;
        let before = store.payment_details(None, &paid.id).await.unwrap();
        let hostile = named(EventKind::PaymentSucceeded, "attempt_reference", &attempt.reference, 1);
        let queued = store
            .inbox_insert(&NewInboxEvent {
                adapter: b.scope().adapter,
                connector_account_id: b.account.id.clone(),
                provider_event_id: "evt_hostile_1".into(),
                payload_digest: "sha256:hostile".into(),
                event: serde_json::to_value(&hostile).unwrap(),
                raw_body_id: None,
            })
            .await
            .unwrap();
        let InboxInsert::Inserted { id: inbox_id } = queued else { panic!("{queued:?}") };
        for inbox in [Some(inbox_id.clone()), Some("inbox_that_does_not_exist".to_owned())] {
            let input = ApplyEvent { inbox_id: inbox, ..through(&b.scope(), None, hostile.clone()) };
            let refused = store.apply_event(&input).await;
            assert!(
                matches!(&refused, Err(StoreError::OutOfScope { entity: "attempt", account, .. }) if *account == b.account.id),
                "{refused:?}"
            );
        }
        assert_eq!(store.payment_details(None, &paid.id).await.unwrap(), before, "A's payment is untouched");
        assert_eq!(store.inbox_get(&inbox_id).await.unwrap().status, "pending", "B's row is not processed");

        // Through A's own account the same event, from its own inbox row, applies.
        let own = ApplyEvent { inbox_id: None, ..through(&a.scope(), None, hostile) };
        let applied = store.apply_event(&own).await.unwrap();
        assert_eq!(applied.aggregate_id, attempt.id);
        assert_eq!(applied.to_state, "SUCCEEDED");
    }
}

dual_test! {
    async fn a_capture_reference_of_another_payment_is_not_applied_to_the_named_attempt(&db) {
        let store = &db.store;
        let a = Fixture::new(store, "Acme").await;
        let (first, first_attempt) = a.submitted(store, "A-C1", 100, CaptureMode::Manual).await;
        let (second, second_attempt) = a.submitted(store, "A-C2", 100, CaptureMode::Manual).await;
        for (attempt, psp) in [(&first_attempt, "pi_C1"), (&second_attempt, "pi_C2")] {
            let mut authorized = event(EventKind::PaymentAuthorized, EvidenceSource::SyncResponse);
            authorized.psp_reference = Some(psp.into());
            store.apply_event(&on_attempt(attempt, authorized)).await.unwrap();
        }
        let capture = store
            .reserve_capture(&CaptureRequest { payment_id: second.id.clone(), merchant_id: None, amount: eur(60), idempotency_key: None }, &sys())
            .await
            .unwrap();
        // Names the first payment's attempt but the second payment's capture.
        let mut mixed = named(EventKind::PaymentCaptured, "attempt_reference", &first_attempt.reference, 1);
        mixed.action_reference = Some(capture.record.reference.clone());
        let refused = store.apply_event(&through(&a.scope(), None, mixed)).await;
        assert!(matches!(refused, Err(StoreError::NotFound { entity: "capture", .. })), "{refused:?}");
        assert_eq!(store.payment_amounts(&first.id).await.unwrap().captured_minor, 0);
        assert_eq!(store.payment_amounts(&second.id).await.unwrap().captured_minor, 0);
    }
}

dual_test! {
    /// A hostile or mistaken answer may put another tenant's PSP reference on
    /// the asking tenant's own attempt; each tenant's events still reach only
    /// its own attempt, and a third account's are refused.
    async fn a_psp_reference_known_in_two_accounts_resolves_within_the_events_own_account(&db) {
        let store = &db.store;
        let a = Fixture::new(store, "Acme").await;
        let b = Fixture::new(store, "Acme").await;
        let c = Fixture::new(store, "Acme").await;
        let (_, a_attempt) = a.submitted(store, "SH-A", 100, CaptureMode::Automatic).await;
        let (_, b_attempt) = b.submitted(store, "SH-B", 100, CaptureMode::Automatic).await;
        for attempt in [&a_attempt, &b_attempt] {
            let mut processing = event(EventKind::PaymentProcessing, EvidenceSource::SyncResponse);
            processing.psp_reference = Some("pi_SHARED".into());
            store.apply_event(&on_attempt(attempt, processing)).await.unwrap();
        }
        for (fixture, attempt) in [(&a, &a_attempt), (&b, &b_attempt)] {
            let ev = named(EventKind::PaymentSucceeded, "psp_reference", "pi_SHARED", 1);
            let applied = store.apply_event(&through(&fixture.scope(), None, ev)).await.unwrap();
            assert_eq!(applied.aggregate_id, attempt.id);
        }
        let ev = named(EventKind::PaymentFailed, "psp_reference", "pi_SHARED", 2);
        let refused = store.apply_event(&through(&c.scope(), None, ev)).await;
        assert!(matches!(refused, Err(StoreError::OutOfScope { .. })), "{refused:?}");
    }
}
