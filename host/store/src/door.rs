//! The one door: every state change of an order, attempt, capture or refund
//! is a decision of the pure core, applied here inside one transaction:
//!
//! 1. inbox dedupe (an inbox row already processed → ignored as duplicate);
//! 2. read the snapshot: the order first (its version is the payment-wide
//!    sequence every change bumps), then amounts and the aggregate;
//! 3. the core decides;
//! 4. CAS `WHERE id = ? AND version = ?` on the order and the aggregate(s);
//!    amount effects as conditional updates;
//! 5. append history, for every decision (applied, ignored, rejected,
//!    needs-reconciliation), with its reason and evidence;
//! 6. write the outbox rows the decision emits; mark the inbox row processed.
//!
//! A CAS that touches no row means someone else committed first: roll back,
//! re-read and decide again, a bounded number of times.
//!
//! On PostgreSQL "one transaction" is usually one statement outside any
//! transaction ([`Door::Alone`]): the reads are single statements under read
//! committed, as they are inside a transaction there, and the writes are one
//! statement that checks itself and commits all or none
//! ([`batch::Batch::run_alone`]), which saves the `BEGIN` and `COMMIT` round
//! trips. Writes that need more than one statement (two amount movements,
//! a fulfillment that follows the payment) take the try again in a
//! transaction. SQLite always runs the try in its write transaction.
//!
//! Lock order, everywhere in the store: payment order row → the aggregate
//! (attempt, capture, refund) → amounts → history, outbox, inbox. Keeping
//! one order is what keeps concurrent PostgreSQL transactions deadlock-free.
//!
//! Ignored, rejected and needs-reconciliation decisions also "CAS" the order
//! (a version-preserving update), so every recorded decision was taken on the
//! state that was current when it committed.

pub(crate) mod batch;
mod fresh;
mod locate;
pub use fresh::FirstSend;
pub(crate) use fresh::FreshSent;
use locate::OwnReference;
mod operator;

pub use locate::{psp_reference_lookups, AccountScope};
pub use operator::{ESCALATE_KIND, RECONCILIATION_KIND, RESOLVE_KIND};

use crate::adapter_releases::AdapterPin;
use crate::db::{Conn, Tx};
use crate::fulfillment;
use crate::history::{self, NewHistory, Provenance};
use crate::outbox::{self, NewOutboxEvent};
use crate::payments::{
    self, attempt_in, capture_in, command_kind, order_and_amounts_in, order_in, refund_in,
    AttemptHead, PaymentAmounts, PaymentAttempt, PaymentOrder,
};
use crate::{Env, Store, StoreError};
use batch::{Batch, Bind, Expect, Outcome, Write};
use sluice_core::{
    cancel_unsent_refund, decide_attempt, decide_capture, decide_order, decide_refund, Aggregate,
    AttemptState, CaptureState, CompensationRefundOutcome, Decision, Effect, EventIdentity,
    EventKind, FulfillmentInput, IgnoreReason, OrderCommand, OrderState, OutboxEvent, PaymentEvent,
    RefundState,
};
use sqlx::Row;
use std::time::Duration;
use tracing::Instrument;

/// How many times a decision is re-taken after losing a CAS race.
pub const MAX_CAS_TRIES: u32 = 5;

/// Which aggregate an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTarget {
    /// By the host's attempt reference (sync responses, queries, timeouts).
    Attempt(String),
    /// By the host's refund reference.
    Refund(String),
    /// By the host's capture reference.
    Capture(String),
    /// By the PSP's reference of the payment or refund, within the account.
    PspReference {
        scope: AccountScope,
        psp_reference: String,
    },
    /// From the references the event itself carries (webhooks, and events of
    /// an answer about another aggregate than the call's): attempt
    /// reference, action reference, PSP references, within the account.
    FromEvent { scope: AccountScope },
}

/// One event to put through the door.
#[derive(Debug, Clone)]
pub struct ApplyEvent {
    pub target: EventTarget,
    pub event: PaymentEvent,
    pub provenance: Provenance,
    /// The inbox row the event came from; marked processed in the same
    /// transaction, and a row already processed makes the event a duplicate.
    pub inbox_id: Option<String>,
    /// When the recovery scanner should next look at the aggregate, if the
    /// decision leaves it non-terminal (e.g. the timeout of a submitted call).
    pub next_retry_time: Option<i64>,
}

impl ApplyEvent {
    /// An event for `target` from no inbox row, leaving the scanner's next
    /// look to the decision.
    pub fn new(target: EventTarget, event: PaymentEvent, provenance: Provenance) -> ApplyEvent {
        ApplyEvent {
            target,
            event,
            provenance,
            inbox_id: None,
            next_retry_time: None,
        }
    }
}

/// A call recorded as sent by the decision that records it ([`Store::apply_sent`]).
/// When that decision is applied, the same write of the subject row also
/// takes the time of the call (`last_psp_call_at`, which the recovery budget
/// reads) and, for an attempt's first send, the adapter version that built
/// its request: a pin already there is kept. One transaction instead of three.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentCall {
    pub pin: Option<AdapterPin>,
    /// The rows the caller decided to send from (its read, or the create
    /// that wrote them). The decision's first try starts from them instead
    /// of reading them again: they are the rows of the order's version they
    /// name, and a stale one costs only that try, whose write's version check
    /// misses; the next try reads. Used only for an event naming this
    /// attempt's reference.
    pub known: Option<AttemptHead>,
}

/// The kind of decision taken, as recorded in history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionKind {
    Applied,
    IgnoredDuplicate,
    IgnoredStale,
    Rejected,
    NeedsReconciliation,
}

impl DecisionKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            DecisionKind::Applied => "applied",
            DecisionKind::IgnoredDuplicate => "ignored_duplicate",
            DecisionKind::IgnoredStale => "ignored_stale",
            DecisionKind::Rejected => "rejected",
            DecisionKind::NeedsReconciliation => "needs_reconciliation",
        }
    }
}

/// What the door did.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub decision: DecisionKind,
    /// The matrix rule applied, or why nothing changed.
    pub reason: String,
    pub payment_id: String,
    pub aggregate: Aggregate,
    pub aggregate_id: String,
    pub from_state: String,
    /// The aggregate's state after the decision.
    pub to_state: String,
    pub aggregate_version: i64,
    pub payment_version: i64,
    pub order_state: OrderState,
    pub history_ids: Vec<i64>,
    pub outbox_event_ids: Vec<String>,
    /// 1 unless CAS races forced the decision to be re-taken.
    pub tries: u32,
    /// The rows an applied decision about an attempt left, when it moved
    /// nothing but the order and that attempt: what the attempt's next step
    /// can start from without reading them ([`Store::apply_event_from`]).
    pub after: Option<AttemptHead>,
}

/// A state the store can write: its stored name and whether it is final.
trait StoredState: Copy {
    fn text(&self) -> &'static str;
    fn terminal(&self) -> bool;
}

macro_rules! stored_state {
    ($($t:ty),*) => {$(
        impl StoredState for $t {
            fn text(&self) -> &'static str { self.as_str() }
            fn terminal(&self) -> bool { self.is_terminal() }
        }
    )*};
}
stored_state!(AttemptState, RefundState, CaptureState, OrderState);

