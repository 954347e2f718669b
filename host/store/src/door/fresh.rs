//! The record of a fresh attempt's first send, decided on the rows a create
//! with `confirm` is about to insert ([`Store::create_payment_with_attempt`]
//! with a [`FirstSend`]): the door's own decision, taken on rows nobody else
//! can see yet, so it needs no read and no compare-and-set. The create then
//! inserts the rows as this decision leaves them, with both decisions'
//! history, in its one commit: one synchronous commit and one round trip
//! fewer on the request path than the create followed by
//! [`Store::apply_sent`], and the same rows (in builds with assertions the
//! answer's decision checks them against the stored ones).

use sluice_core::decide_attempt;

use super::batch::{Expect, Write};
use super::{
    attempt_subject, rows_after, Applied, ApplyEvent, DecisionKind, Input, Plan, SentCall, Verdict,
};
use crate::payments::AttemptHead;
use crate::{Store, StoreError};

/// A first send to record with the create: the `*_SUBMITTED` event through
/// the door's rule for it, with the call's time and the adapter pin of
/// [`SentCall`].
#[derive(Debug, Clone)]
pub struct FirstSend {
    /// Its target names the attempt's reference, which the caller reads from
    /// [`crate::FreshPayment::head`].
    pub input: ApplyEvent,
    pub sent: SentCall,
}

/// The record's decision carried out in memory: the rows after it and its
/// own writes, which the create's statement appends: its history rows to
/// the create's one history insert (ids are drawn in the order of one
/// insert's rows, never across two statements or two CTEs), its outbox
/// events after it.
pub(crate) struct FreshSent {
    pub after: AttemptHead,
    /// One history insert of `history_rows` rows ([`Expect::Ids`]).
    pub history: Write,
    pub history_rows: usize,
    pub outbox: Vec<Write>,
    pub applied: Applied,
}

impl Store {
    /// The first send's decision on `head`, the rows as the create inserts
    /// them, at `now`. `None` when it is not one the create can carry (not
    /// applied, or its writes more than the attempt, the order, history and
    /// outbox: a fulfillment that follows, an amount movement): the caller
    /// then creates without it and records the send through the door.
    pub(crate) fn first_send_on(
        &self,
        head: &AttemptHead,
        first: &FirstSend,
        now: i64,
    ) -> Result<Option<FreshSent>, StoreError> {
        let (input, event) = (&first.input, &first.input.event);
        let names_it = matches!(&input.target,
            super::EventTarget::Attempt(reference) if *reference == head.attempt.reference);
        if !names_it || input.inbox_id.is_some() {
            return Ok(None);
        }
        let snapshot = head.order.snapshot(&head.amounts)?;
        let verdict = Verdict::of(decide_attempt(&snapshot, &head.attempt.snapshot(), event));
        if verdict.kind != DecisionKind::Applied {
            return Ok(None);
        }
        let plan = Plan {
            order: head.order.clone(),
            amounts: head.amounts,
            subject: attempt_subject(&head.attempt),
            capture_attempt: None,
            verdict,
            input: Input::Event(event),
            provenance: &input.provenance,
            inbox_id: None,
            inbox_done: false,
            next_retry_time: input.next_retry_time,
            sent: Some(&first.sent),
        };
        let moves = self.moves(&plan, now)?;
        let Some(after) = rows_after(&plan, &moves).filter(|after| inserts_as_is(head, after))
        else {
            return Ok(None);
        };
        let (history, _) = self.applied_history(&plan, &moves, now)?;
        let Expect::Ids(history_rows) = history.expect else {
            return Err(StoreError::Unapplicable(
                "a decision's history is one insert".into(),
            ));
        };
        let (outbox, outbox_event_ids) =
            self.applied_outbox(&plan, &moves, now).into_iter().unzip();
        let applied = Applied {
            decision: DecisionKind::Applied,
            reason: plan.verdict.reason.clone(),
            payment_id: plan.order.id.clone(),
            aggregate: plan.subject.aggregate,
            aggregate_id: plan.subject.id.clone(),
            from_state: plan.subject.state.to_owned(),
            to_state: moves.new_state.to_owned(),
            aggregate_version: moves.subject_version,
            payment_version: moves.payment_version,
            order_state: moves.order_state,
            // Filled in by the create from its statement.
            history_ids: Vec::new(),
            outbox_event_ids,
            tries: 1,
            after: Some(after.clone()),
        };
        Ok(Some(FreshSent {
            after,
            history,
            history_rows,
            outbox,
            applied,
        }))
    }
}

/// Whether the rows after the record are ones the create's insert writes as
/// they are: its columns are the attempt's as created plus what a record of a
/// send sets (state, version, the call's time, the event's identity, the
/// pin, the next look); anything else (a PSP reference, a failure, an
/// authorization) is not a first send's and takes the door.
fn inserts_as_is(head: &AttemptHead, after: &AttemptHead) -> bool {
    let (a, b) = (&head.attempt, &after.attempt);
    a.psp_reference == b.psp_reference
        && a.failure == b.failure
        && a.next_action_url == b.next_action_url
        && a.authorized_at == b.authorized_at
        && a.void_requested_at == b.void_requested_at
        && head.amounts == after.amounts
}
