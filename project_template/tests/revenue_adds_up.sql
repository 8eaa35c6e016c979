-- A test of its own: the rows it returns are failures. Here: a customer whose revenue in
-- customer_revenue differs from the sum of their orders.
{{ config(severity='error') }}
select r.customer_id, r.revenue, round(coalesce(sum(o.amount), 0), 2) as orders_amount
from {{ ref('customer_revenue') }} r
left join {{ ref('orders') }} o on o.customer_id = r.customer_id
group by r.customer_id, r.revenue
having abs(r.revenue - round(coalesce(sum(o.amount), 0), 2)) > 0.005
