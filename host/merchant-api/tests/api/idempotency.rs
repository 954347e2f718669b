//! `Idempotency-Key`: replay byte for byte, mismatch, in use, scoping, pruning.

use crate::common::*;
use serde_json::json;
use sluice_merchant_api::idempotency::fingerprint;
use sluice_store::IdempotencyBegin;

dual_test! {
    async fn a_retry_with_the_same_key_replays_the_first_response_byte_for_byte(&gw) {
        let m = gw.merchant("Acme").await;
        let body = payment_body("order-1", 500);
        let first = gw.post_idem(&m.key, "key-1", "/v1/payments", &body).await.expect(201);
        assert!(first.headers.get("idempotent-replayed").is_none());
        // Without the key the same create would now answer 200 (existing payment):
        // the 201 below proves the stored response is replayed, not recomputed.
        gw.db.clock.advance(5_000);
        let retry = gw.post_idem(&m.key, "key-1", "/v1/payments", &body).await;
        assert_eq!(retry.status, 201);
        assert_eq!(retry.bytes, first.bytes, "byte for byte");
        assert_eq!(retry.headers.get("idempotent-replayed").unwrap(), "true");
        assert_eq!(retry.headers.get("content-type").unwrap(), "application/json");
        // Key order and whitespace do not make it another request.
        let reordered = serde_json::to_string_pretty(&body).unwrap();
        let again = gw
            .send(
                gw.http.post(gw.url("/v1/payments"))
                    .header("authorization", format!("Bearer {}", m.key))
                    .header("content-type", "application/json")
                    .header("idempotency-key", "key-1")
                    .body(reordered),
            )
            .await;
        assert_eq!(again.bytes, first.bytes);
        assert_eq!(gw.count("payment_orders").await, 1);
        let without_key = gw.post(&m.key, "/v1/payments", &body).await;
        assert_eq!(without_key.status, 200);
    }
}

dual_test! {
    async fn an_error_raised_after_execution_began_is_stored_and_replayed(&gw) {
        let m = gw.merchant("Acme").await;
        gw.post(&m.key, "/v1/payments", &payment_body("order-1", 500)).await.expect(201);
        let conflicting = payment_body("order-1", 999);
        let first = gw.post_idem(&m.key, "key-c", "/v1/payments", &conflicting).await;
        first.expect_error(409, "merchant_order_no_conflict");
        let retry = gw.post_idem(&m.key, "key-c", "/v1/payments", &conflicting).await;
        assert_eq!((retry.status, &retry.bytes), (409, &first.bytes));
        assert_eq!(retry.headers.get("idempotent-replayed").unwrap(), "true");
    }
}

dual_test! {
    async fn the_same_key_with_other_parameters_is_an_idempotency_error(&gw) {
        let m = gw.merchant("Acme").await;
        let first = gw.post_idem(&m.key, "key-1", "/v1/payments", &payment_body("order-1", 500)).await.expect(201);
        let other = gw.post_idem(&m.key, "key-1", "/v1/payments", &payment_body("order-2", 500)).await;
        let error = other.expect_error(400, "idempotency_key_reused");
        assert_eq!(error["type"], "idempotency_error");
        assert_eq!(gw.count("payment_orders").await, 1, "the second request did not run");
        // The stored response is untouched.
        let retry = gw.post_idem(&m.key, "key-1", "/v1/payments", &payment_body("order-1", 500)).await;
        assert_eq!(retry.bytes, first.bytes);
    }
}

