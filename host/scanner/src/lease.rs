//! Leases so that two scanner instances never work the same row at the same
//! moment (table `scanner_leases`, migration 0004). One atomic statement on
//! both backends: the insert wins when no lease exists, the update only when
//! the existing lease has lapsed; a live lease leaves zero rows affected.
//! A crashed holder's lease simply lapses.

use sluice_store::{PendingKind, Store};

use crate::due::kind_label;

#[derive(Debug, Clone)]
pub(crate) struct Leases {
    store: Store,
    holder: String,
    lease_ms: i64,
}

impl Leases {
    pub(crate) fn new(store: Store, holder: String, lease_ms: i64) -> Self {
        Leases {
            store,
            holder,
            lease_ms: lease_ms.max(1),
        }
    }

    /// True when this instance now holds the lease.
    pub(crate) async fn claim(&self, kind: PendingKind, id: &str) -> Result<bool, sqlx::Error> {
        self.claim_label(kind_label(kind), id).await
    }

    /// Claim a lease of any kind by its label (e.g. `fulfillment`).
    pub(crate) async fn claim_label(&self, kind: &str, id: &str) -> Result<bool, sqlx::Error> {
        let now = self.store.now_ms();
        let done = sqlx::query(
            "INSERT INTO scanner_leases (kind, id, holder, lease_until) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (kind, id) DO UPDATE \
                SET holder = excluded.holder, lease_until = excluded.lease_until \
                WHERE scanner_leases.lease_until < $5",
        )
        .bind(kind)
        .bind(id)
        .bind(self.holder.as_str())
        .bind(now.saturating_add(self.lease_ms))
        .bind(now)
        .execute(self.store.writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Give the lease back (only our own).
    pub(crate) async fn release(&self, kind: PendingKind, id: &str) -> Result<(), sqlx::Error> {
        self.release_label(kind_label(kind), id).await
    }

    pub(crate) async fn release_label(&self, kind: &str, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM scanner_leases WHERE kind = $1 AND id = $2 AND holder = $3")
            .bind(kind)
            .bind(id)
            .bind(self.holder.as_str())
            .execute(self.store.writer())
            .await?;
        Ok(())
    }
}
