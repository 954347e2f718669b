-- Room on each page for a row's next version, so that an update touching no
-- indexed column stays on its page as a heap-only tuple (HOT): no new entry
-- in any of the table's indexes, less WAL, and the old version pruned in
-- place. Both tables' rows are updated right after they are written, by an
-- update of no indexed column: an outbox event's claim (attempts,
-- claimed_until) and an idempotency key's completion (state and the stored
-- response). At the default fillfactor (100) the pages were full by then:
-- 10 % of the outbox's and half of the keys' updates were HOT (BENCHMARKS.md,
-- issue 17, session 17). It applies to pages written from now on.
ALTER TABLE outbox SET (fillfactor = 50);
ALTER TABLE idempotency_keys SET (fillfactor = 50);