/// A core decision with its state type erased.
#[derive(Debug, Clone)]
struct Verdict {
    kind: DecisionKind,
    reason: String,
    /// For `Applied`: the aggregate's new state and whether it is final.
    new_state: Option<(&'static str, bool)>,
    cascade_attempt: Option<AttemptState>,
    cascade_order: Option<OrderState>,
    effects: Vec<Effect>,
}

impl Verdict {
    fn of<S: StoredState>(decision: Decision<S>) -> Verdict {
        let reason = decision.explain();
        let mut verdict = Verdict {
            kind: DecisionKind::Rejected,
            reason,
            new_state: None,
            cascade_attempt: None,
            cascade_order: None,
            effects: Vec::new(),
        };
        match decision {
            Decision::Apply {
                new_state,
                cascade,
                effects,
                ..
            } => {
                verdict.kind = DecisionKind::Applied;
                verdict.new_state = Some((new_state.text(), new_state.terminal()));
                verdict.cascade_attempt = cascade.attempt;
                verdict.cascade_order = cascade.order;
                verdict.effects = effects;
            }
            Decision::Ignore(IgnoreReason::Duplicate) => {
                verdict.kind = DecisionKind::IgnoredDuplicate
            }
            Decision::Ignore(IgnoreReason::Stale) => verdict.kind = DecisionKind::IgnoredStale,
            Decision::Reject(_) => verdict.kind = DecisionKind::Rejected,
            Decision::NeedsReconciliation(_) => verdict.kind = DecisionKind::NeedsReconciliation,
        }
        verdict
    }

    fn duplicate(reason: String) -> Verdict {
        Verdict {
            kind: DecisionKind::IgnoredDuplicate,
            reason,
            new_state: None,
            cascade_attempt: None,
            cascade_order: None,
            effects: Vec::new(),
        }
    }

    fn emits(&self) -> impl Iterator<Item = OutboxEvent> + '_ {
        self.effects.iter().filter_map(|e| match e {
            Effect::Emit(event) => Some(*event),
            _ => None,
        })
    }
}

/// The aggregate a decision is about, as read in this try.
#[derive(Debug, Clone)]
struct Subject {
    aggregate: Aggregate,
    table: &'static str,
    id: String,
    state: &'static str,
    version: i64,
    reference: Option<String>,
    psp_reference: Option<String>,
    next_retry_time: Option<i64>,
    /// The attempt's row as read, when the subject is an attempt.
    attempt: Option<PaymentAttempt>,
}

/// What the decision was about, for history rows.
#[derive(Debug, Clone, Copy)]
enum Input<'a> {
    Event(&'a PaymentEvent),
    Command(&'static str),
}

/// Everything one try needs to carry a verdict out.
struct Plan<'a> {
    order: PaymentOrder,
    amounts: PaymentAmounts,
    subject: Subject,
    /// The attempt a capture belongs to (for the capture → attempt cascade).
    capture_attempt: Option<PaymentAttempt>,
    verdict: Verdict,
    input: Input<'a>,
    provenance: &'a Provenance,
    inbox_id: Option<&'a str>,
    /// The inbox row was already processed: the verdict is that duplicate,
    /// and there is nothing to mark.
    inbox_done: bool,
    next_retry_time: Option<i64>,
    /// The decision records a call about to be sent.
    sent: Option<&'a SentCall>,
}

impl<'a> Plan<'a> {
    /// A command's plan: no PSP evidence, no inbox row, no capture cascade.
    fn command(
        (order, amounts, subject): (PaymentOrder, PaymentAmounts, Subject),
        verdict: Verdict,
        kind: &'static str,
        provenance: &'a Provenance,
    ) -> Plan<'a> {
        Plan {
            order,
            amounts,
            subject,
            capture_attempt: None,
            verdict,
            input: Input::Command(kind),
            provenance,
            inbox_id: None,
            inbox_done: false,
            next_retry_time: None,
            sent: None,
        }
    }
}

impl Plan<'_> {
    /// Whether an applied decision's fulfillment follows the payment in the
    /// same commit (its writes after the batch).
    fn follows(&self) -> bool {
        self.order.fulfillment.mode.is_some()
    }

    /// Whether the decision's writes are more than one statement: a
    /// fulfillment that follows, or more than one amount movement (each moves
    /// the one amounts row, so they run one by one).
    fn needs_transaction(&self) -> bool {
        let verdict = &self.verdict;
        let movements = (verdict.effects.iter())
            .filter(|effect| amount_write(&self.order.id, effect).is_some())
            .count();
        verdict.kind == DecisionKind::Applied && (self.follows() || movements > 1)
    }

    /// The event's identity as stored on the aggregate and in history.
    fn identity(&self) -> Option<EventIdentity> {
        match self.input {
            Input::Event(event) => Some(EventIdentity::of(event)),
            Input::Command(_) => None,
        }
    }
}

/// The end of one try: done (commit), or lost a CAS race (roll back, re-decide).
pub(crate) enum Step<T> {
    Done(T),
    Retry,
}

/// Where one try of the door reads and writes.
pub(crate) enum Door<'a> {
    /// Inside the try's write transaction: on SQLite always (its
    /// `BEGIN IMMEDIATE` is the write lock the reads are taken under), on
    /// PostgreSQL when the decision's writes are more than one statement.
    InTx(&'a mut Conn),
    /// PostgreSQL: a connection outside any transaction. The reads are single
    /// statements under read committed, exactly as they would be inside one
    /// (the order's version is what makes a decision current, checked by its
    /// writes); the writes are one statement that checks itself and commits
    /// all of them or none ([`Batch::run_alone`]). A decision whose writes
    /// cannot be one statement comes back `None` from
    /// [`Store::carry_out`], and the try is taken again in a transaction.
    Alone(&'a mut Conn),
}

impl Door<'_> {
    fn conn(&mut self) -> &mut Conn {
        match self {
            Door::InTx(conn) | Door::Alone(conn) => conn,
        }
    }

    /// Run a decision's writes; `None` when they cannot run outside a
    /// transaction: more than one statement, or `follows` (the fulfillment
    /// follows the payment in the same commit).
    async fn write(
        &mut self,
        batch: &Batch,
        backend: crate::Backend,
        follows: bool,
    ) -> Result<Option<Outcome>, StoreError> {
        match self {
            Door::InTx(conn) => batch.run(conn, backend).await.map(Some),
            Door::Alone(_) if follows || batch.needs_transaction() => Ok(None),
            Door::Alone(conn) => batch.run_alone(conn).await.map(Some),
        }
    }
}

/// A step taken inside a transaction, which never asks for one.
fn in_tx<T>(step: Option<Step<T>>) -> Result<Step<T>, StoreError> {
    step.ok_or_else(|| {
        StoreError::Unapplicable("a door decision inside a transaction asked for one".into())
    })
}

/// Finish one try of a door decision: commit a decision that was carried
/// out, or roll back a lost CAS race and back off before the next try.
async fn finish_try(
    env: &Env,
    tx: Tx,
    step: Step<Applied>,
    tries: u32,
) -> Result<Option<Applied>, StoreError> {
    match step {
        Step::Done(mut applied) => {
            crate::db::commit_write(env, tx).await?;
            applied.tries = tries;
            log_applied(&applied);
            Ok(Some(applied))
        }
        Step::Retry => {
            tx.rollback().await?;
            cas_backoff(env, tries).await;
            Ok(None)
        }
    }
}

/// [`finish_try`] for a try outside a transaction ([`Door::Alone`]): a
/// decision carried out has committed with its statement; a lost race wrote
/// nothing.
async fn finish_alone(
    env: &Env,
    step: Step<Applied>,
    tries: u32,
) -> Result<Option<Applied>, StoreError> {
    match step {
        Step::Done(mut applied) => {
            env.reached(crate::env::AwaitPoint::AfterCommit).await;
            applied.tries = tries;
            log_applied(&applied);
            Ok(Some(applied))
        }
        Step::Retry => {
            cas_backoff(env, tries).await;
            Ok(None)
        }
    }
}

impl Store {
    /// Apply one normalised event: the only way an attempt, capture or refund
    /// (and through them the order and the amounts) changes state.
    pub async fn apply_event(&self, input: &ApplyEvent) -> Result<Applied, StoreError> {
        self.apply_event_with(input, None, None).await
    }

    /// [`Store::apply_event`] for the record of a call about to be sent
    /// (an `*_SUBMITTED` event before the send): see [`SentCall`].
    pub async fn apply_sent(
        &self,
        input: &ApplyEvent,
        sent: &SentCall,
    ) -> Result<Applied, StoreError> {
        self.apply_event_with(input, Some(sent), sent.known.as_ref())
            .await
    }

