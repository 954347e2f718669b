//! `Idempotency-Key`: replay byte for byte, mismatch, in use, scoping, pruning.

use crate::common::*;
use serde_json::json;
use sluice_merchant_api::idempotency::fingerprint;
use sluice_store::IdempotencyBegin;

dual_test! {
    async fn a_retry_with_the_same_key_replays_the_first_response_byte_for_byte(gw) {
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
    async fn an_error_raised_after_execution_began_is_stored_and_replayed(gw) {
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
    async fn the_same_key_with_other_parameters_is_an_idempotency_error(gw) {
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
    async fn the_same_key_while_the_first_request_runs_is_409_in_use_until_its_lease_ends(gw) {
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
    async fn keys_are_scoped_to_the_merchant_and_the_endpoint(gw) {
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
    async fn a_request_refused_before_execution_does_not_burn_its_key(gw) {
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
    async fn keys_older_than_a_day_are_pruned_and_younger_ones_kept(gw) {
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
