-- The database's floor of one payment (issue 17): the rows a settled payment of
-- bench/payments.sh writes, in the same tables with their indexes, checks and
-- triggers, in the same commits, with no gateway in between. Run by
-- bench/payments.sh with pgbench -M prepared against the run's own database,
-- each pgbench transaction one payment. Counted from pg_stat_user_tables after
-- a run (BENCHMARKS.md, session 12): 14 rows inserted, 10 updated a payment;
-- since session 15 the record of the first send is inserted with the create.
-- :tpl_* name a settled payment of the warm-up whose rows are copied, so that
-- widths and values are the real ones; the ids are new for every payment.
SELECT nextval('floor_seq') AS n \gset
-- The idempotency key (its commit does not wait for the disk, as the gateway's).
WITH lazy_commit AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO idempotency_keys (merchant_id, endpoint, idem_key, request_fingerprint, state, locked_until, created_at)
SELECT merchant_id, endpoint, 'floor-' || :n, request_fingerprint, 'in_progress', locked_until, created_at
FROM idempotency_keys, lazy_commit WHERE merchant_id = :tpl_merchant AND endpoint = 'POST /v1/payments' AND idem_key = :tpl_key;
-- The create with confirm and the record of its first send, one commit: the
-- order (version 2), the attempt SUBMITTED, amounts, four history rows.
WITH o AS (INSERT INTO payment_orders (id, merchant_id, merchant_order_no, amount_minor, currency, capture_mode, state, version, payment_method_token, metadata_json, manual_review, created_at, updated_at)
    SELECT 'pay_floor_' || :n, merchant_id, 'floor-' || :n, amount_minor, currency, capture_mode, 'PROCESSING', 2, payment_method_token, metadata_json, 0, created_at, updated_at
    FROM payment_orders WHERE id = :tpl_payment RETURNING id),
a AS (INSERT INTO payment_attempts (id, payment_id, attempt_no, reference, adapter, connector_account_id, amount_minor, currency, capture_mode, payment_method_token, state, version, psp_reference, last_psp_call_at, created_at, updated_at, payment_method_type)
    SELECT 'att_floor_' || :n, 'pay_floor_' || :n, 1, 'ref_floor_' || :n, adapter, connector_account_id, amount_minor, currency, capture_mode, payment_method_token, 'SUBMITTED', 1, 'pi_floor_' || :n, created_at, created_at, created_at, payment_method_type
    FROM payment_attempts WHERE payment_id = :tpl_payment AND attempt_no = 1 RETURNING id),
m AS (INSERT INTO payment_amounts (payment_id, currency, amount_minor)
    SELECT 'pay_floor_' || :n, currency, amount_minor FROM payment_amounts WHERE payment_id = :tpl_payment RETURNING payment_id),
h AS (INSERT INTO state_history (payment_id, aggregate_type, aggregate_id, from_state, to_state, from_version, to_version, event_kind, evidence_source, psp_reference, decision, reason, adapter_name, actor, recorded_at)
    SELECT 'pay_floor_' || :n, aggregate_type, CASE aggregate_type WHEN 'order' THEN 'pay_floor_' || :n ELSE 'att_floor_' || :n END, from_state, to_state, from_version, to_version, event_kind, evidence_source, psp_reference, decision, reason, adapter_name, actor, recorded_at
    FROM state_history WHERE payment_id = :tpl_payment AND (evidence_source = 'command' OR event_kind = 'ATTEMPT_SUBMITTED') ORDER BY id RETURNING id)
SELECT (SELECT count(*) FROM o), (SELECT count(*) FROM a), (SELECT count(*) FROM m), (SELECT count(*) FROM h);
-- The PSP's answer: order and attempt to SUCCEEDED, the amounts, two history rows, one event.
WITH o AS (UPDATE payment_orders SET state = 'SUCCEEDED', version = version + 1, updated_at = updated_at + 2 WHERE id = 'pay_floor_' || :n AND version = 2 RETURNING id),
a AS (UPDATE payment_attempts SET state = 'SUCCEEDED', version = version + 1, authorized_at = updated_at, updated_at = updated_at + 1
    WHERE id = 'att_floor_' || :n AND version = 1 RETURNING id),
m AS (UPDATE payment_amounts SET authorized_minor = amount_minor, captured_minor = amount_minor WHERE payment_id = 'pay_floor_' || :n AND authorized_minor = 0 RETURNING payment_id),
h AS (INSERT INTO state_history (payment_id, aggregate_type, aggregate_id, from_state, to_state, from_version, to_version, event_kind, evidence_source, psp_reference, amount_minor, currency, raw_status, decision, reason, adapter_name, recorded_at)
    SELECT 'pay_floor_' || :n, aggregate_type, CASE aggregate_type WHEN 'order' THEN 'pay_floor_' || :n ELSE 'att_floor_' || :n END, from_state, to_state, from_version, to_version, event_kind, evidence_source, 'pi_floor_' || :n, amount_minor, currency, raw_status, decision, reason, adapter_name, recorded_at
    FROM state_history WHERE payment_id = :tpl_payment AND evidence_source = 'sync_response' AND event_kind = 'PAYMENT_SUCCEEDED' RETURNING id),
e AS (INSERT INTO outbox (event_id, event_type, partition_key, merchant_id, aggregate_type, aggregate_id, payment_version, payload, status, attempts, next_attempt_at, created_at)
    SELECT 'evt_floor_' || :n, event_type, 'pay_floor_' || :n, merchant_id, aggregate_type, 'pay_floor_' || :n, payment_version, payload, 'pending', 0, next_attempt_at, created_at
    FROM outbox WHERE partition_key = :tpl_payment RETURNING seq)
SELECT (SELECT count(*) FROM o), (SELECT count(*) FROM a), (SELECT count(*) FROM m), (SELECT count(*) FROM h), (SELECT count(*) FROM e);
-- The key's response (lazy, as the gateway's).
WITH lazy_commit AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE idempotency_keys k SET state = 'completed', response_status = t.response_status, response_body = t.response_body, completed_at = t.completed_at
FROM idempotency_keys t, lazy_commit WHERE k.merchant_id = :tpl_merchant AND k.endpoint = 'POST /v1/payments' AND k.idem_key = 'floor-' || :n
  AND t.merchant_id = :tpl_merchant AND t.endpoint = 'POST /v1/payments' AND t.idem_key = :tpl_key;