dual_test! {
    async fn the_same_key_while_the_first_request_runs_is_409_in_use_until_its_lease_ends(&gw) {
        let m = gw.merchant("Acme").await;
        let body = payment_body("order-1", 500);
        // Another instance is running this very request: it holds the key.
        let held = gw
            .store()
            .idempotency_begin(&m.id, "POST /v1/payments", "key-busy", &fingerprint("/v1/payments", None, body.to_string().as_bytes()), 60_000)
            .await
            .unwrap();
        assert_eq!(held, IdempotencyBegin::Started);
        let busy = gw.post_idem(&m.key, "key-busy", "/v1/payments", &body).await;
        let error = busy.expect_error(409, "idempotency_key_in_use");
        assert_eq!(error["type"], "idempotency_error");
        assert_eq!(gw.count("payment_orders").await, 0);
        // The holder crashed: after its lease a retry takes the key over and runs.
        gw.db.clock.advance(60_001);
        gw.post_idem(&m.key, "key-busy", "/v1/payments", &body).await.expect(201);
        let replay = gw.post_idem(&m.key, "key-busy", "/v1/payments", &body).await.expect(201);
        assert_eq!(replay.headers.get("idempotent-replayed").unwrap(), "true");
    }
}

dual_test! {
    async fn keys_are_scoped_to_the_merchant_and_the_endpoint(&gw) {
        let acme = gw.merchant("Acme").await;
        let globex = gw.merchant("Globex").await;
        let body = payment_body("order-1", 500);
        let a = gw.post_idem(&acme.key, "shared", "/v1/payments", &body).await.expect(201).json();
        let b = gw.post_idem(&globex.key, "shared", "/v1/payments", &body).await.expect(201).json();
        assert_ne!(a["id"], b["id"], "another merchant's key is another key");
        assert_eq!(gw.count("payment_orders").await, 2);
    }
}

dual_test! {
    async fn a_request_refused_before_execution_does_not_burn_its_key(&gw) {
        let m = gw.merchant("Acme").await;
        let mut bad = payment_body("order-1", 500);
        bad["currency"] = json!("XYZ");
        gw.post_idem(&m.key, "key-fix", "/v1/payments", &bad).await.expect_error(400, "currency_unsupported");
        gw.post_idem(&m.key, "key-fix", "/v1/payments", &payment_body("order-1", 500)).await.expect(201);
        gw.post_idem(&m.key, "   ", "/v1/payments", &payment_body("order-2", 500))
            .await
            .expect_error(400, "idempotency_key_invalid");
        gw.post_idem(&m.key, &"k".repeat(256), "/v1/payments", &payment_body("order-2", 500))
            .await
            .expect_error(400, "idempotency_key_invalid");
        assert_eq!(gw.count("payment_orders").await, 1);
    }
}

dual_test! {
    async fn keys_older_than_a_day_are_pruned_and_younger_ones_kept(&gw) {
        let m = gw.merchant("Acme").await;
        gw.post_idem(&m.key, "old", "/v1/payments", &payment_body("order-1", 500)).await.expect(201);
        gw.db.clock.advance(23 * 3600 * 1000);
        gw.post_idem(&m.key, "young", "/v1/payments", &payment_body("order-2", 500)).await.expect(201);
        gw.db.clock.advance(3600 * 1000 + 1);
        let pruned = sluice_merchant_api::prune_idempotency_keys(gw.store(), sluice_merchant_api::IDEMPOTENCY_KEY_TTL)
            .await
            .unwrap();
        assert_eq!(pruned, 1);
        assert_eq!(gw.count("idempotency_keys").await, 1);
        // The pruned key is free again: the request runs anew (the payment exists: 200).
        gw.post_idem(&m.key, "old", "/v1/payments", &payment_body("order-1", 500)).await.expect(200);
    }
}

/// A refund or capture request, for the crash-and-retry tests.
#[derive(Clone, Copy, Debug)]
enum MoneyMove {
    Refund,
    Capture,
}

/// How far the first run got before the process died, its key left in progress.
#[derive(Clone, Copy, Debug)]
enum DiedAfter {
    /// The amount was reserved (the row exists, CREATED); nothing was sent.
    Reservation,
    /// The PSP did it; the response was never stored.
    PspCall,
}