    /// [`Store::apply_event`] whose first try starts from `known` rows (an
    /// earlier decision's [`Applied::after`]) instead of reading them, as a
    /// [`SentCall`]'s do: when the event names that attempt's reference.
    pub async fn apply_event_from(
        &self,
        input: &ApplyEvent,
        known: Option<&AttemptHead>,
    ) -> Result<Applied, StoreError> {
        self.apply_event_with(input, None, known).await
    }

    async fn apply_event_with(
        &self,
        input: &ApplyEvent,
        sent: Option<&SentCall>,
        known: Option<&AttemptHead>,
    ) -> Result<Applied, StoreError> {
        let span = tracing::info_span!(
            "apply_event",
            kind = %input.event.kind,
            evidence = %input.event.evidence,
            provider_event_id = input.event.provider_event_id.as_deref(),
            inbox_id = input.inbox_id.as_deref(),
            adapter = input.provenance.adapter.as_ref().map(|a| a.name.as_str()),
            trace_id = input.provenance.trace_id.as_deref(),
        );
        // Instrumented, never entered with a guard: a guard held across an await stays
        // entered on the thread while the task is parked, and whatever that thread runs
        // next (the publisher's tasks, once) becomes its child after it closed.
        async {
            for tries in 1..=MAX_CAS_TRIES {
                if let Some(applied) = self.event_try(input, sent, known, tries).await? {
                    return Ok(applied);
                }
            }
            Err(StoreError::CasExhausted {
                aggregate: "payment",
                id: describe_target(&input.target),
                tries: MAX_CAS_TRIES,
            })
        }
        .instrument(span)
        .await
    }

    /// One try of an event through the door. On PostgreSQL outside a
    /// transaction first ([`Door::Alone`]), taken again inside one when its
    /// writes need it; the await points are the same as a transaction's and
    /// each is reached once a try, on both backends.
    async fn event_try(
        &self,
        input: &ApplyEvent,
        sent: Option<&SentCall>,
        known: Option<&AttemptHead>,
        tries: u32,
    ) -> Result<Option<Applied>, StoreError> {
        let known = known_head(input, known).filter(|_| tries == 1);
        if self.backend == crate::Backend::Postgres {
            let mut conn = self.begin_alone().await?;
            let door = Door::Alone(&mut conn);
            if let Some(step) = self.apply_event_once(door, input, sent, known).await? {
                return finish_alone(&self.env, step, tries).await;
            }
        }
        let mut tx = match self.backend {
            crate::Backend::Sqlite => self.begin_write().await?,
            // This try's await points before the write were reached above.
            crate::Backend::Postgres => self.writer.begin().await?,
        };
        let step = in_tx(
            self.apply_event_once(Door::InTx(&mut tx), input, sent, known)
                .await?,
        )?;
        finish_try(&self.env, tx, step, tries).await
    }

