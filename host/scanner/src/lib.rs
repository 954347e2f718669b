//! Sluice's recovery scanner (issue 6; seed 000 §9–§10, seed 001 §9): the
//! last way in for lost wake-ups, long PROCESSING and crashes. It rediscovers
//! non-terminal attempts, captures and refunds from the primary database
//! alone and drives them through the same `Orchestrator::advance` the API
//! uses (trigger `scanner`); it never writes a state itself.
//!
//! Each round ([`Scanner::scan_once`]):
//!
//! 1. reads the pending set (`due_attempts`, `due_captures`, `due_refunds`:
//!    non-terminal, `next_retry_time` passed, partial index) page by page with
//!    a cursor that lives only for the round and restarts from the beginning
//!    every round (a persisted high-water mark would skip an old row whose
//!    retry time comes later: seed 000 §10);
//! 2. asks the pure core ([`sluice_core::decide_recovery`]) what to do with
//!    each row, with a jitter drawn here;
//! 3. queries the PSP through `advance` (SUBMITTED / PROCESSING past their
//!    timeout, UNKNOWN by backoff, refunds and captures with their original
//!    reference), closes expired REQUIRES_ACTION attempts (query, cancel at
//!    the PSP if the customer step is still open, then `OrderCommand::Expire`
//!    once the PSP closed the attempt), and flags the payment of an UNKNOWN
//!    older than the configured age for manual review
//!    (`Store::flag_manual_review`, through the door);
//! 4. always moves `next_retry_time` on, so a row leaves the due set until its
//!    next look.
//!
//! Bounds: rows per page, a per-adapter concurrency limit, a budget of PSP
//! contacts per round overall and per adapter (rows over budget stay due
//! and come first next round), and a retry budget per adapter over time
//! (a token bucket on the environment's clock, [`sluice_core::TokenBucket`]:
//! a row it refuses stays in the pending set, its next look pushed by its
//! place in the queue plus jitter from the environment's entropy), so an
//! outage at one PSP neither floods it when it recovers (seed 000 §15) nor
//! starves the others. A call the orchestrator sheds for want of a PSP call
//! slot ([`Action::Shed`]) is pushed the same way, without counting a query.
//!
//! Several instances: a row is worked only under a lease (table
//! `scanner_leases`, one atomic upsert on both backends), and re-read after
//! the lease is taken: a row another instance already handled is no longer
//! due and is left alone, so two instances never query the same row at the
//! same moment, nor twice in one round.

mod due;
mod error;
mod fulfillment;
mod lease;
mod metrics;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::{decide_recovery, AttemptState, OrderCommand, PendingState, RecoveryAction};
use sluice_core::{defer_delay_ms, OrderState, RecoveryPolicy, RetryBudgetPolicy, TokenBucket};
use sluice_orchestrator::{Action, Orchestrator, Trigger};
use sluice_store::{DecisionKind, PendingKind, Provenance, ScanCursor, StoreError};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

pub use due::Due;
pub use error::ScannerError;

use lease::Leases;
use metrics::Metrics;

/// The actor recorded for order commands the scanner issues.
pub const SCANNER_ACTOR: &str = "system:scanner";

/// How the scanner is bounded and paced.
#[derive(Debug, Clone)]
pub struct ScannerConfig {
    /// Rows read per page of the pending set.
    pub batch_size: i64,
    /// PSP calls in flight at once, per adapter.
    pub per_adapter_concurrency: usize,
    /// Rows that may contact a PSP in one round, all adapters together.
    pub round_budget: u32,
    /// Rows that may contact one adapter's PSP in one round.
    pub per_adapter_round_budget: u32,
    /// Pause between rounds.
    pub round_interval: Duration,
    /// How long a lease on a row lasts; longer than a PSP call's budget, so
    /// a live holder never loses it mid-call.
    pub lease: Duration,
    pub policy: RecoveryPolicy,
    /// PSP contacts per adapter over time, across rounds (a token bucket).
    pub retry_budget: RetryBudgetPolicy,
}

impl Default for ScannerConfig {
    fn default() -> Self {
        ScannerConfig {
            batch_size: 100,
            per_adapter_concurrency: 4,
            round_budget: 500,
            per_adapter_round_budget: 200,
            round_interval: Duration::from_secs(5),
            lease: Duration::from_secs(60),
            policy: RecoveryPolicy::default(),
            retry_budget: RetryBudgetPolicy::default(),
        }
    }
}

