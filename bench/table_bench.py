#!/usr/bin/env python
"""The table engine against plain Spark, side by side in one run on local[2]:

  bulk_insert   pipe's bulk_insert of N rows  vs  df.write.parquet of the same DataFrame
  upsert 1%     pipe's upsert of 1% changed rows into that table  vs  a naive full rewrite
                (read, anti-join the changed keys, union the changes, overwrite), once with the
                changes in one of 10 partitions and once spread over all of them

For each: wall time, bytes written, and peak memory of the driver (the Python process's RSS
and the JVM's used heap, sampled every 50 ms). The driver must not grow with the table: only
metadata reaches it. Results go to the `table` section of bench/RESULTS.md.

    python bench/table_bench.py                  # 5,000,000 rows
    python bench/table_bench.py --rows 1000000   # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from report import write_section  # noqa: E402


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Peak:
    """Samples the Python driver's RSS and the JVM's used heap while a block runs."""

    def __init__(self, spark):
        self.runtime = spark._jvm.java.lang.Runtime.getRuntime()
        self.py = self.jvm = 0.0

    def __enter__(self):
        self.stop = threading.Event()
        self.py = _rss_mb(os.getpid())
        self.jvm = (self.runtime.totalMemory() - self.runtime.freeMemory()) / 2**20

        def sample():
            while not self.stop.wait(0.05):
                self.py = max(self.py, _rss_mb(os.getpid()))
                try:
                    self.jvm = max(self.jvm, (self.runtime.totalMemory() - self.runtime.freeMemory()) / 2**20)
                except Exception:  # noqa: BLE001 - the gateway may be busy; skip a sample
                    pass

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.stop.set()
        self.thread.join()


def dir_bytes(path: Path, suffix: str = ".parquet", newer_than: float | None = None) -> int:
    total = 0
    for p in path.rglob(f"*{suffix}"):
        if newer_than is None or p.stat().st_mtime >= newer_than:
            total += p.stat().st_size
    return total


def source(spark, rows: int):
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.col("id"),
        (F.col("id") % 10).cast("int").alias("part"),
        (F.col("id") * 7 % 1000).alias("ts"),
        F.sha2(F.col("id").cast("string"), 256).substr(1, 24).alias("name"),
        (F.rand(7) * 1000).alias("amount"),
    )


def changes(spark, rows: int, spread: bool):
    """1% of the keys, with a larger ts: in partition 3 only, or across all 10."""
    from pyspark.sql import functions as F

    n = rows // 100
    if spread:
        ids = spark.range(n).select((F.col("id") * 100 + 3).alias("id"))
    else:
        ids = spark.range(n).select((F.col("id") * 10 + 3).alias("id"))  # id % 10 == 3
    return ids.select(F.col("id"), (F.col("id") % 10).cast("int").alias("part"), F.lit(5000).cast("long").alias("ts"),
                      F.lit("changed").alias("name"), F.lit(1.0).alias("amount"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    args = ap.parse_args()

    from runtime.session import get_spark
    from runtime.table import Table, TableConfig

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"}, app_name="pipe-bench")
    work = Path(tempfile.mkdtemp(prefix="pipe-bench-"))
    results = []
    try:
        df = source(spark, args.rows).cache()
        df.count()

        with Peak(spark) as plain:
            df.write.mode("overwrite").partitionBy("part").parquet(str(work / "plain"))
        results.append(("bulk_insert", "Spark df.write.parquet (baseline)", plain, dir_bytes(work / "plain")))

        config = TableConfig(name="bench", record_key_fields=("id",), partition_fields=("part",), precombine_field="ts")
        table = Table.create(spark, str(work / "hudi"), config)
        with Peak(spark) as bulk:
            r = table.write(df, "bulk_insert")
        results.append(("bulk_insert", "pipe bulk_insert", bulk, r.bytes))

        for spread in (False, True):
            label = "spread over 10 partitions" if spread else "in 1 of 10 partitions"
            ch = changes(spark, args.rows, spread).cache()
            ch.count()
            with Peak(spark) as up:
                r = table.write(ch, "upsert", clean_inline=False)
            results.append((f"upsert 1% {label}", "pipe upsert (global index)", up, r.bytes))
            with Peak(spark) as up_p:
                r = table.write(ch.withColumn("ts", ch["ts"] + 1), "upsert", clean_inline=False, index="partition")
            results.append((f"upsert 1% {label}", "pipe upsert (index: partition)", up_p, r.bytes))

            naive_out = work / f"naive-{int(spread)}"
            with Peak(spark) as naive:
                base = spark.read.parquet(str(work / "plain"))
                merged = base.join(ch.select("id"), "id", "left_anti").unionByName(ch)
                merged.write.mode("overwrite").partitionBy("part").parquet(str(naive_out))
            results.append((f"upsert 1% {label}", "naive rewrite (baseline)", naive, dir_bytes(naive_out)))
            ch.unpersist()
        rows_check = table.read().count()
        assert rows_check == args.rows, (rows_check, args.rows)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        "## Table engine: bulk_insert and upsert against plain Spark",
        "",
        "Generated by `python bench/table_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; Spark local[2]",
        f"- {args.rows:,} rows (id, part = id % 10, ts, name, amount), partitioned by `part` (10 partitions); key `id`, precombine `ts`",
        "- Peak memory is sampled every 50 ms: the Python driver's RSS and the JVM's used heap (in local mode the JVM also runs the executors).",
        "- Upserts: the global index looks every incoming key up among all stored keys (broadcast semi-join at the scan); `index: partition` reads only the partitions in the batch (Hudi's default SIMPLE index behaves like this).",
        "",
        "| case | what | seconds | × baseline | bytes written | peak Python driver RSS MB | peak JVM heap MB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    baselines = {case: p.seconds for case, what, p, _ in results if "baseline" in what}
    for case, what, p, nbytes in results:
        ratio = p.seconds / baselines[case] if case in baselines else float("nan")
        lines.append(f"| {case} | {what} | {p.seconds:.1f} | {ratio:.2f} | {nbytes:,} | {p.py:.0f} | {p.jvm:.0f} |")
    write_section("table", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
