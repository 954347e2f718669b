-- Guaranteed fulfillment or refund (issue 7, seed 000 §1, §4, §7, §8).
-- The fulfillment lifecycle lives on the order next to the payment state; it
-- has its own CAS version so a push confirmation and a compensation decision
-- cannot both win. Changed only by the store's fulfillment door.
ALTER TABLE payment_orders ADD COLUMN fulfillment_version BIGINT NOT NULL DEFAULT 0;
-- The attempt that took the money (bound when the payment succeeds).
ALTER TABLE payment_orders ADD COLUMN fulfillment_attempt_reference TEXT NULL;
ALTER TABLE payment_orders ADD COLUMN fulfillment_checks BIGINT NOT NULL DEFAULT 0;
-- When the fulfillment scanner wakes this payment next (NULL: nothing to do).
ALTER TABLE payment_orders ADD COLUMN fulfillment_next_check_at BIGINT NULL;
-- The compensation refund (at most one, ever): 'cmp_' + attempt reference.
ALTER TABLE payment_orders ADD COLUMN compensation_refund_reference TEXT NULL;
ALTER TABLE payment_orders ADD COLUMN compensation_reason TEXT NULL
    CHECK (compensation_reason IS NULL OR compensation_reason IN ('fulfillment_deadline_passed', 'fulfilled_elsewhere'));
-- Why the fulfillment is (or was last) in manual review (JSON of the core's ReviewReason).
ALTER TABLE payment_orders ADD COLUMN fulfillment_review_json TEXT NULL;

-- The fulfillment scan set: only rows with a wake-up scheduled.
CREATE INDEX payment_orders_fulfillment_due
    ON payment_orders (fulfillment_next_check_at, id) WHERE fulfillment_next_check_at IS NOT NULL;
-- Sibling attempts of one business goal.
CREATE INDEX payment_orders_by_biz_key
    ON payment_orders (merchant_id, biz_key) WHERE biz_key IS NOT NULL;

-- `fulfilled` is never left (seed 000 §8): no automatic path, no stale
-- writer, no bug may move a fulfilled payment towards a refund.
CREATE FUNCTION sluice_fulfilled_is_final() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.fulfillment_state = 'fulfilled' AND NEW.fulfillment_state IS DISTINCT FROM 'fulfilled' THEN
        RAISE EXCEPTION 'fulfillment: a fulfilled payment is never compensated'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER payment_orders_fulfilled_is_final
    BEFORE UPDATE OF fulfillment_state ON payment_orders
    FOR EACH ROW EXECUTE FUNCTION sluice_fulfilled_is_final();

-- Pull mode: the merchant's fulfillment endpoint and the secret its calls are
-- signed with (like outgoing webhooks), one per merchant.
CREATE TABLE merchant_fulfillment_endpoints (
    merchant_id  TEXT    PRIMARY KEY REFERENCES merchants (id),
    url          TEXT    NOT NULL,
    secret       TEXT    NOT NULL,
    timeout_ms   BIGINT  NOT NULL CHECK (timeout_ms > 0),
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL
);
