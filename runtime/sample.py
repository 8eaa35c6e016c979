"""Cheap dev runs: `--empty` and `--sample` (docs/dev-loop.md).

`--empty` runs every selected table's SQL on inputs with no rows: Spark analyses the query against
the real upstream schemas (a deferred prod table's included), the expectations and the declared
columns are checked, and a table that does not exist yet is created with no rows (so that the
tables downstream of it can be built the same way). A table that exists is only checked: its
input's columns must fit the stored ones; nothing is written.

`--sample SPEC` builds the selected tables from part of their input:

- `N rows`: each input (source or table) gives at most N rows;
- `N rows per partition`: at most N rows of each partition: of a table its Hudi partitions, of a
  source each partition Spark reads it in;
- `N days` / `N hours`: what arrived in that time: the files modified since, the commits of a
  table (a `kind: table`/`s3_incremental` source, or the rows a `ref()` table's commits wrote) made
  since.

A sampled or empty build is not a real one: its commit holds no checkpoint and says what it was
(`pipe.sample`), and the next run without --sample rebuilds the table from all of its input."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from runtime.table.timeline import SAMPLE_KEY

__all__ = ["EMPTY", "SAMPLE_KEY", "Sample", "SampleError"]
EMPTY = "empty"
_SPEC = re.compile(r"^\s*(\d+)\s+(rows?(?:\s+per\s+partition)?|days?|hours?)\s*$", re.IGNORECASE)


class SampleError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    text: str
    rows: int | None = None  # at most this many rows per input (or per partition)
    per_partition: bool = False
    since_ms: int | None = None  # what arrived at or after this epoch ms
    empty: bool = False

    @classmethod
    def parse(cls, text: str, now_ms: int | None = None) -> "Sample":
        m = _SPEC.match(text)
        if not m or int(m.group(1)) <= 0:
            raise SampleError(text)
        n, unit = int(m.group(1)), m.group(2).lower()
        if unit.startswith("row"):
            return cls(text.strip(), rows=n, per_partition="partition" in unit)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return cls(text.strip(), since_ms=now_ms - n * (86_400_000 if unit.startswith("day") else 3_600_000))

    @classmethod
    def nothing(cls) -> "Sample":
        return cls(EMPTY, rows=0, empty=True)

    @property
    def since_instant(self) -> str | None:
        from runtime.run_record import utc_instant
        import datetime as dt

        if self.since_ms is None:
            return None
        return utc_instant(dt.datetime.fromtimestamp(self.since_ms / 1000, dt.timezone.utc))

    # --- sources: a time sample reads from a checkpoint at the cut ---------------------------

    def checkpoint(self, source: str, config: Mapping[str, Any], upstream=None) -> str | None:
        """For a time sample, the checkpoint a source is read from (None: from the start): a
        files source's modification time, the latest commit of an upstream table before the cut."""
        from runtime.sources import SourceError

        kind = config["kind"]
        if kind == "files":
            from runtime.sources.files import WINDOW_MS, Checkpoint

            return Checkpoint(self.since_ms + WINDOW_MS, frozenset()).to_str()
        if kind in ("table", "hudi", "s3_incremental"):
            timeline = upstream.timeline()
            cut = self.since_instant
            before = [i for i in timeline.completed() if (i.completed_at if timeline.layout >= 2 else i.time) < cut]
            if not before:
                return None
            last = max(before, key=lambda i: (i.completed_at, i.time))
            return f"{last.time}_{last.completed_at}" if timeline.layout >= 2 and kind != "s3_incremental" else last.time
        if kind == "kafka":
            from runtime.sources.kafka import offsets_at

            return offsets_at(source, config, self.since_ms)
        raise SourceError(f"source {source}: --sample '{self.text}' cannot pick what arrived in a time from a {kind} source",
                          "sample it by rows (`--sample '1000 rows'`)")

    # --- every input: rows ---------------------------------------------------------------------

    def rows_of(self, df, partition_columns: list[str] | None = None):
        """`df` with at most `rows` rows (per partition: of `partition_columns`, or of each Spark
        partition when None)."""
        if self.rows is None:
            return df
        if self.rows == 0:
            return df.limit(0)
        if not self.per_partition:
            return df.limit(self.rows)
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        by = [F.col(c) for c in partition_columns] if partition_columns else [F.spark_partition_id()]
        number = "_pipe_sample_row"
        ranked = df.withColumn(number, F.row_number().over(Window.partitionBy(*by).orderBy(F.monotonically_increasing_id())))
        return ranked.where(F.col(number) <= self.rows).drop(number)

    def table_rows(self, table, df_with_meta, data_columns: list[str]):
        """A table's view (read with its meta columns) sampled: by the commit time of its rows for
        a time sample, else by rows (per Hudi partition); only `data_columns` are kept."""
        from pyspark.sql import functions as F

        df = df_with_meta
        if self.since_ms is not None:
            df = df.where(F.col("_hoodie_commit_time") >= F.lit(self.since_instant))
        elif self.per_partition:
            df = self.rows_of(df, ["_hoodie_partition_path"])
        else:
            df = self.rows_of(df)
        return df.select(*data_columns)
