//! The operations console in a real browser (issue 16): headless Chromium
//! driven through chromedriver against an in-process gateway with the real
//! adapters, the sandbox PSP and the demo merchant.
//!
//! Without chromedriver the tests say so loudly and pass, unless
//! `SLUICE_REQUIRE_BROWSER` is set (`.ci/run` sets it and installs Debian's
//! `chromium` and `chromium-driver`), where a missing browser fails them.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::Method;
use serde_json::{json, Value};
use sluice_server::demo_setup::{self, DemoSetup};
use sluice_server::server::RunningServer;
use sluice_test_support::eventually;

use crate::common::{
    adapter_bytes, adapters_subset, config, digest, start, with_custom_section, Body, Http,
    ADMIN_TOKEN,
};

/// How long any one thing the browser waits for may take.
const WAIT: Duration = Duration::from_secs(20);

/// chromedriver, from `SLUICE_CHROMEDRIVER` (a path that is no file is no
/// chromedriver) or the usual places.
fn chromedriver() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLUICE_CHROMEDRIVER") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The browser binary itself (Debian's `/usr/bin/chromium` is a shell
/// launcher around it), or `SLUICE_CHROMIUM`.
fn chromium() -> String {
    std::env::var("SLUICE_CHROMIUM").unwrap_or_else(|_| {
        ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
            .into_iter()
            .find(|p| Path::new(p).is_file())
            .unwrap_or("chromium")
            .to_owned()
    })
}

/// chromedriver's path, or `None` after a loud message when a test may skip.
fn browser_or_skip(test: &str) -> Option<PathBuf> {
    match chromedriver() {
        Some(path) => Some(path),
        None if std::env::var_os("SLUICE_REQUIRE_BROWSER").is_some() => panic!(
            "SLUICE_REQUIRE_BROWSER is set but chromedriver is missing: install Debian's \
             chromium and chromium-driver (or set SLUICE_CHROMEDRIVER)"
        ),
        None => {
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 SKIPPED {test}: chromedriver is not installed (apt-get install chromium \
                 chromium-driver). Set SLUICE_REQUIRE_BROWSER=1 to make this a failure.\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
            None
        }
    }
}

/// A chromedriver process on a free loopback port, killed on drop.
struct Driver {
    child: tokio::process::Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn spawn_driver(path: &Path) -> Driver {
    let port = StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = tokio::process::Command::new(path)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    let status = format!("{url}/status");
    eventually(WAIT, "chromedriver to answer /status", || async {
        let answer = reqwest::get(&status).await.ok()?;
        let body: Value = answer.json().await.ok()?;
        body["value"]["ready"].as_bool().filter(|r| *r)
    })
    .await;
    Driver { child, url }
}

/// A headless Chromium session of laptop size.
async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,800", "--hide-scrollbars"],
        }),
    );
    let mut builder = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
    builder
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

/// The gateway with the real adapters, the sandbox PSP, the demo merchant,
/// two operators and one paid payment flagged for review.
struct World {
    _data: tempfile::TempDir,
    _adapters: tempfile::TempDir,
    server: RunningServer,
    demo: DemoSetup,
    http: Http,
    alice: String,
    bob: String,
    /// Succeeded, found by its PSP reference.
    payment_id: String,
    psp_reference: String,
    /// Waiting for the customer (3-D Secure), flagged for manual review.
    review_id: String,
}

async fn world() -> World {
    let data = tempfile::tempdir().expect("temp dir");
    let adapters = adapters_subset(&["stripe", "adyen"]);
    let server = start(&config(data.path(), Some(adapters.path().to_path_buf()))).await;
    let services = server.services();
    let demo = demo_setup::set_up(
        services.orchestrator.store(),
        &services.merchant_api.pepper,
        &server.url(),
    )
    .await
    .expect("the demo merchant and sandbox PSP");
    let http = Http::new(&server);
    let alice = operator(&http, "alice").await;
    let bob = operator(&http, "bob").await;
    let (payment_id, psp_reference) =
        confirmed_payment(&http, &demo, "console-1", "pm_card_visa", "succeeded").await;
    let (review_id, _) = confirmed_payment(
        &http,
        &demo,
        "console-2",
        "pm_card_threeDSecureRequired",
        "requires_action",
    )
    .await;
    let attempt = services
        .orchestrator
        .store()
        .list_attempts(&review_id)
        .await
        .expect("attempts")
        .pop()
        .expect("one attempt");
    services
        .orchestrator
        .store()
        .flag_manual_review(
            sluice_store::PendingKind::Attempt,
            &attempt.id,
            "customer says they were charged twice",
            &sluice_store::Provenance::actor("test"),
        )
        .await
        .expect("flag for review");
    World {
        _data: data,
        _adapters: adapters,
        server,
        demo,
        http,
        alice,
        bob,
        payment_id,
        psp_reference,
        review_id,
    }
}

