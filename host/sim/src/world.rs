//! One simulated world: the database, the in-process PSP, three merchants
//! (two honest, one hostile) and the gateway incarnation that is currently
//! alive. A crash drops the incarnation (its memory, its in-flight calls) and
//! starts a new one from the database alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_adapter_runtime::AdapterRuntime;
use sluice_delivery::{EndpointPolicy, NewWebhookEndpoint, Publisher};
use sluice_orchestrator::{ConnectorRecovery, InboxConfig, Orchestrator, OrchestratorConfig};
use sluice_sandbox_psp::{
    CapturedWebhook, Format, RefundBehaviour, SandboxClock, SandboxConfig, SandboxHandle,
    WebhookTarget,
};
use sluice_scanner::{Scanner, ScannerConfig};
use sluice_store::{
    Clock, FulfillmentEndpoint, ManualClock, NewConnectorAccount, SeededEntropy, Store, StoreError,
    StoreOptions,
};

use crate::business::SimBusiness;
use crate::kills::{Armed, StoreKills};
use crate::merchants::SimMerchants;
use crate::net::{Crash, NetMode, SimNet};
use crate::rng::SimRng;
use crate::trace::Trace;
use crate::SimError;

/// Which wire format a connector account speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Psp {
    Stripe,
    Adyen,
}

impl Psp {
    pub fn adapter(self) -> &'static str {
        match self {
            Psp::Stripe => "stripe",
            Psp::Adyen => "adyen",
        }
    }
}

/// One connector account of a merchant, with the secrets the PSP signs with.
#[derive(Debug, Clone)]
pub struct Account {
    pub psp: Psp,
    pub id: String,
    pub api_key: String,
    pub webhook_secret: String,
    /// Adyen: the merchant account code.
    pub merchant_account: String,
}

/// A merchant of the world.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: &'static str,
    pub merchant_id: String,
    pub accounts: Vec<Account>,
}

/// A payment the workload created, by its world-local name.
#[derive(Debug, Clone)]
pub struct SimPayment {
    pub name: String,
    pub tenant: usize,
    pub payment_id: String,
    /// Idempotency keys already used for captures and refunds (a client
    /// retry re-sends one of them).
    pub keys: Vec<(KeyedOp, String, i64)>,
    /// The fulfillment block it was created with, if any.
    pub fulfillment: Option<SimFulfillment>,
}

/// A payment's business goal, as its merchant knows it.
#[derive(Debug, Clone)]
pub struct SimFulfillment {
    pub mode: sluice_core::FulfillmentMode,
    pub biz_key: String,
    pub deadline_ms: i64,
    /// The gateway accepted a confirmation of this payment: the merchant,
    /// following the safe protocol (confirm, then grant only if accepted),
    /// granted the goal, so the money must never go back by automation.
    pub accepted: bool,
}

/// A keyed merchant request that a client may retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedOp {
    Capture,
    Refund,
}

/// The gateway process that is alive now.
pub struct Incarnation {
    /// Which incarnation of the seed this is: 0 is the first, each restart
    /// or second instance the next number.
    pub serial: u64,
    pub store: Store,
    pub orch: Orchestrator,
    pub scanner: Scanner,
    pub publisher: Publisher,
    pub crash: Crash,
}

/// 2026-01-01T00:00:00Z: virtual time starts here for every seed.
pub const START_MS: i64 = 1_767_225_600_000;

/// The honest tenants; the last tenant of the world is the hostile one.
pub const HONEST: usize = 2;

/// Seeds per thousand with two gateway instances on the database.
pub const TWO_INSTANCES_PER_MILLE: u64 = 300;

