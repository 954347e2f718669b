-- Account health (issue 13): an operator may pause a connector account for
-- new attempts (its open attempts keep converging: queries and webhooks go
-- on), and every pause, resume and breaker transition of the account is
-- written to its append-only history, with the reason.
ALTER TABLE connector_accounts ADD COLUMN paused_reason TEXT;
ALTER TABLE connector_accounts ADD COLUMN paused_at BIGINT;

CREATE TABLE connector_account_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id  TEXT    NOT NULL REFERENCES connector_accounts (id),
    kind        TEXT    NOT NULL CHECK (kind IN ('paused', 'resumed', 'breaker')),
    detail      TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    at_ms       BIGINT  NOT NULL
);
CREATE INDEX connector_account_events_by_account ON connector_account_events (account_id, seq);

CREATE TRIGGER connector_account_events_refuse_update BEFORE UPDATE ON connector_account_events
BEGIN
    SELECT RAISE(ABORT, 'connector_account_events is append-only: UPDATE refused');
END;

CREATE TRIGGER connector_account_events_refuse_delete BEFORE DELETE ON connector_account_events
BEGIN
    SELECT RAISE(ABORT, 'connector_account_events is append-only: DELETE refused');
END;
