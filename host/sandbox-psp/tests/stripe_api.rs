//! The Stripe-format subset over real HTTP: objects, errors, idempotency and fault modes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use sluice_sandbox_psp::{DeliveryFaults, PayStatus};

#[tokio::test]
async fn a_sale_with_a_visa_token_succeeds_and_receives_the_full_amount() {
    let sb = sandbox().await;
    let r = stripe_create(&sb, "att_sale", "pm_card_visa", "2500", "automatic").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let pi = &r.json;
    assert!(pi["id"].as_str().is_some_and(|id| id.starts_with("pi_")));
    assert_eq!(pi["object"], "payment_intent");
    assert_eq!(pi["status"], "succeeded");
    assert_eq!(pi["amount"], 2500);
    assert_eq!(pi["amount_received"], 2500);
    assert_eq!(pi["amount_capturable"], 0);
    assert_eq!(pi["currency"], "eur");
    assert_eq!(pi["capture_method"], "automatic");
    assert_eq!(pi["metadata"]["sluice_attempt_reference"], "att_sale");
    assert_eq!(pi["last_payment_error"], Value::Null);
    assert!(pi["latest_charge"]
        .as_str()
        .is_some_and(|c| c.starts_with("ch_")));
    assert_eq!(sb.charge_count("att_sale"), 1);
}

#[tokio::test]
async fn an_authorisation_partially_captured_takes_that_amount_and_refuses_a_second_capture() {
    let sb = sandbox().await;
    let created = stripe_create(&sb, "att_auth", "pm_card_visa", "1000", "manual").await;
    assert_eq!(created.json["status"], "requires_capture");
    assert_eq!(created.json["amount_capturable"], 1000);
    assert_eq!(created.json["amount_received"], 0);
    let id = created.json["id"].as_str().unwrap_or_default().to_owned();

    let captured = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/capture"),
        Some("cap_1"),
        &[
            ("amount_to_capture", "600"),
            ("metadata[sluice_capture_reference]", "cap_1"),
        ],
    )
    .await;
    assert_eq!(captured.status, 200, "{}", captured.text);
    assert_eq!(captured.json["status"], "succeeded");
    assert_eq!(captured.json["amount_received"], 600);
    assert_eq!(captured.json["amount_capturable"], 0);
    assert_eq!(
        captured.json["metadata"]["sluice_capture_reference"],
        "cap_1"
    );

    let again = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/capture"),
        Some("cap_2"),
        &[("amount_to_capture", "400")],
    )
    .await;
    assert_eq!(again.status, 400);
    assert_eq!(again.json["error"]["type"], "invalid_request_error");
    assert_eq!(
        again.json["error"]["code"],
        "payment_intent_unexpected_state"
    );
}

#[tokio::test]
async fn capturing_more_than_is_capturable_is_refused_with_amount_too_large() {
    let sb = sandbox().await;
    let created = stripe_create(&sb, "att_over_cap", "pm_card_visa", "1000", "manual").await;
    let id = created.json["id"].as_str().unwrap_or_default();
    let r = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/capture"),
        Some("cap_over"),
        &[("amount_to_capture", "1001")],
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"]["code"], "amount_too_large");
    assert_eq!(
        sb.payment(id).map(|p| p.status),
        Some(PayStatus::RequiresCapture)
    );
}

#[tokio::test]
async fn cancelling_an_authorisation_releases_it_and_a_succeeded_payment_cannot_be_cancelled() {
    let sb = sandbox().await;
    let auth = stripe_create(&sb, "att_void", "pm_card_visa", "700", "manual").await;
    let id = auth.json["id"].as_str().unwrap_or_default();
    let canceled = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/cancel"),
        Some("void_1"),
        &[],
    )
    .await;
    assert_eq!(canceled.status, 200, "{}", canceled.text);
    assert_eq!(canceled.json["status"], "canceled");
    assert_eq!(canceled.json["amount_capturable"], 0);

    let sale = stripe_create(&sb, "att_void_sale", "pm_card_visa", "700", "automatic").await;
    let sale_id = sale.json["id"].as_str().unwrap_or_default();
    let refused = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{sale_id}/cancel"),
        Some("void_2"),
        &[],
    )
    .await;
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json["error"]["code"],
        "payment_intent_unexpected_state"
    );
}

