-- Three indexes whose lookups another index already answers. Each cost an
-- entry with every row written (and with every new version of an attempt,
-- whose updates are never HOT: its state is indexed) and is read by no
-- statement on its own (BENCHMARKS.md, issue 17, session 17):
-- * state_history_by_aggregate (aggregate_type, aggregate_id, id): every
--   aggregate belongs to one payment, and its readers now ask by payment
--   first, which state_history_by_payment (payment_id, id) covers; a payment
--   has tens of rows, not thousands.
-- * payment_attempts_psp_reference (adapter, psp_reference): the door's
--   lookup by PSP reference at one adapter goes through the search index on
--   psp_reference alone (0018) and filters the adapter; one reference is at
--   most a few rows. Refunds keep theirs: it is unique.
-- * captures_psp_reference (adapter, psp_reference): no statement looks a
--   capture up by PSP reference except the search, which has its own (0018).
DROP INDEX IF EXISTS state_history_by_aggregate;
DROP INDEX IF EXISTS payment_attempts_psp_reference;
DROP INDEX IF EXISTS captures_psp_reference;
