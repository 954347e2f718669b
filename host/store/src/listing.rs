//! Filtered, cursor-paginated listing of a merchant's payments (the merchant
//! API's `GET /v1/payments`). Read-only.

use crate::payments::{order_from, Page, PaymentOrder, ORDER_COLS};
use crate::{Store, StoreError};
use sluice_core::OrderState;

/// Which payments to list. Every field narrows the result; `None` means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaymentFilter {
    /// Only orders in one of these states. `Some(vec![])` matches nothing.
    pub states: Option<Vec<OrderState>>,
    /// Only orders whose manual-review flag has this value.
    pub manual_review: Option<bool>,
    /// Only orders created at or after this time (unix ms).
    pub created_gte: Option<i64>,
    /// Only orders created at or before this time (unix ms).
    pub created_lte: Option<i64>,
    pub merchant_order_no: Option<String>,
}

impl Store {
    /// A merchant's payments matching `filter`, newest first (by id, which is
    /// time-ordered). `cursor` is the `next_cursor` of the previous page.
    pub async fn list_payments_filtered(
        &self,
        merchant_id: &str,
        filter: &PaymentFilter,
        limit: i64,
        cursor: Option<&str>,
    ) -> Result<Page<PaymentOrder>, StoreError> {
        let limit = limit.clamp(1, 200);
        if filter.states.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Page {
                items: Vec::new(),
                next_cursor: None,
            });
        }
        // State names come from `OrderState::as_str` (fixed upper-case words),
        // never from the caller, so inlining them is safe.
        let states = filter.states.as_ref().map(|states| {
            let names: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
            format!(" AND state IN ({})", names.join(", "))
        });
        let sql = format!(
            "SELECT {ORDER_COLS} FROM payment_orders \
             WHERE merchant_id = $1 AND ($2 IS NULL OR id < $2) \
               AND ($3 IS NULL OR manual_review = $3) \
               AND ($4 IS NULL OR created_at >= $4) \
               AND ($5 IS NULL OR created_at <= $5) \
               AND ($6 IS NULL OR merchant_order_no = $6){} \
             ORDER BY id DESC LIMIT $7",
            states.unwrap_or_default()
        );
        let rows = sqlx::query(&sql)
            .bind(merchant_id)
            .bind(cursor)
            .bind(filter.manual_review.map(i64::from))
            .bind(filter.created_gte)
            .bind(filter.created_lte)
            .bind(filter.merchant_order_no.as_deref())
            .bind(limit + 1)
            .fetch_all(&self.pool)
            .await?;
        let mut items = rows.iter().map(order_from).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|o| o.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