#[tokio::test]
async fn a_declined_card_answers_402_card_error_with_generic_decline_and_moves_no_money() {
    let sb = sandbox().await;
    let r = stripe_create(
        &sb,
        "att_decl",
        "pm_card_chargeDeclined",
        "1000",
        "automatic",
    )
    .await;
    assert_eq!(r.status, 402, "{}", r.text);
    let e = &r.json["error"];
    assert_eq!(e["type"], "card_error");
    assert_eq!(e["code"], "card_declined");
    assert_eq!(e["decline_code"], "generic_decline");
    assert_eq!(e["payment_intent"]["status"], "requires_payment_method");
    assert_eq!(
        e["payment_intent"]["last_payment_error"]["decline_code"],
        "generic_decline"
    );
    assert_eq!(sb.payment_count("att_decl"), 1);
    assert_eq!(sb.charge_count("att_decl"), 0);
}

#[tokio::test]
async fn insufficient_funds_is_a_card_decline_with_decline_code_insufficient_funds() {
    let sb = sandbox().await;
    let r = stripe_create(
        &sb,
        "att_nsf",
        "pm_card_insufficient_funds",
        "1000",
        "automatic",
    )
    .await;
    assert_eq!(r.status, 402);
    assert_eq!(r.json["error"]["code"], "card_declined");
    assert_eq!(r.json["error"]["decline_code"], "insufficient_funds");
}

#[tokio::test]
async fn three_d_secure_requires_action_and_visiting_the_redirect_url_completes_the_payment() {
    let sb = sandbox().await;
    let mut form = pi_form(
        "att_3ds",
        "pm_card_threeDSecureRequired",
        "1500",
        "automatic",
    );
    form.push(("return_url", "https://merchant.example/back"));
    let r = stripe_post(&sb, "/v1/payment_intents", Some("att_3ds"), &form).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "requires_action");
    assert_eq!(r.json["next_action"]["type"], "redirect_to_url");
    let url = r.json["next_action"]["redirect_to_url"]["url"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(url.starts_with(&sb.base_url()), "{url}");
    assert_eq!(sb.charge_count("att_3ds"), 0);

    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let visit = no_redirects
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(visit.status().as_u16(), 303);
    let id = r.json["id"].as_str().unwrap_or_default();
    let location = visit.headers()["location"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        location,
        format!("https://merchant.example/back?payment_intent={id}")
    );

    let after = stripe_get(&sb, &format!("/v1/payment_intents/{id}")).await;
    assert_eq!(after.json["status"], "succeeded");
    assert_eq!(after.json["next_action"], Value::Null);
    assert_eq!(sb.charge_count("att_3ds"), 1);
}

#[tokio::test]
async fn failing_three_d_secure_leaves_the_payment_declined_with_an_authentication_error() {
    let sb = sandbox().await;
    let r = stripe_create(
        &sb,
        "att_3ds_fail",
        "pm_card_threeDSecureRequired",
        "1500",
        "manual",
    )
    .await;
    let id = r.json["id"].as_str().unwrap_or_default();
    assert_eq!(
        sb.complete_action(id, false).map(|p| p.status),
        Some(PayStatus::Failed)
    );
    let after = stripe_get(&sb, &format!("/v1/payment_intents/{id}")).await;
    assert_eq!(after.json["status"], "requires_payment_method");
    assert_eq!(
        after.json["last_payment_error"]["code"],
        "payment_intent_authentication_failure"
    );
}

