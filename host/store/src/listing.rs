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

/// Most payments one operator search returns: the console's page size cap.
pub const MAX_SEARCH_PAGE: i64 = 100;

/// An operator's search across merchants (the admin API's `GET /admin/payments`).
/// Every field narrows the result; `None` means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaymentSearch {
    /// A payment id, merchant order number, attempt/capture/refund reference
    /// or PSP reference: exact match, each through an index of its own.
    pub q: Option<String>,
    pub merchant_id: Option<String>,
    pub state: Option<OrderState>,
    /// Only orders created at or before this time (unix ms): "older than".
    pub created_lte: Option<i64>,
}

/// A value bound to a dynamically assembled query.
enum Bind<'a> {
    Text(&'a str),
    Int(i64),
}

impl Store {
    /// Payments matching `search` across every merchant, newest first (by id,
    /// which is time-ordered), at most `limit` (capped at [`MAX_SEARCH_PAGE`]).
    /// `cursor` is the `next_cursor` of the previous page.
    ///
    /// Bounded and indexed: a search term is looked up by equality in the
    /// primary key and the indexes on order numbers, references and PSP
    /// references (migration 0018), and the listing without one walks the
    /// primary key, `(merchant_id, id)` or `(state, id)` backwards, stopping at
    /// `limit + 1` rows.
    pub async fn search_payments(
        &self,
        search: &PaymentSearch,
        limit: i64,
        cursor: Option<&str>,
    ) -> Result<Page<PaymentOrder>, StoreError> {
        let limit = limit.clamp(1, MAX_SEARCH_PAGE);
        let mut binds: Vec<Bind<'_>> = Vec::new();
        let mut conditions: Vec<String> = Vec::new();
        if let Some(q) = search.q.as_deref() {
            binds.push(Bind::Text(q));
            let p = placeholder(&binds);
            // One equality per arm, so each uses its own index (an OR across
            // tables could not).
            conditions.push(format!(
                "id IN (SELECT id FROM payment_orders WHERE id = {p} \
                 UNION SELECT id FROM payment_orders WHERE merchant_order_no = {p} \
                 UNION SELECT payment_id FROM payment_attempts WHERE reference = {p} \
                 UNION SELECT payment_id FROM payment_attempts WHERE psp_reference = {p} \
                 UNION SELECT payment_id FROM captures WHERE reference = {p} \
                 UNION SELECT payment_id FROM captures WHERE psp_reference = {p} \
                 UNION SELECT payment_id FROM refunds WHERE reference = {p} \
                 UNION SELECT payment_id FROM refunds WHERE psp_reference = {p})"
            ));
        }
        if let Some(merchant_id) = search.merchant_id.as_deref() {
            binds.push(Bind::Text(merchant_id));
            conditions.push(format!("merchant_id = {}", placeholder(&binds)));
        }
        if let Some(state) = search.state {
            binds.push(Bind::Text(state.as_str()));
            conditions.push(format!("state = {}", placeholder(&binds)));
        }
        if let Some(created_lte) = search.created_lte {
            binds.push(Bind::Int(created_lte));
            conditions.push(format!("created_at <= {}", placeholder(&binds)));
        }
        if let Some(cursor) = cursor {
            binds.push(Bind::Text(cursor));
            conditions.push(format!("id < {}", placeholder(&binds)));
        }
        binds.push(Bind::Int(limit + 1));
        let limit_param = placeholder(&binds);
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conditions.join(" AND "))
        };
        let sql = format!(
            "SELECT {ORDER_COLS} FROM payment_orders{filter} ORDER BY id DESC LIMIT {limit_param}"
        );
        let mut query = sqlx::query(&sql);
        for bind in binds {
            query = match bind {
                Bind::Text(text) => query.bind(text),
                Bind::Int(int) => query.bind(int),
            };
        }
        let rows = query.fetch_all(&self.pool).await?;
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

/// The placeholder of the value last pushed (`$1`, `$2`, ...: both backends).
fn placeholder(binds: &[Bind<'_>]) -> String {
    format!("${}", binds.len())
}
