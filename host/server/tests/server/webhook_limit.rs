//! The webhook route's per-account rate limit comes from `[webhooks]` in
//! `sluice.toml` (issue 17: PSPs send bursts after their own outages, so a
//! gateway sizes it from its measured ingest rate).

use crate::pg::TestDatabase;
use crate::system::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_applies_the_webhook_burst_of_its_config_file_per_connector_account() {
    let db = TestDatabase::create().await;
    let adapters = real_adapters();
    let root = tempfile::tempdir().expect("temp dir");
    // The test writes the `[workers]` section first; a second section follows it.
    let mut gateway = Gateway::new(
        "gateway",
        root.path(),
        &db.url,
        adapters.path(),
        "\n[webhooks]\nburst = 3\nper_second = 1",
        &[],
    );
    gateway.start().await;
    let http = reqwest::Client::new();
    let post = |account: &'static str| {
        let url = format!("{}/webhooks/stripe/{account}", gateway.url);
        let http = http.clone();
        async move {
            http.post(url)
                .body("{}")
                .send()
                .await
                .expect("webhook")
                .status()
                .as_u16()
        }
    };
    // The limit is taken before the account is looked up, so even unknown
    // accounts (404) spend the bucket: three pass, then it is refused (one
    // token a second comes back, so of three more at least one is refused
    // unless the machine stalls for seconds).
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(post("ca_flooded").await);
    }
    assert_eq!(statuses[..3], [404, 404, 404], "{statuses:?}");
    assert!(statuses[3..].contains(&429), "{statuses:?}");
    assert_eq!(
        post("ca_other").await,
        404,
        "another account has its own bucket"
    );
}
