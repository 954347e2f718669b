-- PostgreSQL only (its 0022_batch_check.sql): the function a door decision's
-- single-statement writes check themselves with outside a transaction. On
-- SQLite every door decision runs in its write transaction, which rolls back
-- a write that does not hold; nothing changes here. The number is kept so
-- that both migration sets stay in step.
SELECT 1;