    /// Apply an order command (`Cancel`, `Expire`, `GiveUp`) through the door.
    /// New attempts are started with [`Store::create_attempt`].
    pub async fn apply_order_command(
        &self,
        payment_id: &str,
        command: OrderCommand,
        provenance: &Provenance,
    ) -> Result<Applied, StoreError> {
        if command == OrderCommand::StartAttempt {
            return Err(StoreError::Unapplicable(
                "use create_attempt to start an attempt".into(),
            ));
        }
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            let (order, amounts) = order_and_amounts_in(&mut tx, payment_id).await?;
            let latest = payments::latest_attempt_in(&mut tx, payment_id).await?;
            let decision = decide_order(
                &order.snapshot(&amounts)?,
                latest.as_ref().map(|a| a.state),
                command,
            );
            let subject = Subject {
                aggregate: Aggregate::Order,
                table: "payment_orders",
                id: order.id.clone(),
                state: order.state.as_str(),
                version: order.version,
                reference: None,
                psp_reference: None,
                next_retry_time: None,
                attempt: None,
            };
            let mut verdict = Verdict::of(decision);
            // For the order itself the "cascade" is its own new state.
            if let Some((state, _)) = verdict.new_state {
                verdict.cascade_order = OrderState::parse(state);
            }
            let plan = Plan::command(
                (order, amounts, subject),
                verdict,
                command_kind(command),
                provenance,
            );
            let step = in_tx(self.carry_out(&mut Door::InTx(&mut tx), plan).await?)?;
            if let Some(applied) = finish_try(&self.env, tx, step, tries).await? {
                return Ok(applied);
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "order",
            id: payment_id.to_owned(),
            tries: MAX_CAS_TRIES,
        })
    }

    /// Cancel a refund that was never sent to the PSP, releasing its
    /// reservation. Only for refunds the caller knows did not leave.
    pub async fn cancel_unsent_refund(
        &self,
        refund_reference: &str,
        provenance: &Provenance,
    ) -> Result<Applied, StoreError> {
        for tries in 1..=MAX_CAS_TRIES {
            let mut tx = self.begin_write().await?;
            let (refund_id, payment_id) =
                find_row(&mut tx, "refunds", "reference", refund_reference)
                    .await?
                    .ok_or_else(|| StoreError::not_found("refund", refund_reference))?;
            let (order, amounts) = order_and_amounts_in(&mut tx, &payment_id).await?;
            let refund = refund_in(&mut tx, &refund_id).await?;
            let verdict = Verdict::of(cancel_unsent_refund(&refund.snapshot()));
            let subject = operator::pending_subject(
                &mut tx,
                crate::payments::PendingKind::Refund,
                &refund_id,
            )
            .await?;
            let plan = Plan::command(
                (order, amounts, subject),
                verdict,
                "COMMAND_CANCEL_UNSENT_REFUND",
                provenance,
            );
            let step = in_tx(self.carry_out(&mut Door::InTx(&mut tx), plan).await?)?;
            if let Some(applied) = finish_try(&self.env, tx, step, tries).await? {
                return Ok(applied);
            }
        }
        Err(StoreError::CasExhausted {
            aggregate: "refund",
            id: refund_reference.to_owned(),
            tries: MAX_CAS_TRIES,
        })
    }

    /// One try of an event's decision, from the `known` rows or from a read;
    /// `None` when its writes need a transaction and `door` is
    /// [`Door::Alone`].
    async fn apply_event_once(
        &self,
        mut door: Door<'_>,
        input: &ApplyEvent,
        sent: Option<&SentCall>,
        known: Option<&AttemptHead>,
    ) -> Result<Option<Step<Applied>>, StoreError> {
        let tx = door.conn();
        let Head {
            located,
            order,
            amounts,
            attempt,
            inbox_processed: already_processed,
        } = match known {
            Some(known) => known_as_head(tx, input, known).await?,
            None => read_head(tx, input).await?,
        };
        let order_snapshot = order.snapshot(&amounts)?;
        let inbox_duplicate = || {
            Verdict::duplicate(format!(
                "inbox entry {} was already processed",
                input.inbox_id.as_deref().unwrap_or("-")
            ))
        };
        let event = &input.event;
        let (subject, verdict, capture_attempt) = match located.aggregate {
            Aggregate::Attempt | Aggregate::Order => {
                let attempt = match attempt {
                    Some(attempt) => attempt,
                    None => attempt_in(tx, &located.id).await?,
                };
                let verdict = if already_processed {
                    inbox_duplicate()
                } else {
                    Verdict::of(decide_attempt(&order_snapshot, &attempt.snapshot(), event))
                };
                (attempt_subject(&attempt), verdict, None)
            }
            Aggregate::Refund => {
                let refund = refund_in(tx, &located.id).await?;
                let verdict = if already_processed {
                    inbox_duplicate()
                } else {
                    Verdict::of(decide_refund(&order_snapshot, &refund.snapshot(), event))
                };
                (refund_subject(&refund), verdict, None)
            }
            Aggregate::Capture => {
                let capture = capture_in(tx, &located.id).await?;
                let attempt = attempt_in(tx, &capture.attempt_id).await?;
                let verdict = if already_processed {
                    inbox_duplicate()
                } else {
                    Verdict::of(decide_capture(
                        &order_snapshot,
                        &attempt.snapshot(),
                        &capture.snapshot(),
                        event,
                    ))
                };
                (capture_subject(&capture), verdict, Some(attempt))
            }
        };
        let plan = Plan {
            order,
            amounts,
            subject,
            capture_attempt,
            verdict,
            input: Input::Event(event),
            provenance: &input.provenance,
            inbox_id: input.inbox_id.as_deref(),
            inbox_done: already_processed,
            next_retry_time: input.next_retry_time,
            sent,
        };
        self.carry_out(&mut door, plan).await
    }

    /// Steps 4–6 for any verdict; `None` when the writes need a transaction
    /// and `door` is [`Door::Alone`].
    async fn carry_out(
        &self,
        tx: &mut Door<'_>,
        plan: Plan<'_>,
    ) -> Result<Option<Step<Applied>>, StoreError> {
        // Asked before anything is drawn from the environment (the clock, the
        // outbox events' ids), so that the try taken again in a transaction
        // draws what a try in one from the start draws: the simulator's seeds
        // are the same on both backends.
        if matches!(tx, Door::Alone(_)) && plan.needs_transaction() {
            return Ok(None);
        }
        let now = self.now_ms();
        // Its miss: another processor committed this inbox row meanwhile;
        // the next try sees it processed and records a duplicate.
        let inbox = (plan.inbox_id.filter(|_| !plan.inbox_done))
            .map(|inbox_id| inbox_processed_write(inbox_id, now));
        if plan.verdict.kind == DecisionKind::Applied {
            self.carry_out_applied(tx, &plan, inbox, now).await
        } else {
            self.carry_out_unapplied(tx, &plan, inbox, now).await
        }
    }

    /// An applied decision's writes, its `inbox` row's last.
    async fn carry_out_applied(
        &self,
        tx: &mut Door<'_>,
        plan: &Plan<'_>,
        inbox: Option<Write>,
        now: i64,
    ) -> Result<Option<Step<Applied>>, StoreError> {
        let moves = self.moves(plan, now)?;
        let mut batch = Batch::default();
        batch.push(cas_order_write(&plan.order, moves.order_state, None, now));
        if let Some(update) = &moves.update {
            batch.push(update.to_write());
        }
        if let (Some(state), Some(attempt)) = (plan.verdict.cascade_attempt, &plan.capture_attempt)
        {
            batch.push(cascade_write(attempt, state, now));
        }
        let amounts: Vec<Write> = (plan.verdict.effects.iter())
            .filter_map(|effect| amount_write(&plan.order.id, effect))
            .collect();
        if amounts.len() > 1 {
            // Each moves the one amounts row.
            batch.one_by_one();
        }
        amounts.into_iter().for_each(|w| batch.push(w));
        let (history, subject_row) = self.applied_history(plan, &moves, now)?;
        batch.push(history);
        let mut outbox_event_ids = Vec::new();
        for (write, id) in self.applied_outbox(plan, &moves, now) {
            batch.push(write);
            outbox_event_ids.push(id);
        }
        inbox.into_iter().for_each(|w| batch.push(w));
        let outcome = tx.write(&batch, self.backend, plan.follows()).await;
        let Some(outcome) = outcome.map_err(|e| moves.conflict(e, plan))? else {
            return Ok(None);
        };
        let Outcome::Done(mut history_ids) = outcome else {
            return Ok(Some(Step::Retry));
        };
        // The subject's row is named first (the batch returned one id per
        // history row, so `subject_row` is in range).
        let subject_id = history_ids.remove(subject_row);
        history_ids.insert(0, subject_id);
        if !self
            .follow_fulfillment(tx.conn(), plan, &moves, now)
            .await?
        {
            return Ok(Some(Step::Retry));
        }
        let subject = &plan.subject;
        Ok(Some(Step::Done(Applied {
            decision: DecisionKind::Applied,
            reason: plan.verdict.reason.clone(),
            payment_id: plan.order.id.clone(),
            aggregate: subject.aggregate,
            aggregate_id: subject.id.clone(),
            from_state: subject.state.to_owned(),
            to_state: moves.new_state.to_owned(),
            aggregate_version: moves.subject_version,
            payment_version: moves.payment_version,
            order_state: moves.order_state,
            history_ids,
            outbox_event_ids,
            tries: 1,
            after: rows_after(plan, &moves),
        })))
    }

    /// What an applied decision moves, worked out before anything is written.
    fn moves<'p>(&self, plan: &'p Plan<'_>, now: i64) -> Result<Moves<'p>, StoreError> {
        let verdict = &plan.verdict;
        let (new_state, terminal) = verdict
            .new_state
            .ok_or_else(|| StoreError::Unapplicable("applied decision without a state".into()))?;
        // The core already checked the movements against the snapshot; the
        // conditional updates and the CHECKs are the database's own net.
        let amounts_after = plan
            .amounts
            .to_core()?
            .apply_all(&verdict.effects)
            .map_err(|e| StoreError::AmountInvariant(e.to_string()))?;
        let payment_version = plan.order.version + 1;
        let update = (plan.subject.aggregate != Aggregate::Order)
            .then(|| SubjectUpdate::new(plan, new_state, terminal, now, self.query_delay_ms));
        Ok(Moves {
            new_state,
            terminal,
            order_state: verdict.cascade_order.unwrap_or(plan.order.state),
            payment_version,
            subject_version: match update {
                Some(_) => plan.subject.version + 1,
                None => payment_version,
            },
            amounts_after,
            update,
        })
    }

    /// The decision's history rows as one write, in this order: the attempt a
    /// capture cascades to, the subject, the order it moves; and which of them
    /// is the subject's.
    fn applied_history(
        &self,
        plan: &Plan<'_>,
        moves: &Moves<'_>,
        now: i64,
    ) -> Result<(Write, usize), StoreError> {
        let (verdict, order, subject) = (&plan.verdict, &plan.order, &plan.subject);
        let identity = plan.identity();
        let row = |kind: &'static str, id, from, to, versions, reason| {
            self.history_row(
                plan,
                kind,
                id,
                from,
                to,
                versions,
                DecisionKind::Applied,
                reason,
                identity.as_ref(),
            )
        };
        let cascade_reason = format!("follows capture {}: {}", subject.id, verdict.reason);
        let order_reason = format!(
            "follows {} {}: {}",
            subject.aggregate, subject.id, verdict.reason
        );
        let mut rows = Vec::with_capacity(3);
        if let (Some(state), Some(attempt)) = (verdict.cascade_attempt, &plan.capture_attempt) {
            let versions = (attempt.version, attempt.version + 1);
            rows.push(row(
                "attempt",
                &attempt.id,
                attempt.state.as_str(),
                state.as_str(),
                versions,
                &cascade_reason,
            ));
        }
        let subject_row = rows.len();
        let versions = (subject.version, moves.subject_version);
        rows.push(row(
            subject.aggregate.as_str(),
            &subject.id,
            subject.state,
            moves.new_state,
            versions,
            &verdict.reason,
        ));
        if subject.aggregate != Aggregate::Order && moves.order_state != order.state {
            let versions = (order.version, moves.payment_version);
            rows.push(row(
                "order",
                &order.id,
                order.state.as_str(),
                moves.order_state.as_str(),
                versions,
                &order_reason,
            ));
        }
        Ok((history::append_write(&rows, now)?, subject_row))
    }

    /// The decision's outbox events as writes, each with the event id minted for it.
    fn applied_outbox(&self, plan: &Plan<'_>, moves: &Moves<'_>, now: i64) -> Vec<(Write, String)> {
        let (order, subject) = (&plan.order, &plan.subject);
        plan.verdict
            .emits()
            .map(|event| {
                let payload = outbox_payload(
                    plan,
                    event,
                    moves.new_state,
                    moves.order_state,
                    moves.payment_version,
                    &moves.amounts_after,
                    now,
                );
                let new = NewOutboxEvent {
                    event_type: event.as_str(),
                    payment_id: &order.id,
                    merchant_id: &order.merchant_id,
                    aggregate_type: subject.aggregate.as_str(),
                    aggregate_id: &subject.id,
                    payment_version: moves.payment_version,
                    payload,
                };
                outbox::insert_write(&new, self.at(now))
            })
            .collect()
    }

    /// The fulfillment follows the payment in the same transaction; false
    /// when its own compare-and-set missed (decide again).
    async fn follow_fulfillment(
        &self,
        tx: &mut Conn,
        plan: &Plan<'_>,
        moves: &Moves<'_>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let follow_up =
            fulfillment_follow_up(tx, plan, moves.new_state, moves.terminal, moves.order_state)
                .await?;
        let Some(input) = follow_up else {
            return Ok(true);
        };
        let followed = fulfillment::follow_payment_in(
            tx,
            &plan.order.id,
            input,
            plan.provenance,
            &self.fulfillment_policy,
            self.at(now),
        )
        .await?;
        Ok(!matches!(followed, Step::Retry))
    }

    /// A decision that changes no state: the order confirmed (or flagged for
    /// review), its history row, when flagged the merchant told once, and
    /// its `inbox` row last.
    async fn carry_out_unapplied(
        &self,
        tx: &mut Door<'_>,
        plan: &Plan<'_>,
        inbox: Option<Write>,
        now: i64,
    ) -> Result<Option<Step<Applied>>, StoreError> {
        let mut batch = Batch::default();
        let (verdict, order, subject) = (&plan.verdict, &plan.order, &plan.subject);
        let identity = plan.identity();
        // Contradicting evidence stops automatic processing: flag the payment
        // for review once, and tell the merchant once.
        let flag = verdict.kind == DecisionKind::NeedsReconciliation && !order.manual_review;
        let review_reason = flag.then_some(verdict.reason.as_str());
        let payment_version = order.version + i64::from(flag);
        batch.push(match flag {
            true => cas_order_write(order, order.state, review_reason, now),
            false => confirm_order_write(order, self.backend),
        });
        let versions = (subject.version, subject.version);
        let (from, to) = (subject.state, subject.state);
        let h = self.history_row(
            plan,
            subject.aggregate.as_str(),
            &subject.id,
            from,
            to,
            versions,
            verdict.kind,
            &verdict.reason,
            identity.as_ref(),
        );
        batch.push(history::append_write(std::slice::from_ref(&h), now)?);
        let mut outbox_event_ids = Vec::new();
        if flag {
            let (write, id) = self.review_outbox(plan, payment_version, now)?;
            batch.push(write);
            outbox_event_ids.push(id);
        }
        // A webhook's decision that changes nothing and tells nobody is taken
        // again from its durable inbox row if a crash loses it: it need not
        // wait for the disk (see `Batch::commit_lazily`).
        if !flag && inbox.is_some() {
            batch.commit_lazily();
        }
        inbox.into_iter().for_each(|w| batch.push(w));
        let Some(outcome) = tx.write(&batch, self.backend, false).await? else {
            return Ok(None);
        };
        let Outcome::Done(history_ids) = outcome else {
            return Ok(Some(Step::Retry));
        };
        Ok(Some(Step::Done(Applied {
            decision: verdict.kind,
            reason: verdict.reason.clone(),
            payment_id: order.id.clone(),
            aggregate: subject.aggregate,
            aggregate_id: subject.id.clone(),
            from_state: subject.state.to_owned(),
            to_state: subject.state.to_owned(),
            aggregate_version: subject.version,
            payment_version,
            order_state: order.state,
            history_ids,
            outbox_event_ids,
            tries: 1,
            after: None,
        })))
    }

    /// The merchant told once that the payment needs review.
    fn review_outbox(
        &self,
        plan: &Plan<'_>,
        payment_version: i64,
        now: i64,
    ) -> Result<(Write, String), StoreError> {
        let (order, subject) = (&plan.order, &plan.subject);
        let amounts = plan.amounts.to_core()?;
        let event = OutboxEvent::PaymentNeedsReview;
        let payload = outbox_payload(
            plan,
            event,
            subject.state,
            order.state,
            payment_version,
            &amounts,
            now,
        );
        let new = NewOutboxEvent {
            event_type: event.as_str(),
            payment_id: &order.id,
            merchant_id: &order.merchant_id,
            aggregate_type: subject.aggregate.as_str(),
            aggregate_id: &subject.id,
            payment_version,
            payload,
        };
        Ok(outbox::insert_write(&new, self.at(now)))
    }

    #[allow(clippy::too_many_arguments)]
    fn history_row<'p>(
        &self,
        plan: &'p Plan<'_>,
        aggregate_type: &'p str,
        aggregate_id: &'p str,
        from_state: &'p str,
        to_state: &'p str,
        (from_version, to_version): (i64, i64),
        decision: DecisionKind,
        reason: &'p str,
        identity: Option<&'p EventIdentity>,
    ) -> NewHistory<'p> {
        let mut h = NewHistory {
            payment_id: &plan.order.id,
            aggregate_type,
            aggregate_id,
            from_state: Some(from_state),
            to_state,
            from_version: Some(from_version),
            to_version,
            decision: decision.as_str(),
            reason,
            provenance: Some(plan.provenance),
            inbox_id: plan.inbox_id,
            ..NewHistory::default()
        };
        match plan.input {
            Input::Event(event) => {
                h.event_kind = event.kind.as_str();
                h.evidence_source = event.evidence.as_str();
                h.provider_event_id = event.provider_event_id.as_deref();
                h.psp_reference = event.psp_reference.as_deref();
                h.amount_minor = event.amount.map(|m| m.amount_minor);
                h.currency = event.amount.as_ref().map(|m| m.currency.as_str());
                h.raw_status = Some(event.raw_status.as_str());
                h.failure_code = event.failure.as_ref().map(|f| f.code.as_str());
                h.event_identity = identity.map(|i| i.business_key.as_str());
            }
            Input::Command(kind) => {
                h.event_kind = kind;
                h.evidence_source = "command";
            }
        }
        h
    }
}

