-- Routing (issue 13): one routing configuration per merchant, the JSON of
-- sluice_core::RoutingConfig (ordered rules on currency, amount range, payment
-- method type and metadata with weighted connector accounts, the fallback
-- chain, the merchant's failure-table overrides), validated by the core
-- before it is written. `version` counts replacements, so an attempt's
-- history can name the configuration that routed it.
CREATE TABLE routing_configs (
    merchant_id  TEXT    PRIMARY KEY REFERENCES merchants (id),
    config_json  TEXT    NOT NULL,
    version      BIGINT  NOT NULL CHECK (version >= 1),
    updated_at   BIGINT  NOT NULL
);
