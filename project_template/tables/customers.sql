select customer_id, name, lower(email) as email, country, updated_at
from {{ source('raw_customers') }}