pub struct World {
    pub seed: u64,
    pub rng: SimRng,
    pub trace: Trace,
    pub clock: ManualClock,
    pub sandbox: SandboxHandle,
    pub tenants: Vec<Tenant>,
    pub payments: Vec<SimPayment>,
    /// Webhooks the PSP sent that no gateway acknowledged yet (the PSP
    /// retries them until one does).
    pub in_flight: Vec<CapturedWebhook>,
    pub mode: Arc<Mutex<NetMode>>,
    pub gw: Incarnation,
    /// In seeds with two gateway instances on the database, the one not
    /// running the current step (steps switch between them; a race runs
    /// one operation on each).
    pub other: Option<Incarnation>,
    pub crashes: u32,
    pub violations: Vec<String>,
    pub observed: crate::check::Observed,
    /// How many events each webhook body delivered so far carries, by the
    /// sha256 of the body: the inbox must hold no more rows for it.
    pub bodies: BTreeMap<String, usize>,
    /// Webhook requests ingested so far, and as of the last inbox check:
    /// only ingestion adds inbox rows, so a step without one skips it.
    pub ingests: u64,
    pub ingests_checked: u64,
    /// The last details read of each payment, with the version they had.
    pub details_cache: BTreeMap<String, (i64, sluice_store::PaymentDetails)>,
    /// The honest merchants' webhook endpoints (what they received survives
    /// our crashes).
    pub merchants: SimMerchants,
    /// Payments a check ever saw `fulfilled` (a confirmation whose answer a
    /// kill lost is fulfilled all the same).
    pub seen_fulfilled: std::collections::BTreeSet<String>,
    /// The merchants' businesses behind pull-mode fulfillment.
    pub business: SimBusiness,
    /// How the payments with a business goal ended (at convergence).
    pub fulfillment_outcomes: BTreeMap<String, usize>,
    /// The two operators' ids (proposer, approver).
    pub operators: [String; 2],
    /// Proposals waiting for the second operator.
    pub proposals: Vec<crate::review::PendingProposal>,
    /// Manual refunds the operators approved (the store applied them).
    pub manual_refunds: Vec<crate::manual_refund::ApprovedManualRefund>,
    /// Fulfillment resolutions the operators applied.
    pub fulfillment_resolutions: crate::review_fulfillment::Resolutions,
    /// Whether a guarded operation runs (kills at store await points are
    /// drawn only then).
    pub armed: Armed,
    db_url: String,
    runtime: AdapterRuntime,
    entropy_seed: u64,
    next_serial: u64,
}

impl World {
    /// Builds the world of `seed` on a fresh copy of the migrated database
    /// at `db_url` (SQLite or PostgreSQL).
    pub async fn build(
        seed: u64,
        runtime: AdapterRuntime,
        clock: ManualClock,
        db_url: &str,
        echo: bool,
    ) -> Result<World, SimError> {
        clock.set(START_MS);
        let rng = SimRng::new(seed);
        let trace = Trace::new(clock.clone(), echo);
        let sandbox = sandbox(seed, &clock, &rng)?;
        let db_url = db_url.to_owned();
        let drawn = NetMode {
            fault_per_mille: 150 + rng.below(250),
            crashes: rng.chance(700),
        };
        // Setting up the merchants is not part of the experiment.
        let mode = Arc::new(Mutex::new(NetMode {
            fault_per_mille: 0,
            crashes: false,
        }));
        let entropy_seed = seed ^ 0x5eed_5eed_5eed_5eed;
        let merchants = SimMerchants::new(rng.clone(), mode.clone(), trace.clone());
        let business = SimBusiness::new(rng.clone(), clock.clone(), trace.clone(), mode.clone());
        let armed = Armed::default();
        let gw = incarnation(
            0,
            &db_url,
            &runtime,
            &clock,
            &sandbox,
            &rng,
            &trace,
            &mode,
            &merchants,
            entropy_seed,
            &business,
            &armed,
        )
        .await?;
        let mut world = World {
            seed,
            rng,
            trace,
            clock,
            sandbox,
            tenants: Vec::new(),
            payments: Vec::new(),
            in_flight: Vec::new(),
            mode,
            gw,
            other: None,
            crashes: 0,
            violations: Vec::new(),
            observed: crate::check::Observed::default(),
            bodies: BTreeMap::new(),
            ingests: 0,
            ingests_checked: 0,
            details_cache: BTreeMap::new(),
            merchants,
            seen_fulfilled: std::collections::BTreeSet::new(),
            business,
            fulfillment_outcomes: BTreeMap::new(),
            operators: [String::new(), String::new()],
            proposals: Vec::new(),
            manual_refunds: Vec::new(),
            fulfillment_resolutions: BTreeMap::new(),
            armed,
            db_url,
            runtime,
            entropy_seed,
            next_serial: 1,
        };
        world.add_tenants().await?;
        world.add_operators().await?;
        if world.rng.chance(TWO_INSTANCES_PER_MILLE) {
            world.other = Some(world.incarnation().await?);
        }
        world.set_mode(drawn);
        Ok(world)
    }

