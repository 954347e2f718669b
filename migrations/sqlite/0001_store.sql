-- Sluice store schema, SQLite flavour. The PostgreSQL flavour in
-- migrations/postgres/ has the same tables, columns, constraints and indexes;
-- only types, identity columns and trigger syntax differ.
-- Times are unix milliseconds (BIGINT); money is BIGINT minor units.

CREATE TABLE merchants (
    id          TEXT    PRIMARY KEY,
    name        TEXT    NOT NULL,
    status      TEXT    NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    created_at  BIGINT  NOT NULL,
    updated_at  BIGINT  NOT NULL
);

-- Only a keyed hash of an API key is stored (HMAC-SHA256 with a server pepper).
CREATE TABLE api_keys (
    id            TEXT    PRIMARY KEY,
    merchant_id   TEXT    NOT NULL REFERENCES merchants (id),
    key_hash      TEXT    NOT NULL UNIQUE,
    key_prefix    TEXT    NOT NULL,
    label         TEXT    NOT NULL DEFAULT '',
    created_at    BIGINT  NOT NULL,
    revoked_at    BIGINT  NULL
);
CREATE INDEX api_keys_by_merchant ON api_keys (merchant_id);

CREATE TABLE connector_accounts (
    id            TEXT    PRIMARY KEY,
    merchant_id   TEXT    NOT NULL REFERENCES merchants (id),
    adapter       TEXT    NOT NULL,
    label         TEXT    NOT NULL,
    config_json   TEXT    NOT NULL DEFAULT '{}',
    secrets_json  TEXT    NOT NULL DEFAULT '{}',
    status        TEXT    NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL,
    UNIQUE (merchant_id, label)
);

-- The merchant's payment intent. `version` is the payment version: it moves on
-- every applied decision for the payment or any of its attempts, captures and
-- refunds, so CAS on it serialises all changes of one payment.
CREATE TABLE payment_orders (
    id                    TEXT    PRIMARY KEY,
    merchant_id           TEXT    NOT NULL REFERENCES merchants (id),
    merchant_order_no     TEXT    NOT NULL,
    amount_minor          BIGINT  NOT NULL CHECK (amount_minor > 0),
    currency              TEXT    NOT NULL CHECK (length(currency) = 3),
    capture_mode          TEXT    NOT NULL CHECK (capture_mode IN ('automatic', 'manual')),
    state                 TEXT    NOT NULL CHECK (state IN ('CREATED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED', 'SUCCEEDED', 'FAILED', 'CANCELED', 'EXPIRED')),
    version               BIGINT  NOT NULL DEFAULT 0,
    payment_method_token  TEXT    NULL,
    return_url            TEXT    NULL,
    description           TEXT    NULL,
    metadata_json         TEXT    NOT NULL DEFAULT '{}',
    -- Business fulfilment (seed 000): the long-lived business goal and its deadline.
    biz_key               TEXT    NULL,
    fulfillment_deadline  BIGINT  NULL,
    fulfillment_mode      TEXT    NULL,
    fulfillment_state     TEXT    NULL,
    manual_review         BIGINT  NOT NULL DEFAULT 0 CHECK (manual_review IN (0, 1)),
    manual_review_reason  TEXT    NULL,
    created_at            BIGINT  NOT NULL,
    updated_at            BIGINT  NOT NULL,
    UNIQUE (merchant_id, merchant_order_no)
);
CREATE INDEX payment_orders_by_merchant ON payment_orders (merchant_id, id);

