//! Warm instances (`src/warm.rs`): a finished call's instance serves the next call of the
//! same version for the same connector account, and nothing else.

mod common;

use common::*;
use sluice_adapter_runtime::{
    AdapterError, AdapterRuntime, ConnectorAccountScope, HttpResponse, RuntimeConfig, WarmConfig,
};

fn runtime_warm(max_idle: u32, max_calls: u32) -> AdapterRuntime {
    AdapterRuntime::new(RuntimeConfig {
        warm: WarmConfig {
            max_idle,
            max_calls,
        },
        ..config()
    })
    .expect("runtime")
}

/// What `test-exfiltrate` found in its memory from earlier calls (the tail of its ack).
fn remembered(ack_body: &[u8]) -> String {
    let text = String::from_utf8_lossy(ack_body).into_owned();
    let (_, tail) = text
        .rsplit_once("remembered from earlier calls:\n")
        .expect("the adapter always reports its memory");
    tail.to_string()
}

async fn hand_over(
    rt: &AdapterRuntime,
    account: &ConnectorAccountScope,
    secret: &str,
    marker: &str,
) -> String {
    let adapter = rt.active("test-exfiltrate").expect("active");
    let accepted = adapter
        .handle_webhook(account, signed_webhook(secret, NOW_SECS, marker.as_bytes()))
        .await
        .expect("ran")
        .expect("accepted");
    remembered(&accepted.ack.body)
}

/// A hostile adapter keeps everything it was handed in a static. With instances kept
/// warm, one account's call may find that account's own earlier input, and must never
/// find another account's, however the calls interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_instance_serves_only_later_calls_of_its_own_account() {
    let rt = runtime_warm(8, 1_000);
    load(&rt, "test-exfiltrate", None);
    let accounts = [
        account("acct_red", "sk_red", "whsec_red"),
        account("acct_blue", "sk_blue", "whsec_blue"),
        account("acct_green", "sk_green", "whsec_green"),
    ];
    let mut own_memory_seen = 0;
    for round in 0..30usize {
        let index = (round * 7 + round / 3) % accounts.len();
        let acct = &accounts[index];
        let id = &acct.account_id;
        let marker = format!("marker-of-{id}-round-{round}");
        let memory = hand_over(&rt, acct, &format!("whsec_{}", &id[5..]), &marker).await;
        for other in accounts.iter().filter(|a| &a.account_id != id) {
            assert!(
                !memory.contains(&format!("marker-of-{}", other.account_id)),
                "round {round}: a call of {id} found what {} handed over: {memory}",
                other.account_id
            );
        }
        if memory.contains(&format!("marker-of-{id}-round-")) {
            own_memory_seen += 1;
        }
    }
    // The instance really is reused: otherwise this test would prove nothing.
    assert!(
        own_memory_seen >= 20,
        "only {own_memory_seen} of 30 calls ran on a warm instance"
    );
    assert!(
        rt.warm_idle() <= 3,
        "one idle instance per account at most here"
    );
}

/// The first lines of `test-exfiltrate`'s ack: what this call could see of its account
/// (settings, MACs of every probed key), before what it remembered.
fn current_loot(ack_body: &[u8]) -> String {
    let text = String::from_utf8_lossy(ack_body).into_owned();
    let (head, _) = text
        .split_once("\nseen:\n")
        .expect("the adapter always reports what it saw");
    head.to_string()
}

