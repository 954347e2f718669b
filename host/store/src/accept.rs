//! A verified webhook kept in one commit: its sealed body and its events'
//! inbox rows ([`Store::accept_webhook`]). Webhook ingest is two writes per
//! webhook otherwise (the body, then the inbox row), each its own commit;
//! PSPs send bursts after their own outages, so ingest is sized by commits.

use crate::env::AwaitPoint;
use crate::inbox::{body_context, inbox_duplicate_in, InboxInsert, NewInboxEvent};
use crate::{ids, Backend, Store, StoreError};
use sqlx::Row;

/// PostgreSQL: the body and the first event in one statement. The event is
/// written only when the body's id is known: inserted now, or kept by an
/// earlier commit. A body being inserted by a concurrent, not yet visible
/// transaction leaves both unknown (`body_id` NULL) and nothing written here;
/// the caller then takes the two-statement path, which waits for it.
const BODY_AND_EVENT_PG: &str = "\
WITH body AS ( \
    INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, received_at) \
    VALUES ($1, $2, $3, $4, $5) \
    ON CONFLICT (connector_account_id, payload_digest) DO NOTHING \
    RETURNING id \
), kept AS ( \
    SELECT id FROM body \
    UNION ALL \
    SELECT id FROM webhook_bodies WHERE connector_account_id = $2 AND payload_digest = $3 \
), event AS ( \
    INSERT INTO webhook_inbox (id, adapter, connector_account_id, provider_event_id, \
        payload_digest, verification, event_json, status, attempts, next_attempt_at, \
        received_at, raw_body_id) \
    SELECT $6, $7, $2, $8, $3, 'verified', $9, 'pending', 0, $5, $5, k.id \
    FROM (SELECT id FROM kept LIMIT 1) k \
    ON CONFLICT (adapter, connector_account_id, provider_event_id) DO NOTHING \
    RETURNING id \
) \
SELECT (SELECT id FROM kept LIMIT 1) AS body_id, (SELECT id FROM event) AS inbox_id";

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
    /// and one commit; otherwise one transaction.
    pub async fn accept_webhook(
        &self,
        webhook: AcceptedWebhook<'_>,
    ) -> Result<(String, Vec<InboxInsert>), StoreError> {
        if let (Backend::Postgres, [only]) = (self.backend, webhook.events.as_slice()) {
            if let Some(accepted) = self.accept_one_pg(&webhook, only).await? {
                return Ok(accepted);
            }
        }
        self.accept_in_steps(webhook).await
    }

    async fn accept_one_pg(
        &self,
        webhook: &AcceptedWebhook<'_>,
        event: &NewInboxEvent,
    ) -> Result<Option<(String, Vec<InboxInsert>)>, StoreError> {
        let body_id = ids::webhook_body(&self.env);
        let sealed = self.seal_secret(&body_context(&body_id), webhook.body)?;
        let inbox_id = ids::inbox(&self.env);
        // The await points of the transaction this statement stands for (the
        // simulator kills and hands over turns there): stopped at either,
        // nothing is written, as that transaction would roll back; and both
        // backends meet the same points for the same webhook.
        self.env.reached(AwaitPoint::BeforeWrite).await;
        self.env.reached(AwaitPoint::InWrite).await;
        let row = sqlx::query(BODY_AND_EVENT_PG)
            .bind(&body_id)
            .bind(webhook.connector_account_id)
            .bind(webhook.payload_digest)
            .bind(&sealed)
            .bind(self.now_ms())
            .bind(&inbox_id)
            .bind(&event.adapter)
            .bind(&event.provider_event_id)
            .bind(event.event.to_string())
            .fetch_one(&self.writer)
            .await?;
        let Some(kept) = row.try_get::<Option<String>, _>("body_id")? else {
            return Ok(None);
        };
        self.env.reached(AwaitPoint::AfterCommit).await;
        let outcome = match row.try_get::<Option<String>, _>("inbox_id")? {
            Some(id) => InboxInsert::Inserted { id },
            None => {
                let mut conn = self.pool.acquire().await?;
                inbox_duplicate_in(&mut conn, event).await?
            }
        };
        Ok(Some((kept, vec![outcome])))
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
