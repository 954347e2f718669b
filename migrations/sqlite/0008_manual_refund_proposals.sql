-- Operator review (issue 6): a two-person manual refund carries its amount
-- (minor units of the payment's currency). NULL for every other outcome.
ALTER TABLE review_proposals ADD COLUMN amount_minor BIGINT NULL;
