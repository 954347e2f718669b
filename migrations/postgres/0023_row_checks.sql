-- The same rules for a row of payment_orders, payment_attempts and
-- webhook_inbox, each table's as one CHECK calling one function (issue 17).
--
-- PostgreSQL turns every CHECK constraint of a table back from its stored text
-- into an expression and plans it again for every statement that writes the
-- table, prepared or not: a third of a door decision's own time on these
-- three tables went to that (12.8 % of the database's CPU in `perf` under
-- the payments bench; an UPDATE of a payment_orders row 39 µs with its six
-- CHECKs, 11 µs without, 19 µs with the one below; BENCHMARKS.md, issue 17,
-- session 10). A function's body is compiled once per connection, so the
-- rules cost a call. Each function states exactly the rules of the CHECKs it
-- replaces, and fails a row exactly when one of them did (a NULL passes a
-- CHECK, and passes here for the same columns). The amounts' CHECKs stay as
-- they are: they are the database's own check of the money, meant to be read.
-- SQLite keeps its CHECKs (its 0023 is empty: it does not pay this cost).

CREATE FUNCTION sluice_payment_order_ok(
    amount_minor BIGINT, currency TEXT, capture_mode TEXT, state TEXT,
    manual_review BIGINT, compensation_reason TEXT
) RETURNS BOOLEAN
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN amount_minor > 0
        AND length(currency) = 3
        AND capture_mode IN ('automatic', 'manual')
        AND state IN ('CREATED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED',
                      'SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')
        AND manual_review IN (0, 1)
        AND (compensation_reason IS NULL
             OR compensation_reason IN ('fulfillment_deadline_passed', 'fulfilled_elsewhere'));
END;
$$;

ALTER TABLE payment_orders
    DROP CONSTRAINT payment_orders_amount_minor_check,
    DROP CONSTRAINT payment_orders_currency_check,
    DROP CONSTRAINT payment_orders_capture_mode_check,
    DROP CONSTRAINT payment_orders_state_check,
    DROP CONSTRAINT payment_orders_manual_review_check,
    DROP CONSTRAINT payment_orders_compensation_reason_check,
    ADD CONSTRAINT payment_orders_row_ok CHECK (sluice_payment_order_ok(
        amount_minor, currency, capture_mode, state, manual_review, compensation_reason));

CREATE FUNCTION sluice_payment_attempt_ok(
    amount_minor BIGINT, capture_mode TEXT, state TEXT, attempt_no BIGINT
) RETURNS BOOLEAN
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN amount_minor > 0
        AND capture_mode IN ('automatic', 'manual')
        AND state IN ('CREATED', 'SUBMITTED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED',
                      'SUCCEEDED', 'FAILED', 'CANCELED', 'UNKNOWN')
        AND attempt_no >= 1;
END;
$$;

ALTER TABLE payment_attempts
    DROP CONSTRAINT payment_attempts_amount_minor_check,
    DROP CONSTRAINT payment_attempts_capture_mode_check,
    DROP CONSTRAINT payment_attempts_state_check,
    DROP CONSTRAINT payment_attempts_attempt_no_check,
    ADD CONSTRAINT payment_attempts_row_ok CHECK (sluice_payment_attempt_ok(
        amount_minor, capture_mode, state, attempt_no));

-- A verified row names its event; a rejected one names none and is quarantined.
CREATE FUNCTION sluice_webhook_inbox_ok(
    verification TEXT, status TEXT, provider_event_id TEXT
) RETURNS BOOLEAN
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN verification IN ('verified', 'rejected')
        AND status IN ('pending', 'processing', 'processed', 'failed', 'quarantined')
        AND (verification = 'rejected' OR provider_event_id IS NOT NULL)
        AND (verification = 'verified' OR (provider_event_id IS NULL AND status = 'quarantined'));
END;
$$;

ALTER TABLE webhook_inbox
    DROP CONSTRAINT webhook_inbox_verification_check,
    DROP CONSTRAINT webhook_inbox_status_check,
    DROP CONSTRAINT inbox_verified_rows_have_event_id,
    DROP CONSTRAINT inbox_rejected_rows_are_quarantined,
    ADD CONSTRAINT webhook_inbox_row_ok CHECK (sluice_webhook_inbox_ok(
        verification, status, provider_event_id));