/// The fulfillment input an applied payment decision implies: the payment
/// with a fulfillment block succeeded (PaymentSucceeded with the attempt that
/// took the money), or its compensation refund reached a definitive outcome.
async fn fulfillment_follow_up(
    tx: &mut Conn,
    plan: &Plan<'_>,
    new_state: &str,
    terminal: bool,
    order_state: OrderState,
) -> Result<Option<FulfillmentInput>, StoreError> {
    let order = &plan.order;
    if order.fulfillment.mode.is_none() {
        return Ok(None);
    }
    let subject = &plan.subject;
    if order_state == OrderState::Succeeded && order.state != OrderState::Succeeded {
        let attempt_reference = match subject.aggregate {
            Aggregate::Attempt => subject.reference.clone(),
            Aggregate::Capture => plan.capture_attempt.as_ref().map(|a| a.reference.clone()),
            Aggregate::Order | Aggregate::Refund => None,
        };
        return Ok(attempt_reference
            .map(|attempt_reference| FulfillmentInput::PaymentSucceeded { attempt_reference }));
    }
    if subject.aggregate == Aggregate::Refund && terminal {
        let Some(reference) = &subject.reference else {
            return Ok(None);
        };
        if fulfillment::is_compensation_refund(tx, &order.id, reference).await? {
            let outcome = if new_state == RefundState::Succeeded.as_str() {
                CompensationRefundOutcome::Succeeded
            } else {
                CompensationRefundOutcome::Failed
            };
            return Ok(Some(FulfillmentInput::CompensationRefund {
                refund_reference: reference.clone(),
                outcome,
            }));
        }
    }
    Ok(None)
}

/// The identity stored with an accepted event (for business-level dedupe).
fn identity_json(event: &PaymentEvent) -> Result<String, StoreError> {
    serde_json::to_string(&EventIdentity::of(event))
        .map_err(|e| StoreError::Unapplicable(format!("event identity: {e}")))
}