    /// The two people of the review (their keys are not used: the simulator
    /// acts through the store, below the API's authentication).
    async fn add_operators(&mut self) -> Result<(), SimError> {
        let pepper = sluice_store::ApiKeyPepper::new(vec![7u8; 32])?;
        for (slot, name) in crate::review::OPERATORS.iter().enumerate() {
            let issued = self.gw.store.create_operator(name, &pepper).await?;
            self.operators[slot] = issued.operator.id;
        }
        Ok(())
    }

    /// The process died: drop it and start a new one from the database.
    pub async fn restart(&mut self) -> Result<(), SimError> {
        self.crashes += 1;
        self.trace
            .line("crash: gateway killed; restarting from the database");
        self.gw = self.incarnation().await?;
        Ok(())
    }

    /// The other instance died: the same.
    pub async fn restart_other(&mut self) -> Result<(), SimError> {
        self.crashes += 1;
        self.trace
            .line("crash: the other gateway instance killed; restarting it from the database");
        self.other = Some(self.incarnation().await?);
        Ok(())
    }

    /// With two instances, the next step runs on either (drawn).
    pub fn switch_instance(&mut self) {
        if let Some(other) = self.other.as_mut() {
            if self.rng.chance(500) {
                std::mem::swap(&mut self.gw, other);
                self.trace.line(format!(
                    "gateway instance {} takes the step",
                    self.gw.serial
                ));
            }
        }
    }

    /// A new gateway process on the world's database.
    async fn incarnation(&mut self) -> Result<Incarnation, SimError> {
        // Each incarnation draws its own jitter stream.
        self.entropy_seed = self.entropy_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let serial = self.next_serial;
        self.next_serial += 1;
        incarnation(
            serial,
            &self.db_url,
            &self.runtime,
            &self.clock,
            &self.sandbox,
            &self.rng,
            &self.trace,
            &self.mode,
            &self.merchants,
            self.entropy_seed,
            &self.business,
            &self.armed,
        )
        .await
    }

