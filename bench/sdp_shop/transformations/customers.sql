-- One row per customer in its latest state (pipe: upsert, key customer_id, precombine updated_at).
CREATE MATERIALIZED VIEW customers
AS SELECT customer_id, name, email, country, updated_at
FROM (
    SELECT
        customer_id,
        name,
        lower(email) AS email,
        country,
        updated_at,
        row_number() OVER (PARTITION BY customer_id ORDER BY updated_at DESC NULLS LAST) AS version_rank
    FROM raw_customers
)
WHERE version_rank = 1