/// What an event is about and the payment it belongs to, as read in this try.
struct Head {
    located: Located,
    order: PaymentOrder,
    amounts: PaymentAmounts,
    /// The attempt, when the event is about one: read with the order.
    attempt: Option<PaymentAttempt>,
    /// Whether the event's inbox row is already processed (false without
    /// one): read with the attempt when the event is about one.
    inbox_processed: bool,
}

/// Locate the event's aggregate and read its payment. An attempt is read
/// with its order and amounts in one statement (one snapshot); anything else
/// after its order, which comes first: every change to the payment bumps the
/// order's version, so a change committed after this read makes the final
/// CAS miss.
async fn read_head(tx: &mut Conn, input: &ApplyEvent) -> Result<Head, StoreError> {
    use payments::AttemptKey;
    let inbox = input.inbox_id.as_deref();
    let located = match &input.target {
        // The host's own reference: the attempt and its payment at once.
        EventTarget::Attempt(reference) => {
            return attempt_head(tx, AttemptKey::Reference, reference, inbox, None).await;
        }
        target => match locate::by_own_reference(tx, target, &input.event, inbox).await? {
            OwnReference::Head(read) => return Head::of(*read, None, inbox),
            OwnReference::Located(located) => located,
            OwnReference::Unnamed => locate::locate(tx, target, &input.event).await?,
        },
    };
    if matches!(located.aggregate, Aggregate::Attempt | Aggregate::Order) {
        let id = located.id.clone();
        return attempt_head(tx, AttemptKey::Id, &id, inbox, Some(located)).await;
    }
    let (order, amounts) = order_and_amounts_in(tx, &located.payment_id).await?;
    let inbox_processed = match inbox {
        Some(inbox_id) => inbox_processed(tx, inbox_id).await?,
        None => false,
    };
    Ok(Head {
        located,
        order,
        amounts,
        attempt: None,
        inbox_processed,
    })
}

/// The rows an applied decision about an attempt left, from the rows it was
/// decided from and what its writes set (the SQL of [`SubjectUpdate::to_write`],
/// [`cas_order_write`] and [`amount_write`], whose conditional updates set
/// what the core's `Amounts::apply_all` worked out in `moves`); none when a
/// capture's attempt or a fulfillment moved with them. In builds with
/// assertions the step that starts from them checks them against the database
/// ([`known_as_head`]).
fn rows_after(plan: &Plan<'_>, moves: &Moves<'_>) -> Option<AttemptHead> {
    let (before, update) = (plan.subject.attempt.as_ref()?, moves.update.as_ref()?);
    if plan.capture_attempt.is_some() || plan.follows() {
        return None;
    }
    let failure = match plan.input {
        Input::Event(event) => event.failure.clone(),
        Input::Command(_) => None,
    };
    let attempt = PaymentAttempt {
        state: AttemptState::parse(update.state)?,
        version: moves.subject_version,
        last_event: plan.identity().or_else(|| before.last_event.clone()),
        psp_reference: (before.psp_reference.clone()).or_else(|| update.psp_reference.clone()),
        next_retry_time: update.next_retry_time,
        failure: failure.or_else(|| before.failure.clone()),
        updated_at: update.now,
        last_psp_call_at: update.last_psp_call_at.or(before.last_psp_call_at),
        next_action_url: (update.next_action_url.clone())
            .or_else(|| before.next_action_url.clone()),
        authorized_at: before.authorized_at.or(update.authorized_at),
        void_requested_at: before.void_requested_at.or(update.void_requested_at),
        adapter_pin: (before.adapter_pin.clone()).or_else(|| update.pin.cloned()),
        ..before.clone()
    };
    let order = PaymentOrder {
        state: moves.order_state,
        version: moves.payment_version,
        updated_at: update.now,
        ..plan.order.clone()
    };
    Some(AttemptHead {
        order,
        amounts: plan.amounts.moved_to(moves.amounts_after),
        attempt,
    })
}

/// The `known` rows a try may start from: when the event names that
/// attempt's reference and no inbox row.
fn known_head<'a>(input: &ApplyEvent, known: Option<&'a AttemptHead>) -> Option<&'a AttemptHead> {
    let known = known?;
    let names_it = matches!(&input.target,
        EventTarget::Attempt(reference) if *reference == known.attempt.reference);
    (names_it && input.inbox_id.is_none()).then_some(known)
}

/// The head of a try from rows already known. In builds with assertions
/// (tests, the simulator) the rows are read as well and must be the stored
/// ones whenever the order is still at their version: a known head that
/// differs from the database at its own version would decide from wrong
/// facts and still pass the version check.
async fn known_as_head(
    tx: &mut Conn,
    input: &ApplyEvent,
    known: &AttemptHead,
) -> Result<Head, StoreError> {
    if cfg!(debug_assertions) {
        let read = read_head(tx, input).await?;
        if read.order.version == known.order.version {
            assert_eq!(
                (&read.order, &read.amounts, read.attempt.as_ref()),
                (&known.order, &known.amounts, Some(&known.attempt)),
                "a known head differs from the rows stored at its version"
            );
        }
    }
    Ok(Head {
        located: Located {
            aggregate: Aggregate::Attempt,
            id: known.attempt.id.clone(),
            payment_id: known.attempt.payment_id.clone(),
        },
        order: known.order.clone(),
        amounts: known.amounts,
        attempt: Some(known.attempt.clone()),
        inbox_processed: false,
    })
}

/// The head of an event about an attempt: the attempt, its order and
/// amounts and the event's inbox row's status, in one statement.
async fn attempt_head(
    tx: &mut Conn,
    column: payments::AttemptKey,
    key: &str,
    inbox: Option<&str>,
    located: Option<Located>,
) -> Result<Head, StoreError> {
    let read = payments::attempt_head_in(tx, column, key, inbox)
        .await?
        .ok_or_else(|| StoreError::not_found("attempt", key))?;
    Head::of(read, located, inbox)
}

impl Head {
    /// An attempt's head as one statement read it, with the inbox row
    /// `inbox`; located at the attempt unless `located` says where the event
    /// goes.
    fn of(
        read: payments::AttemptRead,
        located: Option<Located>,
        inbox: Option<&str>,
    ) -> Result<Head, StoreError> {
        let inbox_processed = read.inbox_processed(inbox)?;
        let head = read.head;
        let located = located.unwrap_or_else(|| Located {
            aggregate: Aggregate::Attempt,
            id: head.attempt.id.clone(),
            payment_id: head.attempt.payment_id.clone(),
        });
        Ok(Head {
            located,
            order: head.order,
            amounts: head.amounts,
            attempt: Some(head.attempt),
            inbox_processed,
        })
    }
}

/// What an applied decision moves ([`Store::moves`]).
struct Moves<'a> {
    new_state: &'static str,
    terminal: bool,
    order_state: OrderState,
    payment_version: i64,
    subject_version: i64,
    amounts_after: sluice_core::Amounts,
    /// The subject row's update; none when the subject is the order itself.
    update: Option<SubjectUpdate<'a>>,
}

impl Moves<'_> {
    /// A unique violation among the decision's writes: only the subject's
    /// PSP reference is unique among them.
    fn conflict(&self, e: StoreError, plan: &Plan<'_>) -> StoreError {
        match &self.update {
            Some(update) if e.is_unique_violation() => StoreError::Conflict(format!(
                "PSP reference {:?} already belongs to another {}",
                update.psp_reference.as_deref().unwrap_or_default(),
                plan.subject.aggregate
            )),
            _ => e,
        }
    }
}

/// The column writes of an applied decision on the subject row.
struct SubjectUpdate<'a> {
    table: &'static str,
    id: &'a str,
    version: i64,
    state: &'static str,
    last_event_identity: Option<String>,
    psp_reference: Option<String>,
    next_action_url: Option<String>,
    next_retry_time: Option<i64>,
    failure: Option<(String, String, String)>,
    /// Attempts: `now` when the decision records an authorization / a void sent.
    authorized_at: Option<i64>,
    void_requested_at: Option<i64>,
    /// `now` when the decision records a call about to be sent.
    last_psp_call_at: Option<i64>,
    /// Attempts: the adapter version of a first send (kept if one is pinned).
    pin: Option<&'a AdapterPin>,
    now: i64,
}

