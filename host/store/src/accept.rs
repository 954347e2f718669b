//! A verified webhook kept in one commit: its sealed body and its events'
//! inbox rows ([`Store::accept_webhook`]). Webhook ingest is two writes per
//! webhook otherwise (the body, then the inbox row), each its own commit;
//! PSPs send bursts after their own outages, so ingest is sized by commits.
//! On PostgreSQL, single-event webhooks that arrive while earlier ones are
//! being written share a statement and a commit ([`crate::group_commit`]).

use crate::db::{run_script, text};
use crate::env::AwaitPoint;
use crate::group_commit::{GroupLimits, Joined};
use crate::inbox::{body_context, inbox_duplicate_in, InboxInsert, NewInboxEvent};
use crate::{ids, Backend, Store, StoreError};
use sqlx::Row;
use std::collections::HashMap;

/// PostgreSQL: the bodies and events of a batch of single-event webhooks in
/// one statement (see [`accept_batch_sql`]).
const BATCH_PARAMS_PER_ROW: usize = 8;

/// The statement that keeps `rows` webhooks of one event each: their bodies
/// (each kept once per account and digest) and their events (each queued once
/// per adapter, account and provider event id). An event is written only when
/// its body's id is known: inserted now, or kept by an earlier commit. A body
/// a concurrent, not yet visible transaction is inserting leaves its row's
/// `body_id` NULL and its event unwritten; the caller then takes the
/// transaction path, which waits for it. Two rows of one batch with the same
/// body share it; with the same event, the second is reported not inserted
/// (a duplicate, looked up after the commit).
fn accept_batch_sql(rows: usize) -> String {
    let mut values = String::with_capacity(rows * 48);
    for row in 0..rows {
        let p = 2 + row * BATCH_PARAMS_PER_ROW;
        if row > 0 {
            values.push_str(", ");
        }
        values.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
            p,
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6,
            p + 7
        ));
    }
    format!(
        "WITH input (body_id, account, digest, sealed, inbox_id, adapter, event_id, event_json) \
            AS (VALUES {values}), \
         body AS ( \
            INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, \
                received_at) \
            SELECT body_id, account, digest, sealed, $1 FROM input \
            ON CONFLICT (connector_account_id, payload_digest) DO NOTHING \
            RETURNING id, connector_account_id, payload_digest \
         ), kept AS ( \
            SELECT i.inbox_id, COALESCE(b.id, w.id) AS body_id FROM input i \
            LEFT JOIN body b ON b.connector_account_id = i.account AND b.payload_digest = i.digest \
            LEFT JOIN webhook_bodies w \
                ON w.connector_account_id = i.account AND w.payload_digest = i.digest \
         ), event AS ( \
            INSERT INTO webhook_inbox (id, adapter, connector_account_id, provider_event_id, \
                payload_digest, verification, event_json, status, attempts, next_attempt_at, \
                received_at, raw_body_id) \
            SELECT i.inbox_id, i.adapter, i.account, i.event_id, i.digest, 'verified', \
                i.event_json, 'pending', 0, $1, $1, k.body_id \
            FROM input i JOIN kept k ON k.inbox_id = i.inbox_id WHERE k.body_id IS NOT NULL \
            ON CONFLICT (adapter, connector_account_id, provider_event_id) DO NOTHING \
            RETURNING id \
         ) \
         SELECT k.inbox_id, k.body_id, \
            EXISTS (SELECT 1 FROM event e WHERE e.id = k.inbox_id) AS inserted \
         FROM kept k"
    )
}

/// SQLite: the script that keeps a webhook of `events` events ([`Store::accept_as_script`]):
/// `$1`–`$5` the body (its id, account, digest, sealed body, the time), then four
/// parameters an event (its inbox id, adapter, provider event id, normalised event). Its
/// statements: the body's insert, the kept body's id (this one's, or the one kept before),
/// then each event's insert.
fn accept_script_sql(events: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, \
            received_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (connector_account_id, payload_digest) DO NOTHING;\n\
         SELECT id FROM webhook_bodies WHERE connector_account_id = $2 AND payload_digest = $3",
    );
    for event in 0..events {
        let p = 6 + event * 4;
        sql.push_str(&format!(
            ";\nINSERT INTO webhook_inbox (id, adapter, connector_account_id, provider_event_id, \
                payload_digest, verification, event_json, status, attempts, next_attempt_at, \
                received_at, raw_body_id) \
             VALUES (${p}, ${}, $2, ${}, $3, 'verified', ${}, 'pending', 0, $5, $5, \
                (SELECT id FROM webhook_bodies WHERE connector_account_id = $2 \
                 AND payload_digest = $3)) \
             ON CONFLICT (adapter, connector_account_id, provider_event_id) DO NOTHING",
            p + 1,
            p + 2,
            p + 3
        ));
    }
    sql
}