impl MoneyMove {
    fn capture_mode(self) -> &'static str {
        match self {
            MoneyMove::Refund => "automatic",
            MoneyMove::Capture => "manual",
        }
    }

    fn path(self, payment_id: &str) -> String {
        match self {
            MoneyMove::Refund => format!("/v1/payments/{payment_id}/refunds"),
            MoneyMove::Capture => format!("/v1/payments/{payment_id}/capture"),
        }
    }

    fn endpoint(self) -> &'static str {
        match self {
            MoneyMove::Refund => "POST /v1/payments/{id}/refunds",
            MoneyMove::Capture => "POST /v1/payments/{id}/capture",
        }
    }

    /// What the first run did before it died, through the store and
    /// orchestrator APIs the handler uses.
    async fn first_run(
        self,
        gw: &Gateway,
        m: &TestMerchant,
        payment_id: &str,
        amount: i64,
        key: &str,
        died: DiedAfter,
    ) {
        let money = sluice_core::Money {
            amount_minor: amount,
            currency: sluice_core::Currency::parse("EUR").unwrap(),
        };
        let key = Some(key.to_owned());
        match (self, died) {
            (MoneyMove::Refund, DiedAfter::Reservation) => {
                let request = sluice_store::RefundRequest {
                    payment_id: payment_id.into(),
                    merchant_id: Some(m.id.clone()),
                    amount: money,
                    reason: None,
                    idempotency_key: key,
                };
                gw.store()
                    .reserve_refund(&request, &sluice_store::Provenance::actor("merchant:test"))
                    .await
                    .unwrap();
            }
            (MoneyMove::Capture, DiedAfter::Reservation) => {
                let request = sluice_store::CaptureRequest {
                    payment_id: payment_id.into(),
                    merchant_id: Some(m.id.clone()),
                    amount: money,
                    idempotency_key: key,
                };
                gw.store()
                    .reserve_capture(&request, &sluice_store::Provenance::actor("merchant:test"))
                    .await
                    .unwrap();
            }
            (MoneyMove::Refund, DiedAfter::PspCall) => {
                let done = gw
                    .orch
                    .refund_keyed(&m.id, payment_id, Some(money), None, key.as_deref())
                    .await
                    .unwrap();
                assert_eq!(done.refund.state.as_str(), "SUCCEEDED");
            }
            (MoneyMove::Capture, DiedAfter::PspCall) => {
                let done = gw
                    .orch
                    .capture_keyed(&m.id, payment_id, Some(money), key.as_deref())
                    .await
                    .unwrap();
                assert_eq!(done.capture.state.as_str(), "SUCCEEDED");
            }
        }
    }

    /// Exactly one refund (capture) of `amount` at the PSP and in the store,
    /// settled, nothing else reserved.
    async fn assert_moved_once(self, gw: &Gateway, payment_id: &str, amount: i64) {
        let amounts = gw.store().payment_amounts(payment_id).await.unwrap();
        match self {
            MoneyMove::Refund => {
                let at_psp: Vec<i64> = gw.psp.refunds().iter().map(|r| r.amount).collect();
                assert_eq!(at_psp, vec![amount], "exactly one refund at the PSP");
                assert_eq!(
                    gw.store().list_refunds(payment_id).await.unwrap().len(),
                    1,
                    "one refund row"
                );
                assert_eq!(
                    (amounts.refunded_minor, amounts.refund_reserved_minor),
                    (amount, 0)
                );
            }
            MoneyMove::Capture => {
                let at_psp: Vec<i64> = gw.psp.captures().iter().map(|c| c.2).collect();
                assert_eq!(at_psp, vec![amount], "exactly one capture at the PSP");
                assert_eq!(
                    gw.store().list_captures(payment_id).await.unwrap().len(),
                    1,
                    "one capture row"
                );
                assert_eq!(
                    (amounts.captured_minor, amounts.capture_reserved_minor),
                    (amount, 0)
                );
            }
        }
    }
}

