-- Revenue and order count per customer, recomputed from the current orders and customers.
CREATE MATERIALIZED VIEW customer_revenue
AS SELECT
    c.customer_id,
    c.name,
    c.country,
    count(o.order_id) AS orders,
    round(cast(coalesce(sum(o.amount), 0) AS double), 2) AS revenue
FROM customers c
LEFT JOIN orders o ON o.customer_id = c.customer_id
GROUP BY c.customer_id, c.name, c.country