/// A single-event webhook waiting for its batch: ids minted and body sealed
/// by its own caller, so a batch only writes.
#[derive(Debug)]
pub(crate) struct PendingWebhook {
    body_id: String,
    connector_account_id: String,
    payload_digest: String,
    sealed_body: String,
    inbox_id: String,
    adapter: String,
    provider_event_id: String,
    event_json: String,
}

/// What the batch statement did with one webhook: `None` when its body's id
/// was not known (a concurrent transaction is inserting it).
pub(crate) type BatchAnswer = Option<KeptWebhook>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptWebhook {
    body_id: String,
    /// Its event was queued now; otherwise it was queued before.
    inserted: bool,
}

/// The limits of webhook ingest's group commit on PostgreSQL
/// ([`crate::StoreOptions::ingest_group`]).
pub const DEFAULT_INGEST_GROUP: GroupLimits = GroupLimits {
    max_batch: 64,
    // Two statements at once kept the most webhooks a second in the
    // bench's ingest phase (1, 2 and 4 measured, BENCHMARKS.md).
    max_in_flight: 2,
};

/// A verified webhook of one connector account: its raw body and the events
/// the adapter made of it (their `payload_digest` and `raw_body_id` are the
/// webhook's, filled in by the store; so is their account).
#[derive(Debug, Clone)]
pub struct AcceptedWebhook<'a> {
    pub connector_account_id: &'a str,
    /// sha256 of the body, hex: the body is kept once per account and digest.
    pub payload_digest: &'a str,
    pub body: &'a [u8],
    pub events: Vec<NewInboxEvent>,
}

impl Store {
    /// Keep a verified webhook's body, sealed, and queue each of its events in
    /// the inbox (a provider event received before is reported as a duplicate
    /// and not queued again). Returns the body's id and one outcome per
    /// event, in order. On PostgreSQL a webhook of one event is one statement
    /// and one commit, shared with the single-event webhooks that arrived
    /// while the previous ones were being written; otherwise one transaction.
    pub async fn accept_webhook(
        &self,
        webhook: AcceptedWebhook<'_>,
    ) -> Result<(String, Vec<InboxInsert>), StoreError> {
        match (self.backend, webhook.events.as_slice()) {
            (Backend::Sqlite, _) => return self.accept_as_script(webhook).await,
            (Backend::Postgres, [only]) => {
                if let Some(accepted) = self.accept_one_pg(&webhook, only).await? {
                    return Ok(accepted);
                }
            }
            (Backend::Postgres, _) => {}
        }
        self.accept_in_steps(webhook).await
    }

    /// SQLite: [`Self::accept_in_steps`]'s writes as one script in its
    /// transaction ([`run_script`]): the body (kept once per account and
    /// digest), its id, and each event (queued once per adapter, account and
    /// provider event id) with that id. Ids are drawn in the same order.
    async fn accept_as_script(
        &self,
        webhook: AcceptedWebhook<'_>,
    ) -> Result<(String, Vec<InboxInsert>), StoreError> {
        let mut tx = self.begin_write().await?;
        let body_id = ids::webhook_body(&self.env);
        let sealed = self.seal_secret(&body_context(&body_id), webhook.body)?;
        let now = self.now_ms();
        let events: Vec<(String, NewInboxEvent)> = (webhook.events.into_iter())
            .map(|event| (ids::inbox(&self.env), event))
            .collect();
        let sql = accept_script_sql(events.len());
        let mut query = sqlx::query(&sql)
            .bind(&body_id)
            .bind(webhook.connector_account_id)
            .bind(webhook.payload_digest)
            .bind(&sealed)
            .bind(now);
        for (inbox_id, event) in &events {
            query = query
                .bind(inbox_id)
                .bind(&event.adapter)
                .bind(&event.provider_event_id)
                .bind(event.event.to_string());
        }
        let (ran, failed) = run_script(&mut tx, query).await;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let kept_body = (ran.get(1).and_then(|body| body.rows.first()))
            .ok_or_else(|| StoreError::corrupt("webhook_bodies", "the kept body was not found"))?;
        let kept_body_id = text(kept_body, "id")?;
        let mut outcomes = Vec::with_capacity(events.len());
        for (index, (inbox_id, event)) in events.into_iter().enumerate() {
            let inserted = ran.get(2 + index).map(|statement| statement.changes);
            outcomes.push(match inserted {
                Some(1) => InboxInsert::Inserted { id: inbox_id },
                Some(_) => {
                    let event = NewInboxEvent {
                        connector_account_id: webhook.connector_account_id.to_owned(),
                        ..event
                    };
                    inbox_duplicate_in(&mut tx, &event).await?
                }
                None => {
                    return Err(StoreError::corrupt(
                        "webhook_inbox",
                        "the script did not answer for every event",
                    ))
                }
            });
        }
        self.commit_write(tx).await?;
        Ok((kept_body_id, outcomes))
    }