/// Issue 11 §2: the first run of a keyed refund or capture died after its
/// reservation and before its idempotency record completed; past the lease
/// the retry with the same key takes the key over and runs again. It must
/// find the same reservation and send the same PSP key: money moves once.
async fn a_retry_after_a_crash_moves_money_once(gw: &Gateway, what: MoneyMove, died: DiedAfter) {
    let m = gw.merchant("Acme").await;
    let payment_id = crate::operations::paid(gw, &m, "crash-1", 1000, what.capture_mode()).await;
    let path = what.path(&payment_id);
    let body = json!({"amount": 300});
    let lease_ms = 60_000;
    let fp = fingerprint(&path, None, body.to_string().as_bytes());
    let begun = gw
        .store()
        .idempotency_begin(&m.id, what.endpoint(), "retry-1", &fp, lease_ms)
        .await
        .unwrap();
    assert_eq!(begun, IdempotencyBegin::Started);
    what.first_run(gw, &m, &payment_id, 300, "retry-1", died)
        .await;
    // The process died here: the key stays in progress until its lease ends.
    gw.post_idem(&m.key, "retry-1", &path, &body)
        .await
        .expect_error(409, "idempotency_key_in_use");
    gw.db.clock.advance(lease_ms + 1);
    let retried = gw
        .post_idem(&m.key, "retry-1", &path, &body)
        .await
        .expect(200)
        .json();
    let state = match what {
        MoneyMove::Refund => &retried["state"],
        MoneyMove::Capture => &retried["captures"][0]["state"],
    };
    assert_eq!(state, "SUCCEEDED", "{what:?} after {died:?}: {retried}");
    what.assert_moved_once(gw, &payment_id, 300).await;
    // The completed key replays; a new key is a new request.
    let replay = gw
        .post_idem(&m.key, "retry-1", &path, &body)
        .await
        .expect(200);
    assert_eq!(replay.headers.get("idempotent-replayed").unwrap(), "true");
    what.assert_moved_once(gw, &payment_id, 300).await;
}

dual_test! {
    async fn a_refund_retried_after_a_crash_past_its_psp_call_is_not_refunded_twice(&gw) {
        a_retry_after_a_crash_moves_money_once(gw, MoneyMove::Refund, DiedAfter::PspCall).await;
    }
}

dual_test! {
    async fn a_refund_retried_after_a_crash_past_its_reservation_reserves_once_and_refunds_once(&gw) {
        a_retry_after_a_crash_moves_money_once(gw, MoneyMove::Refund, DiedAfter::Reservation).await;
    }
}

dual_test! {
    async fn a_capture_retried_after_a_crash_past_its_psp_call_is_not_captured_twice(&gw) {
        a_retry_after_a_crash_moves_money_once(gw, MoneyMove::Capture, DiedAfter::PspCall).await;
    }
}

dual_test! {
    async fn a_capture_retried_after_a_crash_past_its_reservation_reserves_once_and_captures_once(&gw) {
        a_retry_after_a_crash_moves_money_once(gw, MoneyMove::Capture, DiedAfter::Reservation).await;
    }
}

dual_test! {
    async fn a_keyed_refund_of_everything_retried_after_a_crash_is_the_same_refund(&gw) {
        let m = gw.merchant("Acme").await;
        let payment_id = crate::operations::paid(gw, &m, "crash-all", 1000, "automatic").await;
        let path = MoneyMove::Refund.path(&payment_id);
        let fp = fingerprint(&path, None, b"{}");
        gw.store().idempotency_begin(&m.id, MoneyMove::Refund.endpoint(), "all-1", &fp, 60_000).await.unwrap();
        gw.orch.refund_keyed(&m.id, &payment_id, None, None, Some("all-1")).await.unwrap();
        gw.db.clock.advance(60_001);
        let retried = gw.post_idem(&m.key, "all-1", &path, &json!({})).await.expect(200).json();
        assert_eq!(retried["amount"], 1000, "{retried}");
        MoneyMove::Refund.assert_moved_once(gw, &payment_id, 1000).await;
    }
}
