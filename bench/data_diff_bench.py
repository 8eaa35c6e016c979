#!/usr/bin/env python
"""`pipe diff --data` against the full outer join a user would write, side by side in one run:

  pipe       runtime.data_diff.compare of two builds of a table (in-process, as the command
             calls it): rows on each side, added, removed, changed and unchanged keys, moves,
             mismatches per column and 5 sample rows of each kind, in one join and one aggregation
  baseline   base.join(head, key, 'full_outer') with a null-safe comparison of every column,
             counted: the rows that differ, and nothing else

Both read the same two pipe tables of N rows (default 5,000,000; key `id`, partitioned by `part`),
the head built from the base's rows with 1% updated (one of four columns each), 0.1% deleted,
0.1% inserted and 0.1% moved to another partition, through pipe's own reader (Table.read), in the
same SparkSession; they take turns, after one unreported warm-up of each. The machine's load is
sampled during the run (bench/report.py's Load). Results go to the `data-diff` section of
bench/RESULTS.md.

    python bench/data_diff_bench.py                   # 5,000,000 rows, 3 repeats
    python bench/data_diff_bench.py --rows 1000000 --repeats 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from functools import reduce
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from report import Load, median, write_section  # noqa: E402

TARGET = 1.2  # pipe at most this many times the plain join


def base_rows(spark, rows: int):
    from pyspark.sql import functions as F

    i = F.col("id")
    return spark.range(rows).select(
        i, (i % 10).cast("int").alias("part"), (i * 7 % 1000).alias("ts"),
        F.sha2(i.cast("string"), 256).substr(1, 24).alias("name"),
        (F.rand(7) * 1000).alias("amount"),
        (i * 0.37).cast("decimal(12,2)").alias("price"),
        F.timestamp_micros(F.lit(1767225600000000) + i * 1000003).alias("updated_at"),
        F.when(i % 97 == 0, F.lit(None)).otherwise(F.concat(F.lit("O'Brien \"é\" #"), i.cast("string"))).alias("note"),
    )


def head_rows(spark, rows: int):
    """The base's rows with 1% updated (amount, price, updated_at or note, by id % 4), 0.1%
    deleted, 0.1% moved to another partition and 0.1% new keys."""
    from pyspark.sql import functions as F

    i = F.col("id")
    upd, which = (i % 100 == 3), (i % 400)
    df = base_rows(spark, rows).filter(i % 1000 != 1)
    df = df.select(
        i, F.when(i % 1000 == 5, (F.col("part") + 1) % 10).otherwise(F.col("part")).alias("part"), "ts", "name",
        F.when(upd & (which == 3), F.col("amount") + 1).otherwise(F.col("amount")).alias("amount"),
        F.when(upd & (which == 103), F.col("price") + F.lit(0.01)).otherwise(F.col("price")).cast("decimal(12,2)").alias("price"),
        F.when(upd & (which == 203), F.col("updated_at") + F.expr("interval 1 microsecond")).otherwise(F.col("updated_at")).alias("updated_at"),
        F.when(upd & (which == 303), F.lit(None)).otherwise(F.col("note")).alias("note"),
    )
    return df.unionByName(base_rows(spark, rows // 1000).withColumn("id", F.col("id") + rows))


def plain_join(base, head) -> int:
    """The baseline: a full outer join on the key, every other column compared null-safe, counted."""
    from pyspark.sql import functions as F

    b, h = base.read(meta=False).alias("b"), head.read(meta=False).alias("h")
    columns = [c for c in b.columns if c != "id"]
    differs = reduce(lambda x, y: x | y, [~F.col(f"b.{c}").eqNullSafe(F.col(f"h.{c}")) for c in columns])
    return b.join(h, "id", "full_outer").filter(differs).count()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--print-only", action="store_true", help="print the section, leave bench/RESULTS.md alone (a trial run)")
    args = ap.parse_args()

    from runtime.data_diff import compare
    from runtime.spark.session import get_spark
    from runtime.table import Table, TableConfig

    spark = get_spark(args.master, {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"}, app_name="pipe-bench")
    work = Path(tempfile.mkdtemp(prefix="pipe-data-diff-bench-"))
    config = TableConfig(name="bench", record_key_fields=("id",), partition_fields=("part",), precombine_field="ts")
    times: dict[str, list[float]] = {"pipe": [], "baseline": []}
    started = time.perf_counter()
    try:
        built = time.perf_counter()
        Table.create(spark, str(work / "base"), config).write(base_rows(spark, args.rows), "bulk_insert")
        Table.create(spark, str(work / "head"), config).write(head_rows(spark, args.rows), "bulk_insert")
        built = time.perf_counter() - built
        base, head = Table.open(spark, str(work / "base")), Table.open(spark, str(work / "head"))
        version = spark.version

        def run_pipe():
            return compare(spark, "bench", Table.open(spark, str(work / "base")), Table.open(spark, str(work / "head")), samples=5)

        # warm-up, not reported: the first join of each kind pays the JIT and the first reads
        result, counted = run_pipe(), plain_join(base, head)
        load = Load(every=2.0)
        load.start()
        for _ in range(args.repeats):  # the two take turns, so drift hits both alike
            t = time.perf_counter()
            result = run_pipe()
            times["pipe"].append(time.perf_counter() - t)
            t = time.perf_counter()
            counted = plain_join(base, head)
            times["baseline"].append(time.perf_counter() - t)
        load.stop()
        differs = result.added_rows + result.removed_rows + result.changed_rows
        assert differs == counted, (differs, counted)  # the two agree on what differs
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    whole = time.perf_counter() - started

    pipe_s, base_s = median(times["pipe"]), median(times["baseline"])
    ratio = pipe_s / base_s
    mismatches = ", ".join(f"{c.name} {c.mismatches:,}" for c in result.columns if c.mismatches)
    loads = load.loads or [os.getloadavg()[0]]
    lines = [
        "## pipe diff --data against a plain Spark full outer join",
        "",
        "Generated by `python bench/data_diff_bench.py"
        + (f" --rows {args.rows}" if args.rows != 5_000_000 else "") + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
        + "` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"Spark {version} {args.master} (spark.sql.shuffle.partitions 8); whole run {whole:.0f} s (building the two tables {built:.0f} s)",
        f"- Two pipe tables of {args.rows:,} rows (id, part = id % 10, ts, name, amount double, price decimal(12,2), updated_at timestamp, "
        "note string with nulls), key `id`, partitioned by `part`; the head with 1% of the rows updated in one column each, 0.1% deleted, "
        "0.1% inserted, 0.1% moved to another partition",
        f"- pipe: `runtime.data_diff.compare` (what `pipe diff --data` runs per table): {result.added_rows:,} added, {result.removed_rows:,} removed, "
        f"{result.changed_rows:,} changed ({result.moved_rows:,} moved), {result.unchanged_rows:,} unchanged; mismatches {mismatches}; 5 samples of each kind",
        f"- baseline: `base.join(head, 'id', 'full_outer')` filtered by a null-safe comparison of every column, counted: {counted:,} rows differ "
        "(the same number as pipe's added + removed + changed)",
        f"- Both read through pipe's reader (`Table.read`), in one SparkSession; medians of {args.repeats} interleaved runs after one warm-up of each",
        f"- Machine load (1-minute average): {load.before[0]:.2f} before, {sum(loads) / len(loads):.2f} mean and {max(loads):.2f} max during "
        f"the timed runs (sampled every 2 s), {load.after[0]:.2f} after; CPU taken by other processes during them: {load.others:.0f} s",
        "",
        "| what | median s | runs s | × baseline |",
        "|---|---:|---|---:|",
        f"| plain Spark full outer join, counted (baseline) | {base_s:.1f} | {', '.join(f'{x:.1f}' for x in times['baseline'])} | 1.00 |",
        f"| pipe diff --data (`data_diff.compare`) | {pipe_s:.1f} | {', '.join(f'{x:.1f}' for x in times['pipe'])} | {ratio:.2f} |",
        "",
        f"Against the target, at most {TARGET}× the plain join: **{ratio:.2f}×, {'met' if ratio <= TARGET else 'missed'}**. Both shuffle the two "
        "tables once for the join; pipe's one aggregation adds the counts per kind and per column and keeps its samples with `min_by(..., k)` "
        "(a bounded heap per task) in the same pass, where the baseline counts one filter.",
    ]
    if not args.print_only:
        write_section("data-diff", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