/// A warm instance serves its account's next call with the account as it is then: a
/// changed setting and a rotated secret reach the very next call, on the same instance
/// (a warm store keeps its copy of the account only while the account is unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_instance_sees_its_accounts_changed_settings_and_secrets() {
    let rt = runtime_warm(8, 1_000);
    load(&rt, "test-exfiltrate", None);
    let adapter = rt.active("test-exfiltrate").expect("active");
    let before = account("acct_red", "sk_red", "whsec_red_1");
    let after = ConnectorAccountScope::new("acct_red")
        .with_config("base_url", "http://127.0.0.1:9/moved")
        .with_secret("api_key", "sk_red")
        .with_secret("webhook_secret", "whsec_red_2");
    let mut loot = Vec::new();
    for (acct, marker) in [
        (&before, "marker-one"),
        (&before, "marker-two"),
        (&after, "marker-three"),
    ] {
        let accepted = adapter
            .handle_webhook(
                acct,
                signed_webhook("unchecked", NOW_SECS, marker.as_bytes()),
            )
            .await
            .expect("ran")
            .expect("accepted");
        loot.push(current_loot(&accepted.ack.body));
        if marker == "marker-three" {
            let memory = remembered(&accepted.ack.body);
            // The adapter keeps the previous call's input in a static.
            assert!(
                memory.contains("marker-two"),
                "the call after the change ran on a fresh instance: {memory}"
            );
        }
    }
    let macs = |loot: &str| {
        loot.lines()
            .find(|l| l.starts_with("hmac webhook_secret "))
            .expect("the MAC of the webhook secret")
            .to_string()
    };
    assert_eq!(loot[0], loot[1], "an unchanged account looks the same");
    assert!(loot[2].contains(r#"config base_url=Some("http://127.0.0.1:9/moved")"#));
    assert_ne!(
        macs(&loot[1]),
        macs(&loot[2]),
        "the rotated secret was not used"
    );
}

/// Another version of the same adapter is another sandbox, even for the same account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_instance_never_serves_another_version() {
    let rt = runtime_warm(8, 1_000);
    load(&rt, "test-exfiltrate", None);
    let acct = account("acct_red", "sk_red", "whsec_red");
    hand_over(&rt, &acct, "whsec_red", "marker-for-version-one").await;
    let other = with_custom_section(&adapter_bytes("test-exfiltrate"), "sluice-test", b"v2");
    rt.load("test-exfiltrate", &other, None, true)
        .expect("second version");
    let memory = hand_over(&rt, &acct, "whsec_red", "marker-for-version-two").await;
    assert!(
        !memory.contains("marker-for-version-one"),
        "the new version saw the old version's memory: {memory}"
    );
}

/// A call that traps never parks its instance: the next call starts from a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapped_instance_is_never_reused() {
    let rt = runtime_warm(8, 1_000);
    load(&rt, "test-panic", None);
    let adapter = rt.active("test-panic").expect("active");
    let acct = ConnectorAccountScope::new("acct");
    let ok = HttpResponse {
        status: 200,
        headers: vec![],
        body: b"{}".to_vec(),
    };
    let server_error = HttpResponse {
        status: 500,
        ..ok.clone()
    };
    adapter
        .parse_response(&acct, sale_context(), ok.clone())
        .await
        .expect("ran")
        .expect("parsed");
    assert_eq!(
        rt.warm_idle(),
        1,
        "the successful call's instance is parked"
    );
    let err = adapter
        .parse_response(&acct, sale_context(), server_error)
        .await
        .unwrap_err();
    assert!(matches!(err, AdapterError::Trap(_)), "{err:?}");
    assert_eq!(
        rt.warm_idle(),
        0,
        "the trapped call took the warm instance and did not give it back"
    );
    adapter
        .parse_response(&acct, sale_context(), ok)
        .await
        .expect("the next call runs on a fresh instance")
        .expect("parsed");
    assert_eq!(rt.warm_idle(), 1);
}

/// An instance serves at most `max_calls` calls, and at most `max_idle` instances wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_instances_are_bounded_in_number_and_in_calls_served() {
    let rt = runtime_warm(2, 3);
    load(&rt, "test-exfiltrate", None);
    let acct = account("acct_red", "sk_red", "whsec_red");
    let mut remembered_own = Vec::new();
    for round in 0..7 {
        let memory = hand_over(&rt, &acct, "whsec_red", &format!("marker-{round}-")).await;
        remembered_own.push(memory.contains("marker-"));
    }
    // Calls 1-3 on one instance, 4-6 on the next, 7 on a third: the first call of each
    // instance remembers nothing.
    assert_eq!(
        remembered_own,
        [false, true, true, false, true, true, false],
        "an instance retires after max_calls"
    );
    for name in ["acct_blue", "acct_green", "acct_gold"] {
        let other = account(name, "sk", "whsec_x");
        hand_over(&rt, &other, "whsec_x", "x").await;
    }
    assert_eq!(rt.warm_idle(), 2, "no more than max_idle instances wait");
}