async fn operator(http: &Http, name: &str) -> String {
    let issued = http
        .call(
            Method::POST,
            "/admin/operators",
            None,
            Some(Body::Json(json!({ "name": name }))),
        )
        .await;
    assert_eq!(issued.status, 201, "{}", issued.json);
    issued.json["key"]
        .as_str()
        .expect("operator key")
        .to_owned()
}

/// A payment confirmed through the sandbox's Stripe-format account with
/// `method`, once its status is `status`: (payment id, the PSP's reference).
async fn confirmed_payment(
    http: &Http,
    demo: &DemoSetup,
    order_no: &str,
    method: &str,
    status: &str,
) -> (String, String) {
    let account = &demo.accounts.first().expect("a demo account").1;
    let created = http
        .call(
            Method::POST,
            "/v1/payments",
            Some(&demo.api_key),
            Some(Body::Json(json!({
                "amount": 1999, "currency": "EUR", "merchant_order_no": order_no,
                "capture_mode": "automatic", "connector_account": account,
                "payment_method": method, "confirm": true
            }))),
        )
        .await;
    assert!(created.status.is_success(), "{}", created.json);
    let id = created.json["id"].as_str().expect("payment id").to_owned();
    let path = format!("/v1/payments/{id}");
    eventually(WAIT, &format!("the payment to be {status}"), || async {
        let view = http
            .call(Method::GET, &path, Some(&demo.api_key), None)
            .await;
        let reference = view.json["attempts"][0]["psp_reference"].as_str()?;
        (view.json["status"] == status).then(|| (id.clone(), reference.to_owned()))
    })
    .await
}

// ---- browser helpers ---------------------------------------------------------------

async fn wait_for(client: &Client, css: &str) -> Element {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} within {WAIT:?}: {e}"))
}

/// The text of `css` once it contains `needle` (polled under a deadline).
async fn wait_for_text(client: &Client, css: &str, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(element) = client.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if text.contains(needle) {
                    return text;
                }
                last = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{css} never said {needle:?} within {WAIT:?}; last: {last:?}");
}

async fn type_into(client: &Client, css: &str, text: &str) {
    let field = wait_for(client, css).await;
    field.clear().await.expect("clear a field");
    field.send_keys(text).await.expect("type into a field");
}

/// Clicks `css` once it is there. The page re-renders a section when its data arrives, so an
/// element found a moment ago may have been replaced: a stale one is looked up again, under the
/// same deadline; any other error fails the test.
async fn click(client: &Client, css: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        match wait_for(client, css).await.click().await {
            Ok(()) => return,
            Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("click {css}: {e}"),
        }
    }
}

async fn sign_in(client: &Client, base: &str, operator_key: &str) {
    client
        .goto(&format!("{base}/console#/payments"))
        .await
        .expect("open the console");
    type_into(client, "#admin-token", ADMIN_TOKEN).await;
    type_into(client, "#operator-key", operator_key).await;
    click(client, "#sign-in-button").await;
    wait_for(client, "#stats .cards, #stats p").await;
}

async fn sign_out(client: &Client) {
    click(client, "#sign-out").await;
    wait_for(client, "#sign-in-form").await;
}

/// Search by the PSP's reference and open the payment from the results.
async fn open_by_psp_reference(client: &Client, world: &World) {
    type_into(client, "#search-q", &world.psp_reference).await;
    click(client, "#search-button").await;
    // The page lists every payment first; wait for the rows that answer this search.
    let row = format!(
        "#results[data-q=\"{}\"] tr[data-payment=\"{}\"] a.payment-link",
        world.psp_reference, world.payment_id
    );
    click(client, &row).await;
    wait_for(client, "#lanes").await;
}

// ---- the tests ---------------------------------------------------------------------