    pub fn set_mode(&self, mode: NetMode) {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    pub fn mode(&self) -> NetMode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    async fn add_tenants(&mut self) -> Result<(), SimError> {
        for (index, name) in ["A", "B", "M"].into_iter().enumerate() {
            let merchant = self.gw.store.create_merchant(name).await?;
            if index < HONEST {
                self.add_endpoint(&merchant.id, name).await?;
            }
            let mut accounts = Vec::new();
            for psp in [Psp::Stripe, Psp::Adyen] {
                let account = self.add_account(&merchant.id, name, index, psp).await?;
                accounts.push(account);
            }
            // Every merchant's business answers pull-mode calls.
            self.gw
                .store
                .set_fulfillment_endpoint(&FulfillmentEndpoint {
                    merchant_id: merchant.id.clone(),
                    url: format!("https://business-{name}.sim/fulfillment"),
                    secret: crate::business::SECRET.to_owned(),
                    timeout_ms: 5_000,
                })
                .await?;
            self.tenants.push(Tenant {
                name,
                merchant_id: merchant.id,
                accounts,
            });
        }
        Ok(())
    }

    /// The merchant's webhook endpoint for every event type.
    async fn add_endpoint(&self, merchant_id: &str, name: &str) -> Result<(), SimError> {
        let endpoint = NewWebhookEndpoint {
            url: format!(
                "https://merchant-{}.example/sluice/events",
                name.to_lowercase()
            ),
            description: String::new(),
            event_types: vec!["*".to_owned()],
            enabled: true,
        };
        sluice_delivery::create_endpoint(
            &self.gw.store,
            merchant_id,
            &endpoint,
            EndpointPolicy::default(),
        )
        .await
        .map_err(|e| SimError::Setup(format!("webhook endpoint of {name}: {e}")))?;
        Ok(())
    }

    async fn add_account(
        &self,
        merchant_id: &str,
        name: &str,
        index: usize,
        psp: Psp,
    ) -> Result<Account, SimError> {
        let (api_key, webhook_secret, base_url) = match psp {
            Psp::Stripe => (
                stripe_key(index),
                format!("whsec_sim_tenant_{name}_{:016x}", self.seed),
                self.sandbox.base_url_stripe(),
            ),
            Psp::Adyen => (
                adyen_key(index),
                adyen_hmac_key(self.seed, index),
                self.sandbox.base_url_adyen(),
            ),
        };
        let merchant_account = format!("Sim{name}ECOM");
        let mut config = serde_json::json!({ "base_url": base_url });
        if psp == Psp::Adyen {
            config["merchant_account"] = serde_json::json!(merchant_account);
        }
        let created = self
            .gw
            .store
            .create_connector_account(&NewConnectorAccount {
                merchant_id: merchant_id.to_owned(),
                adapter: psp.adapter().to_owned(),
                label: format!("{name}-{}", psp.adapter()),
                config,
                secrets: serde_json::json!({
                    "api_key": api_key,
                    "webhook_secret": webhook_secret,
                }),
            })
            .await?;
        // Only the honest tenants' payments produce genuine webhooks; the
        // hostile tenant's route receives only what it forges itself.
        self.sandbox.set_webhook_target(
            created.id.clone(),
            WebhookTarget {
                url: format!("/webhooks/{}/{}", psp.adapter(), created.id),
                secret: webhook_secret.clone(),
                format: match psp {
                    Psp::Stripe => Format::Stripe,
                    Psp::Adyen => Format::Adyen,
                },
                api_key: Some(api_key.clone()),
            },
        );
        Ok(Account {
            psp,
            id: created.id,
            api_key,
            webhook_secret,
            merchant_account,
        })
    }

    pub fn account(&self, id: &str) -> Option<&Account> {
        self.tenants
            .iter()
            .flat_map(|t| &t.accounts)
            .find(|a| a.id == id)
    }

    /// The world-local name of an account, for the trace.
    pub fn account_label(&self, id: &str) -> String {
        for tenant in &self.tenants {
            for account in &tenant.accounts {
                if account.id == id {
                    return format!("{}-{}", tenant.name, account.psp.adapter());
                }
            }
        }
        "?".into()
    }
}

fn stripe_key(tenant: usize) -> String {
    format!("sk_test_sim_tenant_{tenant}")
}

fn adyen_key(tenant: usize) -> String {
    format!("adyen_sim_tenant_{tenant}")
}

/// A 32-byte HMAC key in hex, distinct per seed and tenant.
fn adyen_hmac_key(seed: u64, tenant: usize) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("sim-adyen-hmac-{seed}-{tenant}").as_bytes());
    hex::encode_upper(digest)
}

