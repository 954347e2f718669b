-- PostgreSQL only (its 0023_row_checks.sql): three tables' CHECKs as one
-- function call each, because PostgreSQL re-reads every CHECK for every
-- statement that writes its table. SQLite keeps its CHECKs as they are;
-- nothing changes here. The number is kept so that both migration sets stay
-- in step.
SELECT 1;
