-- Adapter releases (issue 15): the adapter version that built an attempt's
-- requests (pinned when the attempt is first sent, so an attempt started on a
-- canary keeps being served and queried by that version), the append-only
-- history of an adapter's shadow and canary changes, and the diffs a shadow
-- version produced against the active one.
ALTER TABLE payment_attempts ADD COLUMN adapter_version TEXT;
ALTER TABLE payment_attempts ADD COLUMN adapter_digest TEXT;

CREATE TABLE adapter_events (
    seq         BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    adapter     TEXT    NOT NULL,
    digest      TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('shadow_staged', 'shadow_cleared',
                        'canary_started', 'canary_stopped', 'canary_rolled_back')),
    detail      TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    at_ms       BIGINT  NOT NULL
);
CREATE INDEX adapter_events_by_adapter ON adapter_events (adapter, seq);

CREATE FUNCTION sluice_adapter_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'adapter_events is append-only: % refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;

CREATE TRIGGER adapter_events_refuse_update_delete
    BEFORE UPDATE OR DELETE ON adapter_events
    FOR EACH ROW EXECUTE FUNCTION sluice_adapter_events_append_only();

CREATE TABLE adapter_shadow_diffs (
    seq            BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    adapter        TEXT    NOT NULL,
    active_digest  TEXT    NOT NULL,
    shadow_digest  TEXT    NOT NULL,
    operation      TEXT    NOT NULL,
    account_id     TEXT    NOT NULL,
    input_digest   TEXT    NOT NULL,
    fields_json    TEXT    NOT NULL,
    at_ms          BIGINT  NOT NULL
);
CREATE INDEX adapter_shadow_diffs_by_version ON adapter_shadow_diffs (adapter, shadow_digest, seq);
