-- Reconciliation (issue 14): one run per connector account, period and
-- report (its SHA-256 digest), so uploading the same report again finds the
-- run instead of starting another, and each classified difference with both
-- sides' records as evidence and what was done about it. No card data and no
-- secret is stored here: our side is states, references and amounts, the
-- PSP's side the adapter's normalised settlement line.
CREATE TABLE reconciliation_runs (
    id                    TEXT    PRIMARY KEY,
    connector_account_id  TEXT    NOT NULL REFERENCES connector_accounts (id),
    adapter               TEXT    NOT NULL,
    period_start          BIGINT  NOT NULL,
    period_end            BIGINT  NOT NULL,
    report_digest         TEXT    NOT NULL,
    line_count            BIGINT  NOT NULL CHECK (line_count >= 0),
    matched_lines         BIGINT  NOT NULL CHECK (matched_lines >= 0),
    ignored_lines         BIGINT  NOT NULL CHECK (ignored_lines >= 0),
    difference_count      BIGINT  NOT NULL CHECK (difference_count >= 0),
    repaired_count        BIGINT  NOT NULL DEFAULT 0 CHECK (repaired_count >= 0),
    review_count          BIGINT  NOT NULL DEFAULT 0 CHECK (review_count >= 0),
    -- {"<class>": {"count": n, "amount_minor": m}}: what the run found.
    class_totals          TEXT    NOT NULL,
    status                TEXT    NOT NULL CHECK (status IN ('repairing', 'completed')),
    created_at            BIGINT  NOT NULL,
    completed_at          BIGINT  NULL,
    CONSTRAINT reconciliation_runs_period CHECK (period_start < period_end),
    CONSTRAINT reconciliation_runs_one_per_report
        UNIQUE (connector_account_id, period_start, period_end, report_digest)
);
CREATE INDEX reconciliation_runs_by_account
    ON reconciliation_runs (connector_account_id, created_at);

CREATE TABLE reconciliation_differences (
    seq                BIGINT  NOT NULL,
    id                 TEXT    PRIMARY KEY,
    run_id             TEXT    NOT NULL REFERENCES reconciliation_runs (id),
    class              TEXT    NOT NULL,
    attempt_reference  TEXT    NULL,
    action_reference   TEXT    NULL,
    psp_reference      TEXT    NULL,
    -- The payment of ours the difference is about, when there is one.
    payment_id         TEXT    NULL,
    amount_minor       BIGINT  NOT NULL CHECK (amount_minor >= 0),
    currency           TEXT    NOT NULL,
    ours_json          TEXT    NOT NULL,
    psp_json           TEXT    NOT NULL,
    -- The one safe repair the matcher found (JSON), or NULL: review.
    repair_json        TEXT    NULL,
    resolution         TEXT    NOT NULL CHECK (resolution IN ('open', 'repaired', 'in_review', 'closed')),
    resolution_detail  TEXT    NULL,
    -- The history row of the door's decision (a repair or the review flag).
    history_id         BIGINT  NULL,
    created_at         BIGINT  NOT NULL,
    resolved_at        BIGINT  NULL,
    CONSTRAINT reconciliation_differences_seq UNIQUE (run_id, seq)
);
CREATE INDEX reconciliation_differences_by_class
    ON reconciliation_differences (run_id, class, seq);
CREATE INDEX reconciliation_differences_unresolved
    ON reconciliation_differences (created_at) WHERE resolution IN ('open', 'in_review');

-- Our side of a report's period: the attempts of one account by creation time.
CREATE INDEX payment_attempts_by_account_created
    ON payment_attempts (connector_account_id, created_at);
