-- The payment method type an attempt was routed for (issue 13, seed 001
-- §11: success rates and failure codes per PSP, account and payment
-- method). NULL for attempts created before it was recorded.
ALTER TABLE payment_attempts ADD COLUMN payment_method_type TEXT;
