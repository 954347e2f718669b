-- Issue 11 §3: every AUTHORIZED attempt keeps an exit. The door records when
-- an authorization was taken (its validity watch starts there) and when a
-- void of it was recorded as sent (before the call, so a crash after sending
-- converges by query). Both are facts written by the door, never by hand.
ALTER TABLE payment_attempts ADD COLUMN authorized_at BIGINT NULL;
ALTER TABLE payment_attempts ADD COLUMN void_requested_at BIGINT NULL;
-- Authorizations the scanner used to park outside the scan set come back into
-- it, so their validity is watched (their creation time stands in for the
-- authorization time: earlier, so never a late expiry).
UPDATE payment_attempts SET next_retry_time = updated_at
    WHERE state = 'AUTHORIZED' AND next_retry_time IS NULL;
