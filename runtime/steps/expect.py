"""Expectations: a table's checks on each batch, evaluated in Spark before the commit
(compiler/data_tests.read_expectations). A row fails an expectation when its condition is false
(null passes, as in a SQL CHECK constraint). Per expectation, its action decides:

- `warn`: the row is written; the failures are counted;
- `drop`: the row is left out;
- `quarantine`: the row goes to `<table>__quarantine` (a Hudi table in the same lake), with the
  names of the expectations it failed, in a commit made before the table's own, carrying the
  same source checkpoints; a retry of the same input upserts the same quarantine keys;
- `fail`: nothing is committed and the sources' checkpoints stay where they were.

Only the counts, and for `fail` a few sample rows, reach the driver. The counts go into the
commit's extra metadata (`pipe.expectations`), the step's message and run_results.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from compiler.data_tests import QUARANTINE_SUFFIX
from compiler.plan import Step
from runtime.spark import api as spark_api
from runtime.steps.context import RunContext
from runtime.errors import RunError, sample, spark_message

EXTRA_KEY = "pipe.expectations"
FAILED_COLUMN = "_pipe_failed_expectations"
QUARANTINED_AT = "_pipe_quarantined_at"
BATCH_COLUMN = "_pipe_batch"
ROW_HASH = "_pipe_row_hash"
_SAMPLES = 3


@dataclass
class Checked:
    kept: Any  # the rows to write
    total: int
    failed: dict[str, int]  # expectation -> failing rows
    actions: dict[str, str]
    quarantine: Any = None  # rows for <table>__quarantine, when any
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.total, **{n: {"action": self.actions[n], "failed": f} for n, f in self.failed.items()}}

    def summary(self) -> str:
        done = {"warn": "warned", "drop": "dropped", "quarantine": "quarantined", "fail": "failed"}
        parts = [f"{n} {done[self.actions[n]]} {f:,}" for n, f in self.failed.items() if f]
        return "expectations: " + (", ".join(parts) if parts else f"all {len(self.failed)} met")


def check(step: Step, df, expectations: list[Mapping[str, str]], delete_when: str | None = None) -> Checked:
    """Counts each expectation's failures over the batch `df` in one job, and splits it. Rows
    that `delete_when` turns into deletes are not checked: they delete, whatever they hold."""
    from pyspark.sql import functions as F

    flags = [f"_pipe_expect_{i}" for i in range(len(expectations))]
    kept = f" and not coalesce(({delete_when}), false)" if delete_when else ""
    try:
        flagged = df.select("*", *[F.expr(f"coalesce(not ({e['expression']}), false){kept}").alias(f) for e, f in zip(expectations, flags)])
    except Exception as exc:  # noqa: BLE001 - a condition Spark cannot analyse
        bad = _first_bad(df, expectations)
        raise RunError(f"{step.file}:{step.line}: table {step.name}: expectation {bad} cannot be evaluated: {spark_message(exc)}",
                       "the condition is SQL over the columns the table's SELECT returns") from exc
    flagged = spark_api.local_checkpoint(flagged, eager=False)  # counted, then written: the batch is computed once
    counts = flagged.agg(F.count(F.lit(1)).alias("rows"), *[F.sum(F.col(f).cast("long")).alias(f) for f in flags]).collect()[0]
    names = [e["name"] for e in expectations]
    actions = {e["name"]: e["action"] for e in expectations}
    failed = {n: int(counts[f] or 0) for n, f in zip(names, flags)}
    total = int(counts["rows"])
    for e, f in zip(expectations, flags):
        if e["action"] == "fail" and failed[e["name"]]:
            rows = [_row_text(sample(r.asDict(recursive=True))) for r in flagged.where(F.col(f)).drop(*flags).limit(_SAMPLES).collect()]
            raise RunError(f"table {step.name}: expectation {e['name']} ({e['expression']}) failed for {failed[e['name']]:,} of {total:,} rows, "
                           f"e.g. {'; '.join(rows)}; nothing was committed, and the sources' checkpoints stay where they were",
                           f"fix the input or the SQL (the next run reads the same input again), or change the expectation's action "
                           f"in {step.file}")
    quarantine_flags = [f for e, f in zip(expectations, flags) if e["action"] == "quarantine"]
    leave_out = [f for e, f in zip(expectations, flags) if e["action"] in ("drop", "quarantine") and failed[e["name"]]]
    kept = flagged.where(~_any(leave_out)).drop(*flags) if leave_out else flagged.drop(*flags)
    quarantine = None
    if any(failed[e["name"]] for e in expectations if e["action"] == "quarantine"):
        names_failed = F.filter(F.array(*[F.when(F.col(f), F.lit(n)) for n, f in zip(names, flags)]), lambda x: x.isNotNull())
        quarantine = flagged.where(_any(quarantine_flags)).withColumn(FAILED_COLUMN, names_failed).drop(*flags)
    return Checked(kept, total, failed, actions, quarantine)


def _any(flags: list[str]):
    from pyspark.sql import functions as F

    out = F.col(flags[0])
    for f in flags[1:]:
        out = out | F.col(f)
    return out


def _first_bad(df, expectations) -> str:
    from pyspark.sql import functions as F

    for e in expectations:
        try:
            df.select(F.expr(e["expression"]))
        except Exception:  # noqa: BLE001
            return e["name"]
    return ", ".join(e["name"] for e in expectations)


def _row_text(row: Mapping[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in row.items())
    return text if len(text) <= 300 else text[:300] + "..."


def write_quarantine(ctx: RunContext, session, step: Step, checked: Checked, extra: Mapping[str, str], batch: str) -> str:
    """Writes the quarantined rows to `<table>__quarantine` (created on first use) in one commit
    carrying the table's new checkpoints; returns its instant. Keys are (batch, hash of the row):
    a retry of the same input after a failed table write upserts the same rows."""
    from pyspark.sql import functions as F

    from runtime.table.config import TableConfig
    from runtime.table.table import Table

    name = step.name + QUARANTINE_SUFFIX
    uri = ctx.table_uri(name)
    data_columns = [c for c in checked.quarantine.columns if c != FAILED_COLUMN]
    rows = (checked.quarantine
            .withColumn(BATCH_COLUMN, F.lit(batch))
            .withColumn(ROW_HASH, F.sha2(F.to_json(F.struct(*[F.col(f"`{c}`") for c in data_columns])), 256))
            .withColumn(QUARANTINED_AT, F.current_timestamp()))
    config = TableConfig(name=name, record_key_fields=(BATCH_COLUMN, ROW_HASH), precombine_field=QUARANTINED_AT)
    table = Table.create(session, uri, config, ctx.storage_options)
    w = table.write(rows, operation="upsert", extra_metadata={**extra, EXTRA_KEY: json.dumps(checked.to_dict(), sort_keys=True)})
    return w.instant
