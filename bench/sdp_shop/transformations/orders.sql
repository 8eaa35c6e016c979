-- One row per order in its latest state: the largest updated_at wins, and an order whose latest
-- version is cancelled is left out (pipe: upsert, key order_id, precombine updated_at,
-- delete_when status = 'cancelled'). Open-source SDP cannot upsert into a table: AUTO CDC
-- (create_auto_cdc_flow) maintains its target with MERGE, which Spark's built-in Parquet tables
-- do not support (AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE; it needs e.g. Delta). So orders is a
-- materialized view over the append-only raw_orders, recomputed in full on every run.
-- Partitioned by region like pipe's table; region comes last because Spark's session catalog
-- keeps partition columns at the end of the schema (with region in the middle, SDP 4.3 fails
-- with "Corrupted table metadata detected ... partition column names ... do not match").
-- An order without a customer is left out, as pipe's `has_customer` expectation (action: drop)
-- leaves it out of each batch before the upsert.
CREATE MATERIALIZED VIEW orders
PARTITIONED BY (region)
AS SELECT order_id, customer_id, amount, status, updated_at, region
FROM (
    SELECT
        order_id,
        customer_id,
        round(cast(amount AS double), 2) AS amount,
        lower(status) AS status,
        upper(region) AS region,
        updated_at,
        row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC NULLS LAST) AS version_rank
    FROM raw_orders
    WHERE amount >= ${shop.min_amount} AND customer_id IS NOT NULL
)
WHERE version_rank = 1 AND status <> 'cancelled'