-- The PSP's webhook kept: its sealed body and its inbox row.
WITH b AS (INSERT INTO webhook_bodies (id, connector_account_id, payload_digest, sealed_body, received_at)
    SELECT 'whb_floor_' || :n, connector_account_id, payload_digest || :n, sealed_body, received_at FROM webhook_bodies WHERE id = :tpl_body RETURNING id)
INSERT INTO webhook_inbox (id, adapter, connector_account_id, provider_event_id, payload_digest, verification, event_json, status, attempts, next_attempt_at, received_at, raw_body_id)
SELECT 'inb_floor_' || :n, adapter, connector_account_id, 'evt_psp_floor_' || :n, payload_digest, verification, event_json, 'pending', 0, next_attempt_at, received_at, (SELECT id FROM b)
FROM webhook_inbox WHERE id = :tpl_inbox;
-- Its claim, then its decision: a duplicate of the answer, checked against the order's version.
UPDATE webhook_inbox SET status = 'processing', attempts = attempts + 1, claimed_until = next_attempt_at + 30000 WHERE id = 'inb_floor_' || :n;
WITH lazy_commit AS (SELECT set_config('synchronous_commit', 'off', true)),
v AS (SELECT id FROM payment_orders WHERE id = 'pay_floor_' || :n AND version = 3 FOR SHARE),
h AS (INSERT INTO state_history (payment_id, aggregate_type, aggregate_id, from_state, to_state, from_version, to_version, event_kind, evidence_source, provider_event_id, decision, reason, inbox_id, recorded_at)
    SELECT 'pay_floor_' || :n, aggregate_type, 'att_floor_' || :n, from_state, to_state, from_version, to_version, event_kind, evidence_source, 'evt_psp_floor_' || :n, decision, reason, 'inb_floor_' || :n, recorded_at
    FROM state_history, lazy_commit WHERE payment_id = :tpl_payment AND evidence_source = 'webhook' RETURNING id),
i AS (UPDATE webhook_inbox SET status = 'processed', processed_at = next_attempt_at, claimed_until = NULL WHERE id = 'inb_floor_' || :n RETURNING id)
SELECT (SELECT count(*) FROM v), (SELECT count(*) FROM h), (SELECT count(*) FROM i);
-- The event handed over: claimed, then marked sent.
UPDATE outbox SET attempts = attempts + 1, claimed_until = next_attempt_at + 30000 WHERE event_id = 'evt_floor_' || :n;
UPDATE outbox SET status = 'sent', sent_at = next_attempt_at, claimed_until = NULL WHERE event_id = 'evt_floor_' || :n;