impl<'a> SubjectUpdate<'a> {
    fn new(
        plan: &'a Plan<'_>,
        state: &'static str,
        terminal: bool,
        now: i64,
        query_delay_ms: i64,
    ) -> Self {
        let effects = &plan.verdict.effects;
        let psp_reference = effects.iter().find_map(|e| match e {
            Effect::RecordPspReference { psp_reference } => Some(psp_reference.clone()),
            _ => None,
        });
        let next_action_url = effects.iter().find_map(|e| match e {
            Effect::RecordNextAction { url } => Some(url.clone()),
            _ => None,
        });
        let schedule_query = effects.contains(&Effect::ScheduleQuery);
        let authorized_at = effects
            .iter()
            .any(|e| matches!(e, Effect::RecordAuthorization { .. }))
            .then_some(now);
        let void_requested_at = effects.contains(&Effect::RecordVoidRequest).then_some(now);
        // Terminal rows leave the scan set; an unknown outcome is queried soon.
        let next_retry_time = if terminal {
            None
        } else if schedule_query {
            Some(plan.next_retry_time.unwrap_or(now + query_delay_ms))
        } else {
            plan.next_retry_time.or(plan.subject.next_retry_time)
        };
        let (last_event_identity, failure) = match plan.input {
            Input::Event(event) => (
                identity_json(event).ok(),
                event.failure.as_ref().map(|f| {
                    (
                        f.code.clone(),
                        f.category.as_str().to_owned(),
                        f.message.clone(),
                    )
                }),
            ),
            Input::Command(_) => (None, None),
        };
        SubjectUpdate {
            table: plan.subject.table,
            id: &plan.subject.id,
            version: plan.subject.version,
            state,
            last_event_identity,
            psp_reference,
            next_action_url,
            next_retry_time,
            failure,
            authorized_at,
            void_requested_at,
            last_psp_call_at: plan.sent.map(|_| now),
            pin: plan.sent.and_then(|sent| sent.pin.as_ref()),
            now,
        }
    }

    /// CAS the subject row ([`Expect::OneRow`]: it misses when its version moved).
    fn to_write(&self) -> Write {
        let action_col = if self.table == "payment_attempts" {
            ", next_action_url = COALESCE($12, next_action_url), \
                authorized_at = COALESCE(authorized_at, $13), \
                void_requested_at = COALESCE(void_requested_at, $14), \
                adapter_version = CASE WHEN adapter_digest IS NULL \
                    THEN COALESCE($15, adapter_version) ELSE adapter_version END, \
                adapter_digest = COALESCE(adapter_digest, $16)"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE {table} SET state = $3, version = version + 1, \
                last_event_identity = COALESCE($4, last_event_identity), \
                psp_reference = COALESCE(psp_reference, $5), next_retry_time = $6, \
                failure_code = COALESCE($7, failure_code), \
                failure_category = COALESCE($8, failure_category), \
                failure_message = COALESCE($9, failure_message), updated_at = $10, \
                last_psp_call_at = COALESCE($11, last_psp_call_at){action_col} \
             WHERE id = $1 AND version = $2",
            table = self.table
        );
        let failure = self.failure.as_ref();
        let mut binds: Vec<Bind> = vec![
            self.id.into(),
            self.version.into(),
            self.state.into(),
            self.last_event_identity.as_deref().into(),
            self.psp_reference.as_deref().into(),
            self.next_retry_time.into(),
            failure.map(|f| f.0.as_str()).into(),
            failure.map(|f| f.1.as_str()).into(),
            failure.map(|f| f.2.as_str()).into(),
            self.now.into(),
            self.last_psp_call_at.into(),
        ];
        if self.table == "payment_attempts" {
            binds.extend([
                self.next_action_url.as_deref().into(),
                self.authorized_at.into(),
                self.void_requested_at.into(),
                self.pin.map(|pin| pin.version.as_str()).into(),
                self.pin.map(|pin| pin.digest.as_str()).into(),
            ]);
        }
        Write {
            sql,
            binds,
            expect: Expect::OneRow,
        }
    }
}

fn attempt_subject(attempt: &PaymentAttempt) -> Subject {
    Subject {
        aggregate: Aggregate::Attempt,
        table: "payment_attempts",
        id: attempt.id.clone(),
        state: attempt.state.as_str(),
        version: attempt.version,
        reference: Some(attempt.reference.clone()),
        psp_reference: attempt.psp_reference.clone(),
        next_retry_time: attempt.next_retry_time,
        attempt: Some(attempt.clone()),
    }
}

fn refund_subject(refund: &payments::Refund) -> Subject {
    Subject {
        aggregate: Aggregate::Refund,
        table: "refunds",
        id: refund.id.clone(),
        state: refund.state.as_str(),
        version: refund.version,
        reference: Some(refund.reference.clone()),
        psp_reference: refund.psp_reference.clone(),
        next_retry_time: refund.next_retry_time,
        attempt: None,
    }
}

fn capture_subject(capture: &payments::Capture) -> Subject {
    Subject {
        aggregate: Aggregate::Capture,
        table: "captures",
        id: capture.id.clone(),
        state: capture.state.as_str(),
        version: capture.version,
        reference: Some(capture.reference.clone()),
        psp_reference: capture.psp_reference.clone(),
        next_retry_time: capture.next_retry_time,
        attempt: None,
    }
}

/// CAS the order row: new state (and review flag), version + 1.
fn cas_order_write(
    order: &PaymentOrder,
    state: OrderState,
    review_reason: Option<&str>,
    now: i64,
) -> Write {
    Write::one_row(
        "UPDATE payment_orders SET state = $3, version = version + 1, updated_at = $4, \
                manual_review = CASE WHEN $5 IS NULL THEN manual_review ELSE 1 END, \
                manual_review_reason = COALESCE($5, manual_review_reason) \
             WHERE id = $1 AND version = $2",
        vec![
            order.id.as_str().into(),
            order.version.into(),
            state.as_str().into(),
            now.into(),
            review_reason.into(),
        ],
    )
}

/// Check that the order is still at the version the decision was taken on,
/// without changing it, and keep writers off it until commit.
///
/// On PostgreSQL a share lock: a writer of the order waits for the commit, and
/// a writer that came first makes the check find no row at that version (the
/// lock reads the row's latest version), as the update below would. It writes
/// no row version: no CHECK evaluated, no index entry, no new heap tuple
/// (BENCHMARKS.md, issue 17, session 10). On SQLite the write lock its
/// transaction takes first serves as the lock; the update checks the version.
fn confirm_order_write(order: &PaymentOrder, backend: crate::Backend) -> Write {
    let binds = vec![order.id.as_str().into(), order.version.into()];
    match backend {
        crate::Backend::Postgres => Write {
            sql: "SELECT 0::BIGINT AS id FROM payment_orders WHERE id = $1 AND version = $2 \
                  FOR SHARE"
                .into(),
            binds,
            expect: Expect::LockedRow,
        },
        crate::Backend::Sqlite => Write::one_row(
            "UPDATE payment_orders SET version = version WHERE id = $1 AND version = $2",
            binds,
        ),
    }
}

/// The attempt follows its first successful capture.
fn cascade_write(attempt: &PaymentAttempt, state: AttemptState, now: i64) -> Write {
    let next_retry: Option<i64> = if state.is_terminal() {
        None
    } else {
        attempt.next_retry_time
    };
    Write::one_row(
        "UPDATE payment_attempts SET state = $3, version = version + 1, next_retry_time = $4, \
                updated_at = $5 WHERE id = $1 AND version = $2",
        vec![
            attempt.id.as_str().into(),
            attempt.version.into(),
            state.as_str().into(),
            next_retry.into(),
            now.into(),
        ],
    )
}

