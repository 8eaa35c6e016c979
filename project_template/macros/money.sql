{# Amounts are kept with two decimals everywhere. #}
{% macro money(expression) -%}
    round(cast({{ expression }} as double), 2)
{%- endmacro %}
