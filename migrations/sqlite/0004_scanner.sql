-- Recovery scanner leases: while one scanner instance queries an attempt,
-- capture or refund, no other instance may (issue 6, several instances).
-- A lease that outlives a crashed holder simply expires.
CREATE TABLE scanner_leases (
    kind         TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    holder       TEXT    NOT NULL,
    lease_until  BIGINT  NOT NULL,
    PRIMARY KEY (kind, id)
);
