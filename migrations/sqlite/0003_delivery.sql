-- Outbox delivery (sluice-delivery): merchant webhook endpoints and one
-- delivery row per (event, sink, target). The PostgreSQL flavour in
-- migrations/postgres/0003_delivery.sql is identical.
--
-- The publisher fans an outbox event out into these rows and marks the outbox
-- row `sent` in the same transaction; from then on each row is retried,
-- dead-lettered and replayed on its own, so one failing endpoint (or a NATS
-- outage) never holds back another sink.

CREATE TABLE webhook_endpoints (
    id           TEXT    PRIMARY KEY,
    merchant_id  TEXT    NOT NULL REFERENCES merchants (id),
    url          TEXT    NOT NULL,
    description  TEXT    NOT NULL DEFAULT '',
    -- JSON array of event type patterns: "*", "payment.*" or an exact type.
    event_types  TEXT    NOT NULL,
    -- The HMAC key for Sluice-Signature. Kept readable: signing needs it.
    secret       TEXT    NOT NULL,
    enabled      BIGINT  NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL
);
CREATE INDEX webhook_endpoints_by_merchant ON webhook_endpoints (merchant_id, id);

CREATE TABLE event_deliveries (
    id                    TEXT    PRIMARY KEY,
    event_id              TEXT    NOT NULL REFERENCES outbox (event_id),
    -- Copied from the outbox row (immutable there) so claims can keep
    -- per-payment order without a join.
    event_seq             BIGINT  NOT NULL,
    event_created_at      BIGINT  NOT NULL,
    partition_key         TEXT    NOT NULL,
    payment_version       BIGINT  NOT NULL,
    merchant_id           TEXT    NOT NULL,
    sink                  TEXT    NOT NULL CHECK (sink IN ('webhook', 'nats')),
    -- The webhook endpoint id, or the JetStream stream name.
    target                TEXT    NOT NULL,
    endpoint_id           TEXT    NULL REFERENCES webhook_endpoints (id),
    status                TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'dead')),
    attempts              BIGINT  NOT NULL DEFAULT 0,
    next_attempt_at       BIGINT  NOT NULL,
    claimed_until         BIGINT  NULL,
    claim_token           TEXT    NULL,
    last_attempt_at       BIGINT  NULL,
    last_error            TEXT    NULL,
    last_response_status  BIGINT  NULL,
    replays               BIGINT  NOT NULL DEFAULT 0,
    created_at            BIGINT  NOT NULL,
    sent_at               BIGINT  NULL,
    dead_at               BIGINT  NULL,
    CONSTRAINT deliveries_webhooks_name_their_endpoint
        CHECK ((sink = 'webhook' AND endpoint_id IS NOT NULL AND endpoint_id = target)
               OR (sink <> 'webhook' AND endpoint_id IS NULL)),
    UNIQUE (event_id, sink, target)
);
CREATE INDEX event_deliveries_due
    ON event_deliveries (sink, next_attempt_at, event_seq) WHERE status = 'pending';
-- Per-payment order: "is an earlier event of this payment still pending for this target?"
CREATE INDEX event_deliveries_order
    ON event_deliveries (target, partition_key, event_seq) WHERE status = 'pending';
CREATE INDEX event_deliveries_dead
    ON event_deliveries (dead_at, id) WHERE status = 'dead';