fn sandbox(seed: u64, clock: &ManualClock, rng: &SimRng) -> Result<SandboxHandle, SimError> {
    let tick = clock.clone();
    let refund_behaviour = match rng.below(3) {
        0 => RefundBehaviour::Succeed,
        1 => RefundBehaviour::PendingThenSucceed,
        _ => RefundBehaviour::PendingThenFail,
    };
    let config = SandboxConfig {
        stripe_api_keys: (0..=HONEST).map(stripe_key).collect(),
        adyen_api_keys: (0..=HONEST).map(adyen_key).collect(),
        late_webhook_delay: None,
        seed: Some(seed),
        refund_behaviour,
        clock: SandboxClock::new(move || tick.now_ms()),
        capture_webhooks: true,
        ..SandboxConfig::default()
    };
    Ok(sluice_sandbox_psp::in_process(config)?)
}

#[allow(clippy::too_many_arguments)]
async fn incarnation(
    serial: u64,
    db_url: &str,
    runtime: &AdapterRuntime,
    clock: &ManualClock,
    sandbox: &SandboxHandle,
    rng: &SimRng,
    trace: &Trace,
    mode: &Arc<Mutex<NetMode>>,
    merchants: &SimMerchants,
    entropy_seed: u64,
    business: &SimBusiness,
    armed: &Armed,
) -> Result<Incarnation, SimError> {
    let crash = Crash::new();
    let kills = StoreKills {
        serial,
        rng: rng.clone(),
        crash: crash.clone(),
        mode: mode.clone(),
        trace: trace.clone(),
        armed: armed.clone(),
    };
    let store = Store::connect_with(
        db_url,
        StoreOptions {
            // One connection, as one seed runs one thing at a time: every
            // extra connection is another worker thread to wake (SQLite) or
            // server process to keep (PostgreSQL), and a code path that held
            // a transaction while asking for a second connection would hang
            // the seed, which is a finding, not noise. On PostgreSQL it also
            // keeps one statement of an instance in flight at a time, so the
            // order of the statements is the seed's alone.
            max_connections: 1,
            clock: Arc::new(clock.clone()),
            entropy: Arc::new(SeededEntropy::new(entropy_seed)),
            await_points: Some(Arc::new(kills)),
            ..StoreOptions::default()
        },
    )
    .await?;
    let router = sandbox
        .router()
        .ok_or_else(|| SimError::Setup("the sandbox is not in process".into()))?;
    let net = SimNet::new(
        router,
        rng.clone(),
        clock.clone(),
        trace.clone(),
        crash.clone(),
        mode.clone(),
    );
    let orch = Orchestrator::new(
        store.clone(),
        runtime.clone(),
        Arc::new(net),
        Arc::new(clock.clone()),
        orchestrator_config(business),
    );
    let scanner = Scanner::new(orch.clone(), ScannerConfig::default())
        .map_err(|e| SimError::Setup(e.to_string()))?;
    let publisher = merchants
        .publisher(store.clone(), crash.clone())
        .map_err(|e| SimError::Setup(e.to_string()))?;
    Ok(Incarnation {
        serial,
        store,
        orch,
        scanner,
        publisher,
        crash,
    })
}

fn orchestrator_config(business: &SimBusiness) -> OrchestratorConfig {
    let mut adapter_recovery = BTreeMap::new();
    // Stripe keeps idempotency keys for 24 h; re-send inside 23 h.
    adapter_recovery.insert(
        "stripe".to_owned(),
        ConnectorRecovery {
            resend_window: Some(Duration::from_secs(23 * 3600)),
            authorization_validity: None,
        },
    );
    OrchestratorConfig {
        // Wall-clock budgets must never expire in a simulation: every call
        // answers at once in real time, and a wait that ran out would let a
        // background task race the next step.
        sync_wait: Duration::from_secs(600),
        inbox: InboxConfig {
            max_tries: 5,
            ..InboxConfig::default()
        },
        adapter_recovery,
        fulfillment_transport: Arc::new(business.clone()),
        ..OrchestratorConfig::default()
    }
}

impl From<sqlx::Error> for SimError {
    fn from(error: sqlx::Error) -> Self {
        SimError::Store(error.to_string())
    }
}

impl From<StoreError> for SimError {
    fn from(error: StoreError) -> Self {
        SimError::Store(error.to_string())
    }
}