/// What one round did (also the "scanner hits per round" figures).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Due rows read.
    pub scanned: u64,
    /// Due rows taken on for work this round: a PSP contact (query or
    /// expiry) within budget, or an escalation.
    pub hits: u64,
    /// `advance` calls that reached the PSP (query, or the first send of a
    /// CREATED row).
    pub queried: u64,
    /// Rows that reached a terminal state in this round.
    pub converged: u64,
    /// Orders closed EXPIRED after their REQUIRES_ACTION attempt closed.
    pub expired: u64,
    /// Expired REQUIRES_ACTION attempts whose cancel the PSP has not
    /// confirmed yet (see
    /// [`ItemOutcome::ExpireBlocked`]).
    pub expire_blocked: u64,
    /// UNKNOWN rows past the configured age, flagged for manual review.
    pub escalated: u64,
    /// Authorizations past their validity, queried and voided if still held.
    pub authorizations_expired: u64,
    /// Rows whose retry time was earlier than the policy's: moved on.
    pub not_yet: u64,
    /// Rows with nothing for the scanner (AUTHORIZED): taken out of the set.
    pub parked: u64,
    /// Rows left due because the round's or the adapter's budget was spent.
    pub skipped_budget: u64,
    /// Rows the adapter's retry budget refused: their next look pushed out
    /// (by their place in the queue, with jitter), still pending.
    pub deferred_budget: u64,
    /// PSP calls the orchestrator shed for want of a call slot: nothing was
    /// sent; the row's next look pushed out with jitter.
    pub shed: u64,
    /// Rows another instance held the lease on.
    pub skipped_claimed: u64,
    /// Rows no longer due when re-read under the lease.
    pub skipped_stale: u64,
    /// Rows whose handling failed (logged; they stay due).
    pub errors: u64,
    /// Due fulfillments woken up (issue 7).
    pub fulfillment_checks: u64,
    /// Fulfillment checks that raised the contradictory-fact alert.
    pub fulfillment_alerts: u64,
}

/// What happened to one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// `advance` ran; `state_after` is the row's state afterwards.
    Advanced {
        action: Action,
        state_after: String,
        converged: bool,
    },
    /// The attempt closed and the order is EXPIRED.
    Expired,
    /// The customer's step expired but the attempt is still open at the PSP
    /// (or the order refused `Expire`): `reason` says which. Rescheduled.
    ExpireBlocked { reason: String },
    /// UNKNOWN past the configured age: the payment was flagged for manual
    /// review through the store's door. Rescheduled (queries go on).
    Escalated { age_ms: i64 },
    /// An authorization past its validity was queried and, if the PSP still
    /// held it, voided; `state_after` is the attempt's state afterwards.
    AuthorizationExpired { state_after: String },
    /// Not due by the policy yet: moved to its due time.
    NotYet,
    /// Nothing for the scanner: taken out of the pending set.
    Parked,
    /// Another instance holds the lease.
    Claimed,
    /// Terminal or no longer due when re-read: left alone.
    Stale,
    /// A fulfillment was checked (`CheckDue`, and in pull mode the fact).
    Fulfillment {
        state_after: String,
        decision: &'static str,
        alert: bool,
    },
}

/// The recovery scanner. Cheap to clone; clones share limits and metrics.
#[derive(Clone)]
pub struct Scanner {
    inner: Arc<Inner>,
}