/// One amount effect as a conditional update, if it moves an amount. The
/// condition restates the invariant the movement needs, so a row that does
/// not allow it is left alone and the whole transaction fails
/// ([`Expect::Amount`]) instead of writing a wrong amount.
fn amount_write(payment_id: &str, effect: &Effect) -> Option<Write> {
    let (set, condition, amount) = match *effect {
        Effect::RecordAuthorization { amount_minor } => (
            "authorized_minor = $2",
            "authorized_minor = 0 AND captured_minor = 0",
            amount_minor,
        ),
        Effect::RecordSale { amount_minor } => (
            "authorized_minor = $2, captured_minor = $2",
            "authorized_minor = 0 AND captured_minor = 0",
            amount_minor,
        ),
        Effect::VoidAuthorization => (
            "authorized_minor = captured_minor",
            "capture_reserved_minor = 0 AND $2 = 0",
            0,
        ),
        Effect::ReserveCapture { amount_minor } => (
            "capture_reserved_minor = capture_reserved_minor + $2",
            "authorized_minor - captured_minor - capture_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::SettleCapture { amount_minor } => (
            "capture_reserved_minor = capture_reserved_minor - $2, captured_minor = captured_minor + $2",
            "capture_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::ReleaseCapture { amount_minor } => (
            "capture_reserved_minor = capture_reserved_minor - $2",
            "capture_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::ReserveRefund { amount_minor } => (
            "refund_reserved_minor = refund_reserved_minor + $2",
            "captured_minor - refunded_minor - refund_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::SettleRefund { amount_minor } => (
            "refund_reserved_minor = refund_reserved_minor - $2, refunded_minor = refunded_minor + $2",
            "refund_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::ReleaseRefund { amount_minor } => (
            "refund_reserved_minor = refund_reserved_minor - $2",
            "refund_reserved_minor >= $2",
            amount_minor,
        ),
        Effect::RecordPspReference { .. }
        | Effect::RecordNextAction { .. }
        | Effect::Emit(_)
        | Effect::ScheduleQuery
        | Effect::RecordVoidRequest => return None,
    };
    Some(Write {
        sql: format!("UPDATE payment_amounts SET {set} WHERE payment_id = $1 AND {condition}"),
        binds: vec![payment_id.into(), amount.into()],
        expect: Expect::Amount(format!(
            "{effect:?} does not fit the amounts of payment {payment_id}"
        )),
    })
}

#[allow(clippy::too_many_arguments)]
fn outbox_payload(
    plan: &Plan<'_>,
    event: OutboxEvent,
    subject_state: &str,
    order_state: OrderState,
    payment_version: i64,
    amounts: &sluice_core::Amounts,
    now: i64,
) -> serde_json::Value {
    let order = &plan.order;
    let subject = &plan.subject;
    serde_json::json!({
        "type": event.as_str(),
        "payment_id": order.id,
        "merchant_id": order.merchant_id,
        "merchant_order_no": order.merchant_order_no,
        "payment_version": payment_version,
        "order_state": order_state.as_str(),
        "amount_minor": order.amount.amount_minor,
        "currency": order.amount.currency.as_str(),
        "amounts": amounts,
        "aggregate": {
            "type": subject.aggregate.as_str(),
            "id": subject.id,
            "state": subject_state,
            "reference": subject.reference,
            "psp_reference": recorded_psp_reference(plan),
        },
        "reason": plan.verdict.reason,
        // Consumers dedupe on this business key (at-least-once delivery).
        "dedupe_key": format!("{}:{}:{}", event.as_str(), subject.id, payment_version),
        "occurred_at": now,
    })
}

/// The subject's PSP reference after the decision (known before, or learned now).
fn recorded_psp_reference(plan: &Plan<'_>) -> Option<String> {
    plan.subject.psp_reference.clone().or_else(|| {
        plan.verdict.effects.iter().find_map(|e| match e {
            Effect::RecordPspReference { psp_reference } => Some(psp_reference.clone()),
            _ => None,
        })
    })
}

/// Where an event lands: the aggregate and the payment it belongs to.
#[derive(Debug, Clone)]
struct Located {
    aggregate: Aggregate,
    id: String,
    payment_id: String,
}

/// The id of the row of `table` whose `column` is `key`, and the payment it
/// belongs to: one statement, as every door entry needs both.
async fn find_row(
    tx: &mut Conn,
    table: &str,
    column: &str,
    key: &str,
) -> Result<Option<(String, String)>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT id, payment_id FROM {table} WHERE {column} = $1"
    ))
    .bind(key)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(match row {
        Some(row) => Some((row.try_get("id")?, row.try_get("payment_id")?)),
        None => None,
    })
}

async fn inbox_processed(tx: &mut Conn, inbox_id: &str) -> Result<bool, StoreError> {
    let row = sqlx::query("SELECT status FROM webhook_inbox WHERE id = $1")
        .bind(inbox_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("inbox entry", inbox_id))?;
    Ok(row.try_get::<String, _>("status")? == "processed")
}

fn inbox_processed_write(inbox_id: &str, now: i64) -> Write {
    Write::one_row(
        "UPDATE webhook_inbox SET status = 'processed', processed_at = $2, claimed_until = NULL \
             WHERE id = $1 AND status <> 'processed'",
        vec![inbox_id.into(), now.into()],
    )
}

/// Record a refused order command (as evidence) inside the caller's transaction.
pub(crate) async fn record_order_refusal<S>(
    tx: &mut Conn,
    order: &PaymentOrder,
    command: OrderCommand,
    decision: &Decision<S>,
    provenance: &Provenance,
    now: i64,
) -> Result<i64, StoreError> {
    let kind = match decision {
        Decision::Ignore(IgnoreReason::Duplicate) => DecisionKind::IgnoredDuplicate,
        Decision::Ignore(IgnoreReason::Stale) => DecisionKind::IgnoredStale,
        Decision::NeedsReconciliation(_) => DecisionKind::NeedsReconciliation,
        _ => DecisionKind::Rejected,
    };
    let reason = decision.explain();
    history::append(
        tx,
        &NewHistory {
            payment_id: &order.id,
            aggregate_type: "order",
            aggregate_id: &order.id,
            from_state: Some(order.state.as_str()),
            to_state: order.state.as_str(),
            from_version: Some(order.version),
            to_version: order.version,
            event_kind: command_kind(command),
            evidence_source: "command",
            decision: kind.as_str(),
            reason: &reason,
            provenance: Some(provenance),
            ..NewHistory::default()
        },
        now,
    )
    .await
}

fn describe_target(target: &EventTarget) -> String {
    match target {
        EventTarget::Attempt(r) | EventTarget::Refund(r) | EventTarget::Capture(r) => r.clone(),
        EventTarget::PspReference { psp_reference, .. } => psp_reference.clone(),
        EventTarget::FromEvent { scope } => format!("event at account {}", scope.account_id),
    }
}

/// CAS misses (a decision re-taken because someone else committed first),
/// process-wide, for the `sluice_cas_conflicts_total` metric.
static CAS_CONFLICTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many decisions this process re-took after losing a CAS race.
pub fn cas_conflicts_total() -> u64 {
    CAS_CONFLICTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// A short, jittered pause before re-deciding, so racers spread out. Every
/// CAS miss passes here, so this is where it is counted.
pub(crate) async fn cas_backoff(env: &Env, tries: u32) {
    CAS_CONFLICTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let jitter = env.entropy.up_to(3);
    tokio::time::sleep(Duration::from_millis(u64::from(tries) * 2 + jitter)).await;
}

fn log_applied(applied: &Applied) {
    tracing::info!(
        payment_id = %applied.payment_id,
        aggregate = %applied.aggregate,
        aggregate_id = %applied.aggregate_id,
        decision = applied.decision.as_str(),
        from = %applied.from_state,
        to = %applied.to_state,
        tries = applied.tries,
        "decision recorded"
    );
}