    /// A single-event webhook through the group commit: alone when the
    /// database is idle, in one statement with those that arrived meanwhile
    /// when it is busy. `None`: the transaction path must write it.
    async fn accept_one_pg(
        &self,
        webhook: &AcceptedWebhook<'_>,
        event: &NewInboxEvent,
    ) -> Result<Option<(String, Vec<InboxInsert>)>, StoreError> {
        let pending = self.pending_webhook(webhook, event)?;
        let inbox_id = pending.inbox_id.clone();
        let kept = match self
            .ingest
            .join(pending, |batch| self.write_batch(batch))
            .await
        {
            Joined::Written(Some(kept)) => kept,
            Joined::Written(None) | Joined::Alone => return Ok(None),
        };
        let outcome = if kept.inserted {
            InboxInsert::Inserted { id: inbox_id }
        } else {
            let mut conn = self.pool.acquire().await?;
            inbox_duplicate_in(&mut conn, event).await?
        };
        Ok(Some((kept.body_id, vec![outcome])))
    }

    fn pending_webhook(
        &self,
        webhook: &AcceptedWebhook<'_>,
        event: &NewInboxEvent,
    ) -> Result<PendingWebhook, StoreError> {
        let body_id = ids::webhook_body(&self.env);
        let sealed_body = self.seal_secret(&body_context(&body_id), webhook.body)?;
        Ok(PendingWebhook {
            body_id,
            connector_account_id: webhook.connector_account_id.to_owned(),
            payload_digest: webhook.payload_digest.to_owned(),
            sealed_body,
            inbox_id: ids::inbox(&self.env),
            adapter: event.adapter.clone(),
            provider_event_id: event.provider_event_id.clone(),
            event_json: event.event.to_string(),
        })
    }

    /// One statement, one commit, for a whole batch; an answer per webhook in
    /// the batch's order.
    async fn write_batch(
        &self,
        batch: Vec<PendingWebhook>,
    ) -> Result<Vec<BatchAnswer>, StoreError> {
        // The await points of the transaction this statement stands for (the
        // simulator kills and hands over turns there): stopped before it,
        // nothing is written, as that transaction would roll back; and both
        // backends meet the same points for the same webhook.
        self.env.reached(AwaitPoint::BeforeWrite).await;
        self.env.reached(AwaitPoint::InWrite).await;
        let sql = accept_batch_sql(batch.len());
        let mut query = sqlx::query(&sql).bind(self.now_ms());
        // Two batches keeping the same bodies lock them in the same order
        // (a deadlock between them would send both back to write alone).
        let mut in_order: Vec<&PendingWebhook> = batch.iter().collect();
        in_order.sort_unstable_by(|a, b| {
            (&a.connector_account_id, &a.payload_digest)
                .cmp(&(&b.connector_account_id, &b.payload_digest))
        });
        for webhook in in_order {
            query = query
                .bind(&webhook.body_id)
                .bind(&webhook.connector_account_id)
                .bind(&webhook.payload_digest)
                .bind(&webhook.sealed_body)
                .bind(&webhook.inbox_id)
                .bind(&webhook.adapter)
                .bind(&webhook.provider_event_id)
                .bind(&webhook.event_json);
        }
        let rows = query.fetch_all(&self.writer).await?;
        self.env.reached(AwaitPoint::AfterCommit).await;
        let mut answers = HashMap::with_capacity(rows.len());
        for row in rows {
            let body_id: Option<String> = row.try_get("body_id")?;
            let inserted: bool = row.try_get("inserted")?;
            answers.insert(
                row.try_get::<String, _>("inbox_id")?,
                body_id.map(|body_id| KeptWebhook { body_id, inserted }),
            );
        }
        batch
            .iter()
            .map(|webhook| {
                answers
                    .remove(&webhook.inbox_id)
                    .ok_or_else(|| StoreError::Corrupt {
                        table: "webhook_inbox",
                        detail: format!("the batch statement did not answer {}", webhook.inbox_id),
                    })
            })
            .collect()
    }

    /// The body, then each event, in one transaction.
    async fn accept_in_steps(
        &self,
        webhook: AcceptedWebhook<'_>,
    ) -> Result<(String, Vec<InboxInsert>), StoreError> {
        let mut tx = self.begin_write().await?;
        let body_id = self
            .keep_body_in(
                &mut tx,
                webhook.connector_account_id,
                webhook.payload_digest,
                webhook.body,
            )
            .await?;
        let mut outcomes = Vec::with_capacity(webhook.events.len());
        for event in webhook.events {
            let event = NewInboxEvent {
                connector_account_id: webhook.connector_account_id.to_owned(),
                payload_digest: webhook.payload_digest.to_owned(),
                raw_body_id: Some(body_id.clone()),
                ..event
            };
            outcomes.push(self.inbox_insert_in(&mut tx, &event).await?);
        }
        self.commit_write(tx).await?;
        Ok((body_id, outcomes))
    }
}