struct Inner {
    orch: Orchestrator,
    config: ScannerConfig,
    leases: Leases,
    /// Per-adapter concurrency limits, kept across rounds.
    limits: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Per-adapter retry budgets, kept across rounds.
    budgets: Mutex<HashMap<String, TokenBucket>>,
    metrics: Option<Metrics>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Scanner {
    /// A scanner without Prometheus metrics.
    pub fn new(orch: Orchestrator, config: ScannerConfig) -> Result<Scanner, ScannerError> {
        Scanner::build(orch, config, None)
    }

    /// A scanner whose counters are registered in `registry`.
    pub fn with_metrics(
        orch: Orchestrator,
        config: ScannerConfig,
        registry: &prometheus::Registry,
    ) -> Result<Scanner, ScannerError> {
        let metrics = Metrics::register(registry)?;
        Scanner::build(orch, config, Some(metrics))
    }

    fn build(
        orch: Orchestrator,
        config: ScannerConfig,
        metrics: Option<Metrics>,
    ) -> Result<Scanner, ScannerError> {
        if config.batch_size < 1 || config.per_adapter_concurrency < 1 {
            return Err(ScannerError::Config(
                "batch_size and per_adapter_concurrency must be at least 1".into(),
            ));
        }
        let holder = format!("scanner-{}", orch.store().env().uuid_v4().simple());
        let lease_ms = i64::try_from(config.lease.as_millis()).unwrap_or(i64::MAX);
        let leases = Leases::new(orch.store().clone(), holder, lease_ms);
        Ok(Scanner {
            inner: Arc::new(Inner {
                orch,
                config,
                leases,
                limits: Mutex::new(HashMap::new()),
                budgets: Mutex::new(HashMap::new()),
                metrics,
            }),
        })
    }

    pub fn config(&self) -> &ScannerConfig {
        &self.inner.config
    }

    /// Scan round after round until `shutdown` turns true (or its sender is
    /// dropped). A failed round is logged and the next one starts on time.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!("recovery scanner started");
        loop {
            if *shutdown.borrow() {
                break;
            }
            match self.scan_once().await {
                Ok(report) if report.hits > 0 => tracing::info!(?report, "scanner round"),
                Ok(report) => tracing::debug!(?report, "scanner round"),
                Err(error) => tracing::warn!(error = %error, "scanner round failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.inner.config.round_interval) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        tracing::info!("recovery scanner stopped");
    }

    /// One round over the pending set; returns when every row it took on is done.
    pub async fn scan_once(&self) -> Result<ScanReport, ScannerError> {
        let started = Instant::now();
        let mut round = Round::default();
        let mut tasks = JoinSet::new();
        for kind in [
            PendingKind::Attempt,
            PendingKind::Capture,
            PendingKind::Refund,
        ] {
            if !self.scan_kind(kind, &mut round, &mut tasks).await? {
                break;
            }
        }
        self.scan_fulfillments(&mut round, &mut tasks).await?;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(outcome)) => round.report.count(&outcome),
                Ok(Err(_)) | Err(_) => round.report.errors += 1,
            }
        }
        let report = round.report;
        if let Some(metrics) = &self.inner.metrics {
            metrics.round(&report);
        }
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scanner round done"
        );
        Ok(report)
    }

    /// Page through one kind's due rows. False once the round's budget is spent.
    async fn scan_kind(
        &self,
        kind: PendingKind,
        round: &mut Round,
        tasks: &mut JoinSet<Result<ItemOutcome, ScannerError>>,
    ) -> Result<bool, ScannerError> {
        let store = self.inner.orch.store();
        let batch = self.inner.config.batch_size;
        // The cursor lives for this round only (seed 000 §10).
        let mut cursor: Option<ScanCursor> = None;
        loop {
            let now = store.now_ms();
            let page: Vec<Due> = match kind {
                PendingKind::Attempt => {
                    into_due(store.due_attempts(now, batch, cursor.as_ref()).await?)
                }
                PendingKind::Capture => {
                    into_due(store.due_captures(now, batch, cursor.as_ref()).await?)
                }
                PendingKind::Refund => {
                    into_due(store.due_refunds(now, batch, cursor.as_ref()).await?)
                }
            };
            let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= batch;
            cursor = page.last().map(|last| ScanCursor {
                next_retry_time: last.next_retry_time.unwrap_or(now),
                id: last.id.clone(),
            });
            for due in page {
                round.report.scanned += 1;
                if round.spent(self.inner.config.round_budget) {
                    round.report.skipped_budget += 1;
                    continue;
                }
                self.dispatch(due, now, round, tasks).await;
            }
            if round.spent(self.inner.config.round_budget) {
                return Ok(false);
            }
            if !full || cursor.is_none() {
                return Ok(true);
            }
        }
    }

    /// Decide on one scanned row: PSP work goes to a task under the adapter's
    /// limit; scheduling-only work is done here.
    async fn dispatch(
        &self,
        due: Due,
        now: i64,
        round: &mut Round,
        tasks: &mut JoinSet<Result<ItemOutcome, ScannerError>>,
    ) {
        let action = match self.decide(&due, now).await {
            Ok((action, escalated)) => {
                if escalated {
                    round.report.escalated += 1;
                }
                action
            }
            Err(error) => {
                tracing::warn!(error = %error, payment_id = %due.payment_id, id = %due.id, "scanner could not read a row");
                round.report.errors += 1;
                return;
            }
        };
        if action.psp_reference_used().is_none() {
            match self.act_locally(&due, &action).await {
                Ok(outcome) => round.report.count(&outcome),
                Err(error) => {
                    tracing::warn!(error = %error, payment_id = %due.payment_id, id = %due.id, "scanner could not reschedule a row");
                    round.report.errors += 1;
                }
            }
            return;
        }
        let used = round.per_adapter.entry(due.adapter.clone()).or_default();
        if *used >= self.inner.config.per_adapter_round_budget {
            round.report.skipped_budget += 1;
            return;
        }
        if !self.take_retry_token(&due.adapter, now) {
            self.defer_over_budget(&due, now, round).await;
            return;
        }
        *used += 1;
        round.report.hits += 1;
        round.contacts += 1;
        let limit = self.limit(&due.adapter);
        let this = self.clone();
        let span = tracing::info_span!("scanner.recover", payment_id = %due.payment_id,
            attempt_id = %due.attempt_id, adapter = %due.adapter,
            kind = due::kind_label(due.kind), id = %due.id);
        tasks.spawn(
            async move {
                // Closed only if the scanner is dropped mid-round; then nothing is sent.
                let Ok(_permit) = limit.acquire_owned().await else {
                    return Ok(ItemOutcome::Stale);
                };
                let result = this.recover_one(due.kind, &due.id).await;
                if let Err(error) = &result {
                    tracing::warn!(error = %error, "scanner could not recover a row");
                }
                result
            }
            .instrument(span),
        );
    }

    /// One token of the adapter's retry budget, if it has one at `now`.
    fn take_retry_token(&self, adapter: &str, now: i64) -> bool {
        let mut budgets = match self.inner.budgets.lock() {
            Ok(guard) => guard,
            // Buckets are plain values updated in place: a panic elsewhere
            // cannot leave one inconsistent.
            Err(poisoned) => poisoned.into_inner(),
        };
        let policy = self.inner.config.retry_budget;
        budgets
            .entry(adapter.to_owned())
            .or_insert_with(|| TokenBucket::new(policy, now))
            .try_take(now)
    }

    /// The retry budget refused a row: it stays pending, its next look
    /// pushed by how many of the adapter's rows it refused before it this
    /// round, plus jitter, so the backlog returns at about the budget's rate
    /// and never all at once. Nothing is counted as a query.
    async fn defer_over_budget(&self, due: &Due, now: i64, round: &mut Round) {
        let queued = round.deferred.entry(due.adapter.clone()).or_default();
        *queued = queued.saturating_add(1);
        let jitter = self.inner.orch.store().env().entropy.unit();
        let delay = defer_delay_ms(*queued, &self.inner.config.retry_budget, jitter);
        round.report.deferred_budget += 1;
        if let Some(metrics) = &self.inner.metrics {
            metrics.deferred(&due.adapter);
        }
        let store = self.inner.orch.store();
        if let Err(error) = due::set_next_look(store, due, Some(now.saturating_add(delay))).await {
            tracing::warn!(error = %error, payment_id = %due.payment_id, id = %due.id,
                "scanner could not push a row over the retry budget; it stays due");
            round.report.errors += 1;
        }
    }

    fn limit(&self, adapter: &str) -> Arc<Semaphore> {
        let mut limits = match self.inner.limits.lock() {
            Ok(guard) => guard,
            // A panic elsewhere cannot leave the map inconsistent: entries are
            // only ever inserted whole.
            Err(poisoned) => poisoned.into_inner(),
        };
        limits
            .entry(adapter.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.inner.config.per_adapter_concurrency)))
            .clone()
    }

    /// What the policy says for a row. An escalation is carried out here
    /// (the flag, through the door, recorded once) and the row is then
    /// decided again as flagged: escalating adds a flag and never takes the
    /// place of a query. Returns whether this call raised the flag.
    async fn decide(&self, due: &Due, now: i64) -> Result<(RecoveryAction, bool), ScannerError> {
        let policy = &self.inner.config.policy;
        let validity = match (&due.connector_account_id, due.is_authorized()) {
            (Some(account), true) => self
                .inner
                .orch
                .connector_recovery(account)
                .await?
                .authorization_validity_ms(),
            _ => None,
        };
        let jitter = self.inner.orch.store().env().entropy.unit();
        // Only a row past the age can be escalated, so only then is the order read.
        let old = now.saturating_sub(due.created_at) >= policy.max_unknown_age_ms;
        let in_review = old
            && self
                .inner
                .orch
                .store()
                .get_payment(None, &due.payment_id)
                .await?
                .manual_review;
        let item = |in_review| due.pending_item(in_review, validity);
        let action = decide_recovery(&item(in_review), now, jitter, policy);
        let RecoveryAction::EscalateToManualReview { age_ms, .. } = action else {
            return Ok((action, false));
        };
        if !self.escalate(due, age_ms).await? {
            // Terminal meanwhile: the escalation stands unflagged, and
            // `act_locally` leaves the row alone.
            return Ok((action, false));
        }
        Ok((decide_recovery(&item(true), now, jitter, policy), true))
    }

    /// Flag the row's payment for an operator, through the door: flag,
    /// reason, one history row and `payment.needs_review` in one
    /// transaction, no state change. False when the row turned terminal.
    async fn escalate(&self, due: &Due, age_ms: i64) -> Result<bool, ScannerError> {
        let reason = format!(
            "{} {} {} for {} s, past the {} s limit: an operator must decide",
            due::kind_label(due.kind),
            due.id,
            if due.state.is_unknown() {
                "UNKNOWN"
            } else if due.void_requested_at.is_some() {
                "AUTHORIZED with a void the PSP has not confirmed"
            } else {
                "still open"
            },
            age_ms / 1000,
            self.inner.config.policy.max_unknown_age_ms / 1000
        );
        let applied = self
            .inner
            .orch
            .store()
            .flag_manual_review(
                due.kind,
                &due.id,
                &reason,
                &Provenance::actor(SCANNER_ACTOR),
            )
            .await?;
        tracing::warn!(payment_id = %due.payment_id, attempt_id = %due.attempt_id,
            adapter = %due.adapter, kind = due::kind_label(due.kind), id = %due.id,
            age_ms, decision = applied.decision.as_str(),
            "pending past its age: flagged for manual review; queries go on");
        Ok(applied.decision != DecisionKind::IgnoredStale)
    }

    /// Recover one row now, under a lease: re-read it from the primary, and
    /// if it is still due, do what the policy says. A row that is terminal,
    /// no longer due, or leased by another instance is left alone.
    pub async fn recover_one(
        &self,
        kind: PendingKind,
        id: &str,
    ) -> Result<ItemOutcome, ScannerError> {
        let leases = &self.inner.leases;
        if !leases.claim(kind, id).await? {
            return Ok(ItemOutcome::Claimed);
        }
        let result = self.recover_claimed(kind, id).await;
        let released = leases.release(kind, id).await;
        let outcome = result?;
        released?;
        Ok(outcome)
    }

    async fn recover_claimed(
        &self,
        kind: PendingKind,
        id: &str,
    ) -> Result<ItemOutcome, ScannerError> {
        let store = self.inner.orch.store();
        let due = due::load(store, kind, id).await?;
        let now = store.now_ms();
        if !due.is_due(now) {
            return Ok(ItemOutcome::Stale);
        }
        // Under the lease the flag is up already if dispatch escalated; a
        // direct call escalates here, and the row is queried all the same.
        let (action, escalated) = self.decide(&due, now).await?;
        if escalated && action.psp_reference_used().is_none() {
            self.act_locally(&due, &action).await?;
            return Ok(ItemOutcome::Escalated {
                age_ms: now.saturating_sub(due.created_at),
            });
        }
        match &action {
            RecoveryAction::QueryPsp {
                next_retry_at_ms, ..
            }
            | RecoveryAction::QueryWithBackoff {
                next_retry_at_ms, ..
            } => self.query(&due, next_retry_at_ms - now).await,
            RecoveryAction::ExpireRequiresAction {
                next_retry_at_ms, ..
            } => self.expire(&due, next_retry_at_ms - now).await,
            RecoveryAction::ExpireAuthorization {
                next_retry_at_ms, ..
            } => {
                self.expire_authorization(&due, next_retry_at_ms - now)
                    .await
            }
            _ => self.act_locally(&due, &action).await,
        }
    }

    /// Ask the PSP through `advance`, then schedule the next look `delay_ms`
    /// after the call ended (the policy counts its backoff from the last
    /// PSP contact, so a look scheduled from before the call would come back
    /// too early and be turned away).
    async fn query(&self, due: &Due, delay_ms: i64) -> Result<ItemOutcome, ScannerError> {
        let orch = &self.inner.orch;
        if let Some(metrics) = &self.inner.metrics {
            metrics.query(&due.adapter);
        }
        let advanced = orch.advance(due.target(), Trigger::Scanner).await?;
        let after = due::load(orch.store(), due.kind, &due.id).await?;
        let converged = after.state.is_terminal();
        if matches!(advanced.action, Action::Shed { .. }) {
            self.push_after_shed(&after).await?;
        } else if !converged {
            self.schedule_after_query(&after, delay_ms).await?;
        }
        Ok(ItemOutcome::Advanced {
            action: advanced.action,
            state_after: advanced.state_after,
            converged,
        })
    }

    /// Nothing left the host: the next look a round interval or so later,
    /// jittered, without counting a query or restarting the backoff.
    async fn push_after_shed(&self, after: &Due) -> Result<(), ScannerError> {
        let store = self.inner.orch.store();
        let round_ms =
            i64::try_from(self.inner.config.round_interval.as_millis()).unwrap_or(i64::MAX);
        let jitter = store.env().entropy.unit();
        let delay = round_ms
            .saturating_add((round_ms as f64 * jitter) as i64)
            .max(1);
        due::set_next_look(store, after, Some(store.now_ms().saturating_add(delay))).await?;
        Ok(())
    }

    /// A row still pending after a PSP contact: count the query and push the
    /// next look out (an AUTHORIZED attempt is then looked at again and waits
    /// for its validity to end).
    async fn schedule_after_query(&self, after: &Due, delay_ms: i64) -> Result<(), ScannerError> {
        let store = self.inner.orch.store();
        match store
            .reschedule_after(after.kind, &after.id, delay_ms)
            .await
        {
            // Turned terminal in between (a webhook): nothing to schedule.
            Ok(()) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// The customer's step expired: query once more (they may have finished),
    /// cancel the attempt at the PSP if it still waits for them, and once the
    /// attempt is closed, expire the order through the door.
    async fn expire(&self, due: &Due, delay_ms: i64) -> Result<ItemOutcome, ScannerError> {
        let queried = self.query(due, delay_ms).await?;
        let store = self.inner.orch.store();
        let mut after = due::load(store, due.kind, &due.id).await?;
        let cancel_sent = after.state == PendingState::Attempt(AttemptState::RequiresAction);
        if cancel_sent {
            // Closing only our side would leave a step the customer could
            // still complete at the PSP: money taken on an expired order.
            self.inner
                .orch
                .cancel_expired_attempt(&due.payment_id, &due.attempt_id)
                .await?;
            after = due::load(store, due.kind, &due.id).await?;
        }
        match after.state {
            PendingState::Attempt(AttemptState::Failed | AttemptState::Canceled) => {
                let applied = store
                    .apply_order_command(
                        &due.payment_id,
                        OrderCommand::Expire,
                        &Provenance::actor(SCANNER_ACTOR),
                    )
                    .await?;
                let expired = applied.order_state == OrderState::Expired
                    && matches!(
                        applied.decision,
                        DecisionKind::Applied | DecisionKind::IgnoredDuplicate
                    );
                if expired {
                    Ok(ItemOutcome::Expired)
                } else {
                    Ok(ItemOutcome::ExpireBlocked {
                        reason: format!("order refused Expire: {}", applied.reason),
                    })
                }
            }
            PendingState::Attempt(AttemptState::RequiresAction) => {
                tracing::warn!(payment_id = %due.payment_id, attempt_id = %due.attempt_id,
                    adapter = %due.adapter,
                    "expired customer step: the PSP has not confirmed the cancel yet; retried next scan");
                Ok(ItemOutcome::ExpireBlocked {
                    reason: "cancel of the expired customer step not confirmed by the PSP yet"
                        .into(),
                })
            }
            // Asynchronous PSPs (Adyen format) only acknowledge the cancel and
            // confirm it by notification: the attempt closes then, and the
            // order stays open for the merchant (a new attempt or a cancel).
            _ if cancel_sent && !after.state.is_terminal() => Ok(ItemOutcome::ExpireBlocked {
                reason:
                    "cancel of the expired customer step acknowledged; the PSP confirms it later"
                        .into(),
            }),
            _ => Ok(queried),
        }
    }

    /// The authorization's validity ended: query, and void what the PSP still
    /// holds (recorded as sent first); the PSP's PAYMENT_CANCELED closes the
    /// attempt and the order. A void without an answer yet is followed on the
    /// next looks (and reaches an operator by age).
    async fn expire_authorization(
        &self,
        due: &Due,
        delay_ms: i64,
    ) -> Result<ItemOutcome, ScannerError> {
        let orch = &self.inner.orch;
        if let Some(metrics) = &self.inner.metrics {
            metrics.query(&due.adapter);
        }
        let state = orch.expire_authorization(&due.id).await?;
        let after = due::load(orch.store(), due.kind, &due.id).await?;
        if !after.state.is_terminal() {
            self.schedule_after_query(&after, delay_ms).await?;
        }
        tracing::info!(payment_id = %due.payment_id, attempt_id = %due.attempt_id,
            adapter = %due.adapter, state = %state, "authorization past its validity");
        Ok(ItemOutcome::AuthorizationExpired {
            state_after: state.to_string(),
        })
    }

    /// Scheduling-only actions: no PSP contact, no lease needed (the write
    /// compares on the retry time it read).
    async fn act_locally(
        &self,
        due: &Due,
        action: &RecoveryAction,
    ) -> Result<ItemOutcome, ScannerError> {
        let store = self.inner.orch.store();
        match action {
            RecoveryAction::NotYet { next_retry_at_ms } => {
                due::set_next_look(store, due, Some(*next_retry_at_ms)).await?;
                Ok(ItemOutcome::NotYet)
            }
            RecoveryAction::Nothing if !due.state.is_terminal() => {
                due::set_next_look(store, due, None).await?;
                Ok(ItemOutcome::Parked)
            }
            _ => Ok(ItemOutcome::Stale),
        }
    }
}

#[derive(Default)]
struct Round {
    report: ScanReport,
    /// Rows handed to a PSP-contacting task this round.
    contacts: u32,
    per_adapter: HashMap<String, u32>,
    /// Rows the retry budget refused this round, per adapter.
    deferred: HashMap<String, u32>,
}

impl Round {
    fn spent(&self, budget: u32) -> bool {
        self.contacts >= budget
    }
}

impl ScanReport {
    fn count(&mut self, outcome: &ItemOutcome) {
        match outcome {
            ItemOutcome::Advanced {
                action, converged, ..
            } => {
                if matches!(action, Action::Shed { .. }) {
                    self.shed += 1;
                }
                if matches!(
                    action,
                    Action::Queried { .. } | Action::Sent { .. } | Action::Resent { .. }
                ) {
                    self.queried += 1;
                }
                if *converged {
                    self.converged += 1;
                }
            }
            ItemOutcome::Expired => {
                self.queried += 1;
                self.expired += 1;
            }
            ItemOutcome::ExpireBlocked { .. } => {
                self.queried += 1;
                self.expire_blocked += 1;
            }
            ItemOutcome::Escalated { .. } => self.escalated += 1,
            ItemOutcome::AuthorizationExpired { .. } => {
                self.queried += 1;
                self.authorizations_expired += 1;
            }
            ItemOutcome::NotYet => self.not_yet += 1,
            ItemOutcome::Parked => self.parked += 1,
            ItemOutcome::Claimed => self.skipped_claimed += 1,
            ItemOutcome::Stale => self.skipped_stale += 1,
            ItemOutcome::Fulfillment { alert, .. } => {
                if *alert {
                    self.fulfillment_alerts += 1;
                }
            }
        }
    }
}

fn into_due<T: Into<Due>>(rows: Vec<T>) -> Vec<Due> {
    rows.into_iter().map(Into::into).collect()
}
