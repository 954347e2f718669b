//! Group commit: writes that arrive while the database is busy with earlier
//! ones are written together, in one statement and one commit.
//!
//! There is no background task. At most `max_in_flight` callers at a time
//! lead: each writes its own item at once. A caller arriving while every
//! lead is taken waits in a queue; when a lead finishes, it hands the lead,
//! with up to `max_batch` queued items, to the first of them, who writes them
//! all and answers the others. So an idle gateway writes each item alone,
//! with no delay, and a busy one writes as many per commit as arrived during
//! the previous commit (natural batching, as PostgreSQL's own WAL flush does
//! it for concurrent commits).
//!
//! Cancellation: the lead is handed on when the leading future is dropped
//! (its `Drop`), so a caller that goes away never stalls the queue. A waiter
//! whose lead went away mid-write, or whose batch failed, hears nothing
//! ([`Joined::Alone`]) and writes its item on its own: the callers' writes
//! must therefore be idempotent (the webhook inbox's are: a body and an
//! event are each kept once per key).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The bounds of a [`GroupCommit`], validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimits {
    /// Items written by one statement, at most.
    pub max_batch: usize,
    /// Leads (statements) at once, at most; callers beyond them queue.
    pub max_in_flight: usize,
}

/// Largest [`GroupLimits::max_batch`]: a statement's bind parameters stay
/// far below PostgreSQL's 65,535 with ten per item.
pub const MAX_GROUP_BATCH: usize = 256;
/// Largest [`GroupLimits::max_in_flight`].
pub const MAX_GROUP_IN_FLIGHT: usize = 64;

impl GroupLimits {
    pub fn validated(self) -> Result<GroupLimits, String> {
        if !(1..=MAX_GROUP_BATCH).contains(&self.max_batch) {
            return Err(format!(
                "a group commit's batch is 1 to {MAX_GROUP_BATCH} items, not {}",
                self.max_batch
            ));
        }
        if !(1..=MAX_GROUP_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(format!(
                "a group commit runs 1 to {MAX_GROUP_IN_FLIGHT} statements at once, not {}",
                self.max_in_flight
            ));
        }
        Ok(self)
    }
}

/// What a caller of [`GroupCommit::join`] gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined<R> {
    /// Its item was written, by itself or by the lead of its batch.
    Written(R),
    /// Its batch failed or its lead went away: nothing is known of its item,
    /// which the caller writes on its own.
    Alone,
}

struct Waiter<T, R> {
    item: T,
    reply: oneshot::Sender<Turn<T, R>>,
}

enum Turn<T, R> {
    Done(R),
    /// The lead passes to the receiver: the batch, its own item first.
    Lead(Vec<Waiter<T, R>>),
}

struct Queue<T, R> {
    leads: usize,
    waiting: VecDeque<Waiter<T, R>>,
}

pub struct GroupCommit<T, R> {
    limits: GroupLimits,
    queue: Mutex<Queue<T, R>>,
}