-- Money invariants live here and are enforced by the database itself.
CREATE TABLE payment_amounts (
    payment_id              TEXT    PRIMARY KEY REFERENCES payment_orders (id),
    currency                TEXT    NOT NULL,
    amount_minor            BIGINT  NOT NULL CHECK (amount_minor > 0),
    authorized_minor        BIGINT  NOT NULL DEFAULT 0,
    capture_reserved_minor  BIGINT  NOT NULL DEFAULT 0,
    captured_minor          BIGINT  NOT NULL DEFAULT 0,
    refund_reserved_minor   BIGINT  NOT NULL DEFAULT 0,
    refunded_minor          BIGINT  NOT NULL DEFAULT 0,
    CONSTRAINT amounts_authorized_within_amount
        CHECK (authorized_minor >= 0 AND authorized_minor <= amount_minor),
    CONSTRAINT amounts_captured_within_authorized
        CHECK (captured_minor >= 0 AND capture_reserved_minor >= 0
               AND captured_minor + capture_reserved_minor <= authorized_minor),
    CONSTRAINT amounts_refunded_within_captured
        CHECK (refunded_minor >= 0 AND refund_reserved_minor >= 0
               AND refunded_minor + refund_reserved_minor <= captured_minor)
);

CREATE TABLE payment_attempts (
    id                    TEXT    PRIMARY KEY,
    payment_id            TEXT    NOT NULL REFERENCES payment_orders (id),
    attempt_no            BIGINT  NOT NULL CHECK (attempt_no >= 1),
    reference             TEXT    NOT NULL UNIQUE,
    adapter               TEXT    NOT NULL,
    connector_account_id  TEXT    NOT NULL REFERENCES connector_accounts (id),
    psp_reference         TEXT    NULL,
    amount_minor          BIGINT  NOT NULL CHECK (amount_minor > 0),
    currency              TEXT    NOT NULL,
    capture_mode          TEXT    NOT NULL CHECK (capture_mode IN ('automatic', 'manual')),
    payment_method_token  TEXT    NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('CREATED', 'SUBMITTED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED', 'SUCCEEDED', 'FAILED', 'CANCELED', 'UNKNOWN')),
    version               BIGINT  NOT NULL DEFAULT 0,
    next_retry_time       BIGINT  NULL,
    retry_count           BIGINT  NOT NULL DEFAULT 0,
    timeout_at            BIGINT  NULL,
    expires_at            BIGINT  NULL,
    last_event_identity   TEXT    NULL,
    next_action_url       TEXT    NULL,
    failure_code          TEXT    NULL,
    failure_category      TEXT    NULL,
    failure_message       TEXT    NULL,
    created_at            BIGINT  NOT NULL,
    updated_at            BIGINT  NOT NULL,
    UNIQUE (payment_id, attempt_no)
);
CREATE UNIQUE INDEX payment_attempts_psp_reference
    ON payment_attempts (adapter, psp_reference) WHERE psp_reference IS NOT NULL;
-- At most one live attempt per payment: a new attempt only after the previous
-- one ended definitively (FAILED, or CANCELED by the PSP). Never while UNKNOWN.
CREATE UNIQUE INDEX payment_attempts_one_live
    ON payment_attempts (payment_id) WHERE state NOT IN ('FAILED', 'CANCELED');
-- The recovery scan set: non-terminal attempts by next_retry_time.
CREATE INDEX payment_attempts_scan
    ON payment_attempts (next_retry_time, id) WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED');

