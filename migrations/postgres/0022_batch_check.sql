-- A door decision's writes as one statement outside any transaction (issue
-- 17): the statement checks each write's row count itself and raises at the
-- first that does not hold, which undoes the whole statement, so its writes
-- commit all together or not at all, as in a transaction rolled back. The
-- message names the write and its row count as `<write>:<rows>` for the store
-- (`host/store/src/door/batch.rs`, `Batch::run_alone`); SQLSTATE SLB01 is
-- this function's alone.
CREATE FUNCTION sluice_batch_check(moved BIGINT[], wanted BIGINT[]) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF coalesce(array_length(moved, 1), 0) <> coalesce(array_length(wanted, 1), 0) THEN
        RAISE EXCEPTION 'sluice_batch_check: % counts for % writes',
            coalesce(array_length(moved, 1), 0), coalesce(array_length(wanted, 1), 0);
    END IF;
    FOR i IN 1 .. coalesce(array_length(wanted, 1), 0) LOOP
        IF moved[i] IS DISTINCT FROM wanted[i] THEN
            RAISE EXCEPTION USING ERRCODE = 'SLB01', MESSAGE = (i - 1) || ':' || moved[i];
        END IF;
    END LOOP;
    RETURN 0;
END;
$$;
