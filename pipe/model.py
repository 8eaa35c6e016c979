"""What a Python model imports: `ref()` and `source()`, the defaults of model()'s parameters
that name its inputs (docs/python-models.md).

    from pipe.model import ref, source

    def model(orders=ref("orders"), customers=source("raw_customers")):
        return orders.join(customers, "customer_id")

pipe reads them from the file's text (compiler/python_models.py) and passes each parameter the
input's DataFrame; the markers themselves are never used as values."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Input:
    """An input of a Python model, as its parameter's default names it."""

    kind: str  # "table" | "source"
    name: str


def ref(name: str) -> Input:
    """The table `name`, as `{{ ref('name') }}` in SQL."""
    return Input("table", name)


def source(name: str) -> Input:
    """The source `name`, as `{{ source('name') }}` in SQL: its new input in an incremental run."""
    return Input("source", name)
