-- PostgreSQL only (its 0026_fillfactor.sql): free space on each page for an
-- updated row's next version, so that PostgreSQL can update it in place
-- without new index entries. SQLite has no such setting; nothing changes
-- here. The number is kept so that both migration sets stay in step.
SELECT 1;
