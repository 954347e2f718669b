-- The operations console's search (issue 16, `GET /admin/payments?q=`) finds a
-- payment by its merchant order number across merchants and by the PSP's
-- reference of any of its attempts, captures and refunds: one equality lookup
-- each, never a scan. (Ids and the host's own references already have unique
-- indexes; the existing PSP-reference indexes lead with the adapter or account.)
CREATE INDEX payment_orders_by_order_no ON payment_orders (merchant_order_no);
CREATE INDEX payment_attempts_by_psp_reference
    ON payment_attempts (psp_reference) WHERE psp_reference IS NOT NULL;
CREATE INDEX captures_by_psp_reference
    ON captures (psp_reference) WHERE psp_reference IS NOT NULL;
CREATE INDEX refunds_by_psp_reference
    ON refunds (psp_reference) WHERE psp_reference IS NOT NULL;
-- The console's filter by state walks this index newest first.
CREATE INDEX payment_orders_by_state ON payment_orders (state, id);
