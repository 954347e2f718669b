-- state_history_by_identity (0001) served an early duplicate check by
-- (aggregate, event identity) that moved to the aggregates' own
-- last_event_identity column; no statement reads it any more, and every
-- history row with an identity (most of a payment's) paid an index entry for
-- it: WAL, a page to write back, CPU on every decision (BENCHMARKS.md,
-- issue 17, session 16).
DROP INDEX IF EXISTS state_history_by_identity;