#[tokio::test]
async fn requests_without_a_valid_bearer_key_get_401_with_a_stripe_error() {
    let sb = sandbox().await;
    let url = format!("{}/v1/payment_intents", sb.base_url_stripe());
    let missing = reply(
        client()
            .post(&url)
            .form(&pi_form("a", "pm_card_visa", "1", "manual"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json["error"]["type"], "invalid_request_error");
    let wrong = reply(
        client()
            .get(format!("{}/v1/payment_intents/pi_x", sb.base_url_stripe()))
            .bearer_auth("sk_test_wrong_key_9999")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .await;
    assert_eq!(wrong.status, 401);
    let message = wrong.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.ends_with("9999"), "{message}");
    assert!(
        !message.contains("sk_test_wrong_key"),
        "the key must be masked: {message}"
    );
    assert_eq!(sb.payments().len(), 0);
}

#[tokio::test]
async fn unknown_and_missing_parameters_are_refused_like_stripe_does() {
    let sb = sandbox().await;
    let mut form = pi_form("att_unknown", "pm_card_visa", "100", "manual");
    form.push(("shipping_speed", "fast"));
    let unknown = stripe_post(&sb, "/v1/payment_intents", None, &form).await;
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.json["error"]["code"], "parameter_unknown");
    assert_eq!(unknown.json["error"]["param"], "shipping_speed");

    let missing = stripe_post(&sb, "/v1/payment_intents", None, &[("currency", "eur")]).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json["error"]["code"], "parameter_missing");
    assert_eq!(missing.json["error"]["param"], "amount");
    assert_eq!(sb.payments().len(), 0);
}

#[tokio::test]
async fn a_refund_beyond_the_captured_amount_is_refused_with_invalid_request_error() {
    let sb = sandbox().await;
    let auth = stripe_create(&sb, "att_ref", "pm_card_visa", "1000", "manual").await;
    let id = auth.json["id"].as_str().unwrap_or_default().to_owned();
    stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/capture"),
        Some("cap"),
        &[("amount_to_capture", "800")],
    )
    .await;

    let first = stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_1"),
        &[
            ("payment_intent", &id),
            ("amount", "500"),
            ("metadata[sluice_refund_reference]", "ref_1"),
        ],
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["object"], "refund");
    assert_eq!(first.json["status"], "succeeded");
    assert_eq!(first.json["amount"], 500);
    assert_eq!(first.json["payment_intent"], id.as_str());

    let over = stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_2"),
        &[
            ("payment_intent", &id),
            ("amount", "301"),
            ("metadata[sluice_refund_reference]", "ref_2"),
        ],
    )
    .await;
    assert_eq!(over.status, 400, "{}", over.text);
    assert_eq!(over.json["error"]["type"], "invalid_request_error");
    assert_eq!(over.json["error"]["code"], "amount_too_large");

    let rest = stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_3"),
        &[("payment_intent", &id), ("amount", "300")],
    )
    .await;
    assert_eq!(rest.status, 200);
    let none_left = stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_4"),
        &[("payment_intent", &id), ("amount", "1")],
    )
    .await;
    assert_eq!(none_left.status, 400);
    assert_eq!(none_left.json["error"]["code"], "charge_already_refunded");
    assert_eq!(sb.refund_count("ref_1"), 1);
    assert_eq!(sb.refund_count("ref_2"), 0);
    assert_eq!(sb.payment(&id).map(|p| p.amount_refunded), Some(800));
}

