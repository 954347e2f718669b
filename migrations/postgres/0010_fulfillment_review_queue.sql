-- The operator review queue also lists payments whose fulfillment automation
-- froze in manual_review (a contradictory business fact, a failed
-- compensation refund): keep that lookup off a scan of every order.
CREATE INDEX payment_orders_fulfillment_in_review
    ON payment_orders (id) WHERE fulfillment_state = 'manual_review';
