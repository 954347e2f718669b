-- Operator review (issue 6, seed 001 §10): individually identified operators
-- and two-person resolution proposals. A proposal is applied only through
-- the store's door, as an event of evidence `operator`; this table records
-- who proposed and who decided, and the database refuses a proposal decided
-- by the person who proposed it.
CREATE TABLE operators (
    id           TEXT    PRIMARY KEY,
    name         TEXT    NOT NULL UNIQUE,
    -- hex(HMAC-SHA256(pepper, key)), like API keys; the key is shown once.
    key_hash     TEXT    NOT NULL UNIQUE,
    key_prefix   TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    disabled_at  BIGINT  NULL
);

CREATE TABLE review_proposals (
    id               TEXT    PRIMARY KEY,
    payment_id       TEXT    NOT NULL REFERENCES payment_orders (id),
    target_type      TEXT    NOT NULL CHECK (target_type IN ('order', 'attempt', 'capture', 'refund')),
    target_id        TEXT    NOT NULL,
    outcome          TEXT    NOT NULL,
    reason_code      TEXT    NOT NULL,
    evidence_note    TEXT    NOT NULL,
    -- What the proposer saw: approval is refused once the payment moved.
    payment_version  BIGINT  NOT NULL,
    target_state     TEXT    NOT NULL,
    target_version   BIGINT  NOT NULL,
    proposed_by      TEXT    NOT NULL REFERENCES operators (id),
    proposed_at      BIGINT  NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'proposed'
        CHECK (status IN ('proposed', 'applied', 'rejected', 'refused', 'stale')),
    decided_by       TEXT    NULL REFERENCES operators (id),
    decided_at       BIGINT  NULL,
    decision_note    TEXT    NULL,
    -- What the door decided on approval (JSON), or why it was not applied.
    result_json      TEXT    NULL,
    CONSTRAINT review_needs_two_people CHECK (decided_by IS NULL OR decided_by <> proposed_by)
);
CREATE INDEX review_proposals_by_payment ON review_proposals (payment_id, proposed_at);

-- The review queue and the manual_review gauge read only flagged payments.
CREATE INDEX payment_orders_in_review ON payment_orders (id) WHERE manual_review = 1;
-- The /metrics gauges count open orders per state from this index.
CREATE INDEX payment_orders_open ON payment_orders (state, created_at)
    WHERE state IN ('CREATED', 'PROCESSING', 'REQUIRES_ACTION', 'AUTHORIZED');