#[tokio::test]
async fn an_uncaptured_authorisation_cannot_be_refunded() {
    let sb = sandbox().await;
    let auth = stripe_create(&sb, "att_ref_uncap", "pm_card_visa", "1000", "manual").await;
    let id = auth.json["id"].as_str().unwrap_or_default();
    let r = stripe_post(
        &sb,
        "/v1/refunds",
        Some("ref_uncap"),
        &[("payment_intent", id), ("amount", "100")],
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn refunds_are_retrievable_and_listed_by_payment_intent_newest_first() {
    let sb = sandbox().await;
    let sale = stripe_create(&sb, "att_list", "pm_card_visa", "1000", "automatic").await;
    let id = sale.json["id"].as_str().unwrap_or_default().to_owned();
    let mut refund_ids = Vec::new();
    for (key, amount) in [("rl_1", "100"), ("rl_2", "200")] {
        let r = stripe_post(
            &sb,
            "/v1/refunds",
            Some(key),
            &[
                ("payment_intent", &id),
                ("amount", amount),
                ("metadata[sluice_refund_reference]", key),
            ],
        )
        .await;
        refund_ids.push(r.json["id"].as_str().unwrap_or_default().to_owned());
    }
    let one = stripe_get(&sb, &format!("/v1/refunds/{}", refund_ids[0])).await;
    assert_eq!(one.json["metadata"]["sluice_refund_reference"], "rl_1");
    let list = stripe_get(&sb, &format!("/v1/refunds?payment_intent={id}")).await;
    assert_eq!(list.json["object"], "list");
    let listed: Vec<&str> = list.json["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|r| r["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(listed, vec![refund_ids[1].as_str(), refund_ids[0].as_str()]);
    let missing = stripe_get(&sb, "/v1/refunds/re_missing").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json["error"]["code"], "resource_missing");
}

#[tokio::test]
async fn search_by_attempt_reference_finds_exactly_that_payment_intent() {
    let sb = sandbox().await;
    let mine = stripe_create(&sb, "att_search", "pm_card_visa", "100", "automatic").await;
    stripe_create(&sb, "att_other", "pm_card_visa", "100", "automatic").await;
    let found = stripe_get(&sb, &search_path("att_search")).await;
    assert_eq!(found.status, 200, "{}", found.text);
    assert_eq!(found.json["object"], "search_result");
    let data = found.json["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], mine.json["id"]);
    let nothing = stripe_get(&sb, &search_path("att_never")).await;
    assert_eq!(nothing.json["data"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn the_same_idempotency_key_returns_the_same_payment_intent_and_charges_once() {
    let sb = sandbox().await;
    let first = stripe_create(&sb, "att_idem", "pm_card_visa", "900", "automatic").await;
    let second = stripe_create(&sb, "att_idem", "pm_card_visa", "900", "automatic").await;
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    assert_eq!(first.text, second.text);
    assert_eq!(
        second
            .headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert!(first.headers.get("idempotent-replayed").is_none());
    assert_eq!(sb.charge_count("att_idem"), 1);
    assert_eq!(sb.payment_count("att_idem"), 1);
    assert_eq!(sb.payments().len(), 1);
}

#[tokio::test]
async fn a_replayed_decline_is_the_same_402_and_not_a_second_attempt() {
    let sb = sandbox().await;
    let first = stripe_create(
        &sb,
        "att_idem_decl",
        "pm_card_chargeDeclined",
        "900",
        "automatic",
    )
    .await;
    let second = stripe_create(
        &sb,
        "att_idem_decl",
        "pm_card_chargeDeclined",
        "900",
        "automatic",
    )
    .await;
    assert_eq!((first.status, second.status), (402, 402));
    assert_eq!(first.text, second.text);
    assert_eq!(sb.payment_count("att_idem_decl"), 1);
}

#[tokio::test]
async fn the_same_idempotency_key_with_different_parameters_is_an_idempotency_error() {
    let sb = sandbox().await;
    stripe_create(&sb, "att_idem_diff", "pm_card_visa", "900", "automatic").await;
    let other = stripe_create(&sb, "att_idem_diff", "pm_card_visa", "901", "automatic").await;
    assert_eq!(other.status, 400, "{}", other.text);
    assert_eq!(other.json["error"]["type"], "idempotency_error");
    assert_eq!(sb.payment_count("att_idem_diff"), 1);
}

#[tokio::test]
async fn the_same_idempotency_key_on_another_endpoint_is_an_idempotency_error() {
    let sb = sandbox().await;
    let auth = stripe_create(&sb, "att_idem_ep", "pm_card_visa", "900", "manual").await;
    let id = auth.json["id"].as_str().unwrap_or_default();
    let cancel = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/cancel"),
        Some("att_idem_ep"),
        &[],
    )
    .await;
    assert_eq!(cancel.status, 400, "{}", cancel.text);
    assert_eq!(cancel.json["error"]["type"], "idempotency_error");
    assert_eq!(
        sb.payment(id).map(|p| p.status),
        Some(PayStatus::RequiresCapture)
    );
}

#[tokio::test]
async fn the_same_idempotency_key_while_the_first_request_is_in_flight_gets_409() {
    // A long slow delay keeps the first request in flight well past the second's
    // start, even on a loaded machine.
    let mut config = fast_config();
    config.slow_delay = Duration::from_millis(1500);
    let sb = sandbox_with(config).await;
    let form = pi_form("att_inflight", "pm_sluice_slow", "900", "automatic");
    let slow = {
        let url = format!("{}/v1/payment_intents", sb.base_url_stripe());
        let form: Vec<(String, String)> = form
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        tokio::spawn(async move {
            reply(
                client()
                    .post(url)
                    .bearer_auth(STRIPE_KEY)
                    .header("Idempotency-Key", "att_inflight")
                    .form(&form)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = stripe_post(&sb, "/v1/payment_intents", Some("att_inflight"), &form).await;
    assert_eq!(second.status, 409, "{}", second.text);
    assert_eq!(second.json["error"]["code"], "idempotency_key_in_use");
    assert_eq!(second.json["error"]["type"], "invalid_request_error");

    let first = slow.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.status, 200);
    let third = stripe_post(&sb, "/v1/payment_intents", Some("att_inflight"), &form).await;
    assert_eq!(third.text, first.text);
    assert_eq!(sb.charge_count("att_inflight"), 1);
}

#[tokio::test]
async fn the_server_error_token_answers_500_and_commits_nothing() {
    let sb = sandbox().await;
    let r = stripe_create(&sb, "att_500", "pm_sluice_server_error", "900", "automatic").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json["error"]["type"], "api_error");
    assert_eq!(sb.payment_count("att_500"), 0);
    let search = stripe_get(&sb, &search_path("att_500")).await;
    assert_eq!(search.json["data"].as_array().map(Vec::len), Some(0));
    // Nothing was saved under the key: a retry (here with another card) executes
    // instead of meeting a saved 500 or an idempotency error.
    let retry = stripe_create(&sb, "att_500", "pm_card_visa", "900", "automatic").await;
    assert_eq!(retry.status, 200, "{}", retry.text);
    assert_eq!(sb.charge_count("att_500"), 1);
}

#[tokio::test]
async fn the_slow_token_answers_only_after_the_slow_delay() {
    let sb = sandbox().await;
    let started = Instant::now();
    let r = stripe_create(&sb, "att_slow", "pm_sluice_slow", "900", "automatic").await;
    let took = started.elapsed();
    assert_eq!(r.status, 200);
    assert_eq!(r.json["status"], "succeeded");
    assert!(
        took >= Duration::from_millis(400),
        "answered after {took:?}"
    );
}

#[tokio::test]
async fn commit_then_timeout_times_the_client_out_but_the_charge_is_committed_exactly_once() {
    let sb = sandbox().await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let outcome = impatient
        .post(format!("{}/v1/payment_intents", sb.base_url_stripe()))
        .bearer_auth(STRIPE_KEY)
        .header("Idempotency-Key", "att_cto")
        .form(&pi_form(
            "att_cto",
            "pm_sluice_commit_then_timeout",
            "1200",
            "automatic",
        ))
        .send()
        .await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_timeout()),
        "expected a client timeout, got {outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    let found = stripe_get(&sb, &search_path("att_cto")).await;
    let data = found.json["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["status"], "succeeded");
    assert_eq!(data[0]["amount_received"], 1200);
    let id = data[0]["id"].as_str().unwrap_or_default();
    let retrieved = stripe_get(&sb, &format!("/v1/payment_intents/{id}")).await;
    assert_eq!(retrieved.json["status"], "succeeded");

    // Retrying with the same key answers at once with the committed payment.
    let replay_started = Instant::now();
    let replay = stripe_create(
        &sb,
        "att_cto",
        "pm_sluice_commit_then_timeout",
        "1200",
        "automatic",
    )
    .await;
    assert!(replay_started.elapsed() < Duration::from_secs(1));
    assert_eq!(replay.json["id"], id);
    assert_eq!(sb.charge_count("att_cto"), 1);
}

#[tokio::test]
async fn the_garbage_token_answers_200_with_a_body_that_is_not_json_yet_commits() {
    let sb = sandbox().await;
    let r = stripe_create(&sb, "att_garbage", "pm_sluice_garbage", "900", "automatic").await;
    assert_eq!(r.status, 200);
    assert!(
        serde_json::from_str::<Value>(&r.text).is_err(),
        "body was JSON: {}",
        r.text
    );
    assert_eq!(sb.charge_count("att_garbage"), 1);
    let found = stripe_get(&sb, &search_path("att_garbage")).await;
    assert_eq!(found.json["data"][0]["status"], "succeeded");
    let replay = stripe_create(&sb, "att_garbage", "pm_sluice_garbage", "900", "automatic").await;
    assert_eq!(replay.status, 200);
    assert_eq!(
        replay.json["status"], "succeeded",
        "the saved answer is the real one"
    );
}

#[tokio::test]
async fn the_late_webhook_token_answers_processing_and_succeeds_only_by_webhook() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = stripe_create(
        &sb,
        "att_late",
        "pm_sluice_late_webhook_only",
        "900",
        "automatic",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["status"], "processing");
    assert_eq!(sb.charge_count("att_late"), 0);
    let got = receiver.wait_for(1).await;
    assert_eq!(stripe_event_type(&got[0].body), "payment_intent.processing");

    assert_eq!(sb.settle_pending(), 1);
    let got = receiver.wait_for(2).await;
    assert_eq!(stripe_event_type(&got[1].body), "payment_intent.succeeded");
    let id = r.json["id"].as_str().unwrap_or_default();
    assert_eq!(
        stripe_get(&sb, &format!("/v1/payment_intents/{id}"))
            .await
            .json["status"],
        "succeeded"
    );
    assert_eq!(sb.charge_count("att_late"), 1);
    assert_eq!(sb.settle_pending(), 0);
}

#[tokio::test]
async fn late_webhook_payments_settle_by_themselves_after_the_configured_delay() {
    let receiver = Receiver::start().await;
    let mut config = fast_config();
    config.late_webhook_delay = Some(Duration::from_millis(150));
    config
        .webhook_targets
        .insert("s".into(), receiver.stripe_target());
    let sb = sandbox_with(config).await;
    let r = stripe_create(
        &sb,
        "att_late_auto",
        "pm_sluice_late_webhook_only",
        "900",
        "manual",
    )
    .await;
    assert_eq!(r.json["status"], "processing");
    let got = receiver.wait_for(2).await;
    assert_eq!(
        stripe_event_type(&got[1].body),
        "payment_intent.amount_capturable_updated"
    );
    assert_eq!(sb.charge_count("att_late_auto"), 1);
}

#[tokio::test]
async fn webhook_before_response_delivers_and_acknowledges_the_webhook_before_answering() {
    let (sb, receiver) = sandbox_and_receiver(DeliveryFaults::default()).await;
    let r = stripe_create(
        &sb,
        "att_wbr",
        "pm_sluice_webhook_before_response",
        "900",
        "automatic",
    )
    .await;
    assert_eq!(r.status, 200);
    // No waiting: the webhook must already be there when the answer arrives.
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert_eq!(stripe_event_type(&got[0].body), "payment_intent.succeeded");
    let records = sb.deliveries();
    assert_eq!(records.len(), 1);
    assert!(records[0].acknowledged);
}

#[tokio::test]
async fn objects_of_one_api_key_are_invisible_to_another() {
    let mut config = fast_config();
    config.stripe_api_keys.push("sk_test_second_account".into());
    let sb = sandbox_with(config).await;
    let r = stripe_create(&sb, "att_acct", "pm_card_visa", "900", "automatic").await;
    let id = r.json["id"].as_str().unwrap_or_default();
    let other = reply(
        client()
            .get(format!("{}/v1/payment_intents/{id}", sb.base_url_stripe()))
            .bearer_auth("sk_test_second_account")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .await;
    assert_eq!(other.status, 404);
    assert_eq!(other.json["error"]["code"], "resource_missing");
}

#[tokio::test]
async fn unknown_urls_answer_a_stripe_shaped_404() {
    let sb = sandbox().await;
    let r = stripe_get(&sb, "/v1/customers").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn with_per_endpoint_scope_one_key_may_serve_create_and_cancel() {
    let mut config = fast_config();
    config.idempotency_scope = sluice_sandbox_psp::IdempotencyScope::PerEndpoint;
    let sb = sandbox_with(config).await;
    let auth = stripe_create(&sb, "att_scope", "pm_card_visa", "900", "manual").await;
    let id = auth.json["id"].as_str().unwrap_or_default();
    let cancel = stripe_post(
        &sb,
        &format!("/v1/payment_intents/{id}/cancel"),
        Some("att_scope"),
        &[],
    )
    .await;
    assert_eq!(cancel.status, 200, "{}", cancel.text);
    assert_eq!(cancel.json["status"], "canceled");
}
