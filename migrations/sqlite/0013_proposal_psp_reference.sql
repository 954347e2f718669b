-- Operator review (issue 11 §3): an operator's success outcome carries the
-- PSP's reference as evidence (required for attempt_succeeded), applied to the
-- attempt, capture or refund on approval, so later refunds and captures can be
-- sent against it. NULL for every other outcome.
ALTER TABLE review_proposals ADD COLUMN psp_reference TEXT NULL;
