select
    c.customer_id,
    c.name,
    c.country,
    count(o.order_id) as orders,
    {{ money('coalesce(sum(o.amount), 0)') }} as revenue
from {{ ref('customers') }} c
left join {{ ref('orders') }} o on o.customer_id = c.customer_id
group by c.customer_id, c.name, c.country