CREATE TABLE captures (
    id                    TEXT    PRIMARY KEY,
    payment_id            TEXT    NOT NULL REFERENCES payment_orders (id),
    attempt_id            TEXT    NOT NULL REFERENCES payment_attempts (id),
    reference             TEXT    NOT NULL UNIQUE,
    adapter               TEXT    NOT NULL,
    psp_reference         TEXT    NULL,
    amount_minor          BIGINT  NOT NULL CHECK (amount_minor > 0),
    currency              TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('CREATED', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED', 'FAILED')),
    version               BIGINT  NOT NULL DEFAULT 0,
    next_retry_time       BIGINT  NULL,
    retry_count           BIGINT  NOT NULL DEFAULT 0,
    last_event_identity   TEXT    NULL,
    failure_code          TEXT    NULL,
    failure_category      TEXT    NULL,
    failure_message       TEXT    NULL,
    created_at            BIGINT  NOT NULL,
    updated_at            BIGINT  NOT NULL
);
CREATE INDEX captures_by_payment ON captures (payment_id, created_at);
-- Several captures of one payment may share the PSP payment reference, so this one is not unique.
CREATE INDEX captures_psp_reference ON captures (adapter, psp_reference) WHERE psp_reference IS NOT NULL;
CREATE INDEX captures_scan
    ON captures (next_retry_time, id) WHERE state NOT IN ('SUCCEEDED', 'FAILED');

CREATE TABLE refunds (
    id                    TEXT    PRIMARY KEY,
    payment_id            TEXT    NOT NULL REFERENCES payment_orders (id),
    attempt_id            TEXT    NOT NULL REFERENCES payment_attempts (id),
    reference             TEXT    NOT NULL UNIQUE,
    adapter               TEXT    NOT NULL,
    psp_reference         TEXT    NULL,
    amount_minor          BIGINT  NOT NULL CHECK (amount_minor > 0),
    currency              TEXT    NOT NULL,
    reason                TEXT    NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('CREATED', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED', 'FAILED', 'CANCELED')),
    version               BIGINT  NOT NULL DEFAULT 0,
    next_retry_time       BIGINT  NULL,
    retry_count           BIGINT  NOT NULL DEFAULT 0,
    last_event_identity   TEXT    NULL,
    failure_code          TEXT    NULL,
    failure_category      TEXT    NULL,
    failure_message       TEXT    NULL,
    created_at            BIGINT  NOT NULL,
    updated_at            BIGINT  NOT NULL
);
CREATE INDEX refunds_by_payment ON refunds (payment_id, created_at);
CREATE UNIQUE INDEX refunds_psp_reference
    ON refunds (adapter, psp_reference) WHERE psp_reference IS NOT NULL;
CREATE INDEX refunds_scan
    ON refunds (next_retry_time, id) WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED');

-- Transport-level dedupe of PSP webhooks. Rejected (unverified) webhooks are kept
-- as evidence but never occupy a provider event id, so a forged request cannot
-- pre-empt the genuine event.
CREATE TABLE webhook_inbox (
    id                    TEXT    PRIMARY KEY,
    adapter               TEXT    NOT NULL,
    connector_account_id  TEXT    NOT NULL,
    provider_event_id     TEXT    NULL,
    payload_digest        TEXT    NOT NULL,
    verification          TEXT    NOT NULL CHECK (verification IN ('verified', 'rejected')),
    verification_detail   TEXT    NULL,
    event_json            TEXT    NULL,
    status                TEXT    NOT NULL CHECK (status IN ('pending', 'processing', 'processed', 'failed', 'quarantined')),
    attempts              BIGINT  NOT NULL DEFAULT 0,
    next_attempt_at       BIGINT  NOT NULL,
    claimed_until         BIGINT  NULL,
    last_error            TEXT    NULL,
    quarantine_reason     TEXT    NULL,
    received_at           BIGINT  NOT NULL,
    processed_at          BIGINT  NULL,
    CONSTRAINT inbox_verified_rows_have_event_id
        CHECK (verification = 'rejected' OR provider_event_id IS NOT NULL),
    CONSTRAINT inbox_rejected_rows_are_quarantined
        CHECK (verification = 'verified' OR (provider_event_id IS NULL AND status = 'quarantined')),
    UNIQUE (adapter, connector_account_id, provider_event_id)
);
CREATE INDEX webhook_inbox_work
    ON webhook_inbox (next_attempt_at, id) WHERE status IN ('pending', 'processing', 'failed');

-- Every decision about every aggregate, applied or not. Append-only (triggers below).
CREATE TABLE state_history (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id         TEXT    NOT NULL,
    aggregate_type     TEXT    NOT NULL CHECK (aggregate_type IN ('order', 'attempt', 'capture', 'refund')),
    aggregate_id       TEXT    NOT NULL,
    from_state         TEXT    NULL,
    to_state           TEXT    NOT NULL,
    from_version       BIGINT  NULL,
    to_version         BIGINT  NOT NULL,
    event_kind         TEXT    NOT NULL,
    evidence_source    TEXT    NOT NULL,
    provider_event_id  TEXT    NULL,
    psp_reference      TEXT    NULL,
    event_identity     TEXT    NULL,
    amount_minor       BIGINT  NULL,
    currency           TEXT    NULL,
    raw_status         TEXT    NULL,
    failure_code       TEXT    NULL,
    decision           TEXT    NOT NULL CHECK (decision IN ('applied', 'ignored_duplicate', 'ignored_stale', 'rejected', 'needs_reconciliation')),
    reason             TEXT    NOT NULL,
    adapter_name       TEXT    NULL,
    adapter_version    TEXT    NULL,
    adapter_digest     TEXT    NULL,
    actor              TEXT    NULL,
    trace_id           TEXT    NULL,
    inbox_id           TEXT    NULL,
    recorded_at        BIGINT  NOT NULL
);
CREATE INDEX state_history_by_payment ON state_history (payment_id, id);
CREATE INDEX state_history_by_aggregate ON state_history (aggregate_type, aggregate_id, id);
CREATE INDEX state_history_by_identity ON state_history (aggregate_id, event_identity) WHERE event_identity IS NOT NULL;

CREATE TRIGGER state_history_refuses_update BEFORE UPDATE ON state_history
BEGIN
    SELECT RAISE(ABORT, 'state_history is append-only: UPDATE refused');
END;

CREATE TRIGGER state_history_refuses_delete BEFORE DELETE ON state_history
BEGIN
    SELECT RAISE(ABORT, 'state_history is append-only: DELETE refused');
END;

-- Transactional outbox: written in the same transaction as the state change.
CREATE TABLE outbox (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id         TEXT    NOT NULL UNIQUE,
    event_type       TEXT    NOT NULL,
    partition_key    TEXT    NOT NULL,
    merchant_id      TEXT    NOT NULL,
    aggregate_type   TEXT    NOT NULL,
    aggregate_id     TEXT    NOT NULL,
    payment_version  BIGINT  NOT NULL,
    payload          TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts         BIGINT  NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT  NOT NULL,
    claimed_until    BIGINT  NULL,
    last_error       TEXT    NULL,
    created_at       BIGINT  NOT NULL,
    sent_at          BIGINT  NULL
);
CREATE INDEX outbox_pending ON outbox (next_attempt_at, seq) WHERE status = 'pending';
CREATE INDEX outbox_by_partition ON outbox (partition_key, seq);

-- What an outbox row says is as immutable as history; only delivery
-- bookkeeping may change, and only delivered rows may be pruned.
CREATE TRIGGER outbox_event_is_immutable BEFORE UPDATE ON outbox
WHEN NEW.event_id IS NOT OLD.event_id
  OR NEW.event_type IS NOT OLD.event_type
  OR NEW.partition_key IS NOT OLD.partition_key
  OR NEW.merchant_id IS NOT OLD.merchant_id
  OR NEW.aggregate_type IS NOT OLD.aggregate_type
  OR NEW.aggregate_id IS NOT OLD.aggregate_id
  OR NEW.payment_version IS NOT OLD.payment_version
  OR NEW.payload IS NOT OLD.payload
  OR NEW.created_at IS NOT OLD.created_at
  OR NEW.seq IS NOT OLD.seq
BEGIN
    SELECT RAISE(ABORT, 'outbox events are immutable: only delivery status may change');
END;

CREATE TRIGGER outbox_keeps_undelivered BEFORE DELETE ON outbox
WHEN OLD.status <> 'sent'
BEGIN
    SELECT RAISE(ABORT, 'outbox: only delivered events may be deleted');
END;

-- Merchant request idempotency (Idempotency-Key header).
CREATE TABLE idempotency_keys (
    merchant_id          TEXT    NOT NULL REFERENCES merchants (id),
    endpoint             TEXT    NOT NULL,
    idem_key             TEXT    NOT NULL,
    request_fingerprint  TEXT    NOT NULL,
    state                TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    response_status      BIGINT  NULL,
    response_body        TEXT    NULL,
    locked_until         BIGINT  NULL,
    created_at           BIGINT  NOT NULL,
    completed_at         BIGINT  NULL,
    PRIMARY KEY (merchant_id, endpoint, idem_key),
    CONSTRAINT idempotency_completed_has_response
        CHECK (state = 'in_progress' OR response_status IS NOT NULL)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