impl<T, R> std::fmt::Debug for GroupCommit<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<T, R> GroupCommit<T, R> {
    pub fn new(limits: GroupLimits) -> Self {
        GroupCommit {
            limits,
            queue: Mutex::new(Queue {
                leads: 0,
                waiting: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<T, R>> {
        // A panic while the lock is held cannot leave the queue half-changed
        // (every critical section is a push, a pop or a counter step), so a
        // poisoned lock is still a consistent queue.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Write `item` through `write`, alone or in a batch with items queued
    /// beside it. `write` gets the batch (at most `max_batch` items, in the
    /// order they queued) and must answer each item in that order; an `Err`,
    /// or the wrong number of answers, sends every item of the batch back to
    /// its caller as [`Joined::Alone`].
    pub async fn join<W, Fut, E>(&self, item: T, write: W) -> Joined<R>
    where
        W: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Result<Vec<R>, E>>,
        E: std::fmt::Display,
    {
        let (batch, lead) = match self.enter(item) {
            Entry::Lead(item, lead) => (vec![item], lead),
            Entry::Wait(turn) => match turn.await {
                Ok(Turn::Done(answer)) => return Joined::Written(answer),
                Ok(Turn::Lead(waiters)) => self.take_lead(waiters),
                Err(_) => return Joined::Alone,
            },
        };
        lead.write(batch, write).await
    }

    fn enter(&self, item: T) -> Entry<'_, T, R> {
        let mut queue = self.lock();
        if queue.leads < self.limits.max_in_flight {
            queue.leads += 1;
            return Entry::Lead(item, Lead::new(self, Vec::new()));
        }
        let (reply, turn) = oneshot::channel();
        queue.waiting.push_back(Waiter { item, reply });
        Entry::Wait(turn)
    }

    /// The lead handed to this caller: its own item (the first) and the
    /// others', whose callers it answers.
    fn take_lead(&self, waiters: Vec<Waiter<T, R>>) -> (Vec<T>, Lead<'_, T, R>) {
        let mut items = Vec::with_capacity(waiters.len());
        let mut replies = Vec::with_capacity(waiters.len());
        for waiter in waiters {
            items.push(waiter.item);
            replies.push(waiter.reply);
        }
        // The first reply is this caller's own turn, already used.
        replies.remove(0);
        (items, Lead::new(self, replies))
    }

    /// A lead is over: the first waiter, if any, leads next with a batch;
    /// otherwise one lead fewer is taken.
    fn hand_on(&self) {
        let mut queue = self.lock();
        loop {
            let take = queue.waiting.len().min(self.limits.max_batch);
            if take == 0 {
                queue.leads -= 1;
                return;
            }
            let mut batch: Vec<_> = queue.waiting.drain(..take).collect();
            let first = batch.remove(0);
            let reply = first.reply;
            batch.insert(
                0,
                Waiter {
                    item: first.item,
                    reply: oneshot::channel().0,
                },
            );
            match reply.send(Turn::Lead(batch)) {
                Ok(()) => return,
                // The first waiter went away: its item is dropped unwritten
                // (its caller has no answer to give), the rest queue again in
                // their order and the next one is asked.
                Err(Turn::Lead(mut batch)) => {
                    batch.remove(0);
                    for waiter in batch.into_iter().rev() {
                        queue.waiting.push_front(waiter);
                    }
                }
                // `send` gives back what it was given, and that was a lead.
                Err(Turn::Done(_)) => unreachable!("a lead was sent"),
            }
        }
    }
}

enum Entry<'a, T, R> {
    Lead(T, Lead<'a, T, R>),
    Wait(oneshot::Receiver<Turn<T, R>>),
}

/// A lead being held; dropping it, written or cancelled, hands it on.
struct Lead<'a, T, R> {
    group: &'a GroupCommit<T, R>,
    /// The other callers of the batch, in its order after the lead's own.
    replies: Vec<oneshot::Sender<Turn<T, R>>>,
}

impl<'a, T, R> Lead<'a, T, R> {
    fn new(group: &'a GroupCommit<T, R>, replies: Vec<oneshot::Sender<Turn<T, R>>>) -> Self {
        Lead { group, replies }
    }

    async fn write<W, Fut, E>(mut self, batch: Vec<T>, write: W) -> Joined<R>
    where
        W: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Result<Vec<R>, E>>,
        E: std::fmt::Display,
    {
        let expected = batch.len();
        let answers = match write(batch).await {
            Ok(answers) if answers.len() == expected => answers,
            Ok(answers) => {
                tracing::warn!(
                    expected,
                    got = answers.len(),
                    "a group commit's batch answered the wrong number of items; each writes alone"
                );
                return Joined::Alone;
            }
            Err(error) => {
                tracing::warn!(items = expected, %error, "a group commit's batch failed; each writes alone");
                return Joined::Alone;
            }
        };
        let mut answers = answers.into_iter();
        let own = answers.next();
        for (reply, answer) in std::mem::take(&mut self.replies).into_iter().zip(answers) {
            // A caller that went away meanwhile needs no answer.
            let _ = reply.send(Turn::Done(answer));
        }
        own.map_or(Joined::Alone, Joined::Written)
    }
}

impl<T, R> Drop for Lead<'_, T, R> {
    fn drop(&mut self) {
        // Unanswered callers (a failed batch, a cancelled lead) see their
        // turn dropped and write alone; then the lead passes on.
        self.replies.clear();
        self.group.hand_on();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::sync::Notify;

    fn limits(max_batch: usize, max_in_flight: usize) -> GroupLimits {
        GroupLimits {
            max_batch,
            max_in_flight,
        }
        .validated()
        .expect("valid limits")
    }

    /// A writer that holds every batch until released, and records them.
    #[derive(Default)]
    struct Gate {
        open: Notify,
        batches: Mutex<Vec<Vec<u32>>>,
        started: AtomicUsize,
    }

    impl Gate {
        async fn write(&self, batch: Vec<u32>) -> Result<Vec<u32>, String> {
            self.started.fetch_add(1, Ordering::SeqCst);
            self.open.notified().await;
            if batch.contains(&666) {
                return Err("item 666 breaks its batch".into());
            }
            self.batches.lock().unwrap().push(batch.clone());
            Ok(batch.iter().map(|n| n * 10).collect())
        }
    }

    async fn until(what: impl Fn() -> bool) {
        while !what() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn an_idle_group_writes_each_item_alone_at_once() {
        let group = GroupCommit::new(limits(8, 2));
        let written = group
            .join(7, |batch: Vec<u32>| async move {
                Ok::<_, String>(batch.iter().map(|n| n + 1).collect())
            })
            .await;
        assert_eq!(written, Joined::Written(8));
        assert_eq!(group.lock().leads, 0);
    }

    type Task = tokio::task::JoinHandle<Joined<u32>>;

    /// A group of one lead over a [`Gate`], and callers queued in order.
    struct Harness {
        group: Arc<GroupCommit<u32, u32>>,
        gate: Arc<Gate>,
    }

    impl Harness {
        fn new(max_batch: usize) -> Self {
            Harness {
                group: Arc::new(GroupCommit::new(limits(max_batch, 1))),
                gate: Arc::new(Gate::default()),
            }
        }

        fn spawn(&self, n: u32) -> Task {
            let (group, gate) = (self.group.clone(), self.gate.clone());
            tokio::spawn(async move { group.join(n, |b| gate.write(b)).await })
        }

        /// The first item takes the one lead and is held in its write; the
        /// others queue behind it, in order.
        async fn queue(&self, items: &[u32]) -> Vec<Task> {
            let mut tasks = vec![self.spawn(items[0])];
            self.started(1).await;
            tasks.extend(items[1..].iter().map(|n| self.spawn(*n)));
            until(|| self.group.lock().waiting.len() == items.len() - 1).await;
            tasks
        }

        async fn started(&self, writes: usize) {
            until(|| self.gate.started.load(Ordering::SeqCst) == writes).await;
        }

        /// Lets the held write finish once the `writes`-th has started.
        async fn release(&self, writes: usize) {
            self.started(writes).await;
            self.gate.open.notify_one();
        }

        fn batches(&self) -> Vec<Vec<u32>> {
            self.gate.batches.lock().unwrap().clone()
        }

        fn leads(&self) -> usize {
            self.group.lock().leads
        }
    }

    async fn answers(tasks: Vec<Task>) -> Vec<Joined<u32>> {
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        answers
    }

    #[tokio::test]
    async fn items_that_arrive_while_every_lead_is_busy_are_written_together_in_order() {
        let h = Harness::new(8);
        let tasks = h.queue(&[1, 2, 3, 4, 5]).await;
        h.release(1).await;
        h.release(2).await;
        let expected: Vec<_> = (1..=5).map(|n| Joined::Written(n * 10)).collect();
        assert_eq!(answers(tasks).await, expected);
        assert_eq!(h.batches(), vec![vec![1], vec![2, 3, 4, 5]]);
        assert_eq!(h.leads(), 0);
    }

    #[tokio::test]
    async fn a_batch_never_holds_more_than_its_limit() {
        let h = Harness::new(2);
        let tasks = h.queue(&[1, 2, 3, 4, 5, 6]).await;
        for writes in 1..=4 {
            h.release(writes).await;
        }
        assert!(answers(tasks)
            .await
            .iter()
            .all(|a| matches!(a, Joined::Written(_))));
        assert_eq!(h.batches(), vec![vec![1], vec![2, 3], vec![4, 5], vec![6]]);
    }

    #[tokio::test]
    async fn a_failed_batch_sends_every_item_back_to_be_written_alone() {
        let h = Harness::new(8);
        let tasks = h.queue(&[1, 2, 666, 4]).await;
        h.release(1).await;
        h.release(2).await;
        assert_eq!(
            answers(tasks).await,
            vec![
                Joined::Written(10),
                Joined::Alone,
                Joined::Alone,
                Joined::Alone
            ]
        );
        assert_eq!(h.leads(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_lead_hands_on_and_its_batch_writes_alone() {
        let h = Harness::new(8);
        let mut tasks = h.queue(&[1, 2, 3]).await;
        // Item 2 leads the next batch, holding item 3; then it is cancelled
        // mid-write: item 3 hears nothing and writes alone.
        tasks.remove(0).abort();
        h.started(2).await;
        let second = tasks.remove(0);
        second.abort();
        assert!(second.await.unwrap_err().is_cancelled());
        assert_eq!(tasks.remove(0).await.unwrap(), Joined::Alone);
        assert_eq!(h.leads(), 0);
        assert!(h.batches().is_empty());
    }

    #[tokio::test]
    async fn a_waiter_that_went_away_is_skipped_when_the_lead_passes() {
        let h = Harness::new(1);
        let mut tasks = h.queue(&[1, 2, 3]).await;
        let gone = tasks.remove(1);
        gone.abort();
        assert!(
            gone.await.unwrap_err().is_cancelled(),
            "item 2's caller is gone"
        );
        h.release(1).await;
        h.release(2).await;
        assert_eq!(
            answers(tasks).await,
            vec![Joined::Written(10), Joined::Written(30)]
        );
        assert_eq!(h.batches(), vec![vec![1], vec![3]]);
    }

    #[test]
    fn limits_outside_their_bounds_are_refused() {
        assert!(limits_ok(0, 1).is_err());
        assert!(limits_ok(MAX_GROUP_BATCH + 1, 1).is_err());
        assert!(limits_ok(1, 0).is_err());
        assert!(limits_ok(1, MAX_GROUP_IN_FLIGHT + 1).is_err());
        assert!(limits_ok(MAX_GROUP_BATCH, MAX_GROUP_IN_FLIGHT).is_ok());
    }

    fn limits_ok(max_batch: usize, max_in_flight: usize) -> Result<GroupLimits, String> {
        GroupLimits {
            max_batch,
            max_in_flight,
        }
        .validated()
    }
}
