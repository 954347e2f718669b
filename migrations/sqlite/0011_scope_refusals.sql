-- The tenant boundary (architecture invariant 8): an event may only touch
-- aggregates of the connector account it came through. An event that names
-- an aggregate of another account is refused and kept here as evidence:
-- which account it came through, from where (a webhook's inbox row or the
-- answer to a call), what it named and the event itself. Append-only.
CREATE TABLE scope_refusals (
    id                    TEXT    PRIMARY KEY,
    source                TEXT    NOT NULL CHECK (source IN ('webhook', 'response')),
    connector_account_id  TEXT    NOT NULL,
    adapter               TEXT    NOT NULL,
    inbox_id              TEXT    NULL,
    entity                TEXT    NOT NULL,
    reference             TEXT    NOT NULL,
    event_json            TEXT    NOT NULL,
    created_at            BIGINT  NOT NULL
);
CREATE INDEX scope_refusals_by_account ON scope_refusals (connector_account_id, created_at);

CREATE TRIGGER scope_refusals_refuse_update BEFORE UPDATE ON scope_refusals
BEGIN
    SELECT RAISE(ABORT, 'scope_refusals is append-only: UPDATE refused');
END;

CREATE TRIGGER scope_refusals_refuse_delete BEFORE DELETE ON scope_refusals
BEGIN
    SELECT RAISE(ABORT, 'scope_refusals is append-only: DELETE refused');
END;

-- A PSP reference is unique within one connector account (one PSP account's
-- namespace), not across tenants: a hostile or mistaken answer naming another
-- tenant's PSP reference may land on the asking tenant's own attempt, and
-- never makes that tenant's genuine events ambiguous. Lookups by PSP reference
-- keep their (adapter, psp_reference) index and then check the account.
DROP INDEX payment_attempts_psp_reference;
CREATE INDEX payment_attempts_psp_reference
    ON payment_attempts (adapter, psp_reference) WHERE psp_reference IS NOT NULL;
CREATE UNIQUE INDEX payment_attempts_account_psp_reference
    ON payment_attempts (connector_account_id, psp_reference) WHERE psp_reference IS NOT NULL;
