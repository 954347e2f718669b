-- When the host last sent a request or a query to the PSP for an attempt,
-- capture or refund: the recovery scanner's backoff starts from it.
ALTER TABLE payment_attempts ADD COLUMN last_psp_call_at BIGINT NULL;
ALTER TABLE captures ADD COLUMN last_psp_call_at BIGINT NULL;
ALTER TABLE refunds ADD COLUMN last_psp_call_at BIGINT NULL;
