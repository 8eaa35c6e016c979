-- The orders of each new export, minus test orders below the minimum amount.
select
    order_id,
    customer_id,
    {{ money('amount') }} as amount,
    lower(status) as status,
    upper(region) as region,
    updated_at
from {{ source('raw_orders') }}
where amount >= {{ var('min_amount') }}
