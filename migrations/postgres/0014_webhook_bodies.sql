-- Secrets at rest (issue 11 §5): each verified raw webhook body is kept as
-- evidence of what the PSP sent, sealed by the store's secret box (an
-- `sbx1:` envelope, bound to its row; sluice_store::secret_box). One row per
-- body (connector account + sha256 of the body); every inbox row made from it
-- names it in raw_body_id. Connector, webhook endpoint and fulfillment
-- endpoint secrets keep their columns but hold sealed envelopes too: a
-- migration has no master key, so rows written in clear before this version
-- are sealed by the gateway at start-up (Store::reseal_secrets).
CREATE TABLE webhook_bodies (
    id                    TEXT    PRIMARY KEY,
    connector_account_id  TEXT    NOT NULL,
    payload_digest        TEXT    NOT NULL,
    sealed_body           TEXT    NOT NULL,
    received_at           BIGINT  NOT NULL,
    UNIQUE (connector_account_id, payload_digest)
);

ALTER TABLE webhook_inbox ADD COLUMN raw_body_id TEXT NULL REFERENCES webhook_bodies (id);