/// Runs without a browser: what the gateway serves under `/console`.
#[tokio::test]
async fn the_console_files_are_served_without_credentials_under_a_strict_policy_and_hold_no_data() {
    let data = tempfile::tempdir().expect("temp dir");
    let server = start(&config(data.path(), None)).await;
    let base = server.url();
    for (path, content_type) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/console.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
    ] {
        let answer = reqwest::get(format!("{base}{path}")).await.expect("GET");
        assert_eq!(answer.status(), 200, "{path}");
        let headers = answer.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["cache-control"], "no-store", "{path}");
        let csp = headers["content-security-policy"].to_str().expect("CSP");
        for rule in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(rule), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        let body = answer.text().await.expect("body");
        assert!(!body.contains(ADMIN_TOKEN), "{path} holds no secret");
    }
    let page = reqwest::get(format!("{base}/console"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let inline_handler = page.split(" on").skip(1).any(|rest| {
        let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    });
    assert!(
        !page.contains("<script>") && !page.contains("style=") && !inline_handler,
        "no inline script, style or handler: {page}"
    );
    // The data routes the page calls need the admin token and an operator key.
    let stats = reqwest::get(format!("{base}/admin/payments/stats"))
        .await
        .unwrap();
    assert_eq!(stats.status(), 401);
    server.shutdown().await.expect("stop the gateway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_payment_by_its_psp_reference_reads_its_lanes_and_next_step_two_operators_resolve_its_review_and_an_adapter_rolls_back(
) {
    let Some(driver_path) = browser_or_skip("the console browser test") else {
        return;
    };
    let world = world().await;
    let driver = spawn_driver(&driver_path).await;
    let client = browser(&driver).await;
    let base = world.server.url();

    sign_in(&client, &base, &world.alice).await;
    find_the_payment_and_read_its_lanes_and_next_step(&client, &world).await;
    let item = propose_and_fail_to_approve_alone(&client, &world).await;
    sign_out(&client).await;
    sign_in(&client, &base, &world.bob).await;
    approve_as_the_second_operator(&client, &world, &item).await;
    roll_back_an_adapter(&client, &world).await;

    client.close().await.expect("close the browser");
    world.server.shutdown().await.expect("stop the gateway");
}

/// Search by PSP reference; the order and attempt lanes, an event's evidence,
/// the next step of a settled payment and of one in review.
async fn find_the_payment_and_read_its_lanes_and_next_step(client: &Client, world: &World) {
    open_by_psp_reference(client, world).await;
    let url = client.current_url().await.expect("current url");
    assert!(!url.as_str().contains(ADMIN_TOKEN) && !url.as_str().contains(&world.alice));
    wait_for(
        client,
        "[data-lane=\"order\"] .ev[data-kind=\"COMMAND_CREATE\"]",
    )
    .await;
    click(
        client,
        "[data-lane=\"attempt\"] .ev[data-kind=\"PAYMENT_SUCCEEDED\"][data-decision=\"applied\"]",
    )
    .await;
    let detail = wait_for_text(client, "#event-detail", "Source (evidence)").await;
    assert!(
        detail.contains("stripe"),
        "the adapter that read it: {detail}"
    );
    assert!(detail.contains(&world.psp_reference), "{detail}");
    // Nothing is left to do for a succeeded payment.
    let mover = wait_for_text(client, "#next-mover", "nothing").await;
    assert_eq!(mover, "nothing");

    // The flagged payment waits for an operator.
    let base = world.server.url();
    client
        .goto(&format!("{base}/console#/payments/{}", world.review_id))
        .await
        .expect("open the flagged payment");
    let mover = wait_for_text(client, "#next-mover", "operator").await;
    assert_eq!(mover, "operator");
    wait_for_text(client, "#next-review", "charged twice").await;
}

/// Alice proposes to dismiss the review, then tries to approve it herself:
/// the server refuses. Returns the review item's selector.
async fn propose_and_fail_to_approve_alone(client: &Client, world: &World) -> String {
    click(client, "#nav a[data-section=\"review\"]").await;
    let item = format!("section.item[data-payment=\"{}\"]", world.review_id);
    wait_for(client, &item).await;
    let uid = world.review_id.replace(
        |c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-',
        "",
    );
    wait_for(client, &format!("#outcome-{uid}"))
        .await
        .select_by_value("dismiss")
        .await
        .expect("choose an outcome");
    type_into(client, &format!("#reason_code-{uid}"), "psp_dashboard").await;
    let evidence = "one charge in the PSP dashboard";
    type_into(client, &format!("#evidence_note-{uid}"), evidence).await;
    click(
        client,
        &format!("{item} form.propose button[type=\"submit\"]"),
    )
    .await;
    let status = format!("{item} tr[data-proposal] .proposal-status");
    wait_for_text(client, &status, "proposed").await;

    click(client, &format!("{item} button.approve")).await;
    let refusal = wait_for_text(client, "#alert", "same_operator").await;
    assert!(refusal.contains("403"), "{refusal}");
    let store = world.server.services().orchestrator.store();
    let proposals = store
        .proposals_for_payment(&world.review_id)
        .await
        .expect("proposals");
    assert_eq!(proposals.len(), 1);
    assert_eq!(
        proposals[0].status, "proposed",
        "still waiting for a second person"
    );
    item
}

/// Bob approves; the payment shows the applied proposal and is out of review.
async fn approve_as_the_second_operator(client: &Client, world: &World, item: &str) {
    click(client, "#nav a[data-section=\"review\"]").await;
    click(client, &format!("{item} button.approve")).await;
    wait_for_text(client, "#status", "applied").await;
    let base = world.server.url();
    client
        .goto(&format!("{base}/console#/payments/{}", world.review_id))
        .await
        .expect("open the payment");
    wait_for_text(client, "table.proposals .proposal-status", "applied").await;
    let mover = wait_for(client, "#next-mover")
        .await
        .text()
        .await
        .expect("mover");
    assert_ne!(mover, "operator", "the review is resolved");
    let path = format!("/v1/payments/{}", world.review_id);
    let view = world
        .http
        .call(Method::GET, &path, Some(&world.demo.api_key), None)
        .await;
    assert_eq!(view.json["manual_review"], false, "{}", view.json);
}

/// A second Stripe-format version serves; the console rolls it back.
async fn roll_back_an_adapter(client: &Client, world: &World) {
    let original = digest(&adapter_bytes("stripe"));
    let variant = with_custom_section(&adapter_bytes("stripe"), "console-test");
    let uploaded = world.http.upload("stripe", variant, true).await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.json);
    click(client, "#nav a[data-section=\"adapters\"]").await;
    click(client, "section[data-adapter=\"stripe\"] button.rollback").await;
    wait_for_text(client, "#status", "now serves").await;
    let stripe = world
        .http
        .call(Method::GET, "/admin/adapters/stripe", None, None)
        .await;
    assert_eq!(
        stripe.json["active_digest"],
        original.as_str(),
        "{}",
        stripe.json
    );
}

/// Takes the screenshots of `docs/console.md` (run once by hand:
/// `cargo nextest run --workspace -E 'test(console_screenshots)' --run-ignored all`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/console/*.png; run by hand after changing the console"]
async fn console_screenshots_for_the_docs_are_taken_of_every_main_page() {
    let Some(driver_path) = browser_or_skip("the console screenshots") else {
        return;
    };
    let world = world().await;
    // A second version of the Stripe-format adapter, so the adapters page
    // shows an active and a previous one.
    let variant = with_custom_section(&adapter_bytes("stripe"), "console-docs");
    let uploaded = world.http.upload("stripe", variant, true).await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.json);
    // A pending proposal, so the review page shows one to approve or reject.
    let proposed = reqwest::Client::new()
        .post(format!(
            "{}/admin/review/payments/{}/proposals",
            world.server.url(),
            world.review_id
        ))
        .bearer_auth(ADMIN_TOKEN)
        .header("Sluice-Operator-Key", &world.alice)
        .json(
            &json!({"outcome": "dismiss", "reason_code": "psp_dashboard",
                      "evidence_note": "one charge in the PSP dashboard"}),
        )
        .send()
        .await
        .expect("propose");
    assert_eq!(proposed.status(), 201);
    let driver = spawn_driver(&driver_path).await;
    let client = browser(&driver).await;
    let base = world.server.url();
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console");
    std::fs::create_dir_all(&out).expect("docs/console");
    let shoot = |name: &'static str| {
        let client = client.clone();
        let path = out.join(name);
        async move {
            let png = client.screenshot().await.expect("screenshot");
            std::fs::write(&path, png).expect("write the screenshot");
        }
    };

    sign_in(&client, &base, &world.alice).await;
    wait_for(&client, "#results table").await;
    shoot("payments.png").await;
    open_by_psp_reference(&client, &world).await;
    click(
        &client,
        "[data-lane=\"attempt\"] .ev[data-kind=\"PAYMENT_SUCCEEDED\"]",
    )
    .await;
    wait_for(&client, "#event-detail").await;
    shoot("payment.png").await;
    click(&client, "#nav a[data-section=\"review\"]").await;
    wait_for(&client, "section.item form.propose").await;
    shoot("review.png").await;
    click(&client, "#nav a[data-section=\"adapters\"]").await;
    wait_for(&client, "section[data-adapter=\"stripe\"]").await;
    shoot("adapters.png").await;
    client.close().await.expect("close the browser");
    world.server.shutdown().await.expect("stop the gateway");
}
