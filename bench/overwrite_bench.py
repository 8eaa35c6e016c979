#!/usr/bin/env python
"""insert_overwrite of one partition against rewriting the whole table, side by side in one
run on local[2]:

  setup          a pipe table of N rows in 10 partitions (bulk_insert of table_bench's source();
                 timed for information only)
  insert_overwrite   the new content of one partition (its N/10 rows, changed values) written
                 with operation insert_overwrite: a replacecommit that hides that partition's
                 file groups and writes new ones; the other 9 partitions are not touched
  whole rewrite  the same change by rewriting everything: read the table's snapshot, swap that
                 partition's rows for the new ones (filter + union) and write it back with
                 operation insert_overwrite_table (baseline)
  Spark whole    plain Spark, the same whole-table DataFrame with
                 df.write.mode("overwrite").partitionBy("part").parquet() into its own folder
                 (second baseline)
  Spark 1 part.  for reference: plain Spark's dynamic partition overwrite of the same one
                 partition into that folder (what insert_overwrite costs without a table format)

Each measurement runs `--rounds` times, interleaved (round 1 runs all four, then round 2...),
each with its own marker in the `name` column; medians and bests are reported. For each: wall
time, bytes of parquet files written, files written and file groups replaced, and peak memory
of the driver (the Python process's RSS and the JVM's used heap, sampled every 50 ms; a GC runs
before each measurement). After each, an untimed Spark aggregate checks the result: N rows in
all, the partition holds exactly the new rows, no other partition does; a wrong result exits 1
before RESULTS.md is touched. Writes clean with clean_retain=1, so replaced files go by the next write (disk stays ~2 copies).
Results go to the `overwrite` section of bench/RESULTS.md.

    python bench/overwrite_bench.py                  # 5,000,000 rows, 3 rounds
    python bench/overwrite_bench.py --rounds 5       # steadier medians on a busy machine
    python bench/overwrite_bench.py --rows 200000    # quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from table_bench import Peak, dir_bytes, source  # also puts the repository on sys.path

from report import write_section  # noqa: E402

PART = 3  # the partition that is overwritten
IO, WHOLE, SPARK_WHOLE, SPARK_PART = "insert_overwrite", "whole rewrite", "spark whole", "spark part"
TAG = {IO: "o", WHOLE: "w", SPARK_WHOLE: "s", SPARK_PART: "p"}  # markers: "r2w:" is round 2's whole rewrite
WHAT = {
    IO: "pipe insert_overwrite of 1 partition",
    WHOLE: "pipe whole rewrite: read + filter + union, insert_overwrite_table (baseline)",
    SPARK_WHOLE: "Spark df.write overwrite of the same whole-table DataFrame (baseline 2)",
    SPARK_PART: "Spark dynamic partition overwrite of 1 partition (reference)",
}


class WrongResult(Exception):
    pass


def _proc_cpu(pid: int) -> float:
    """CPU seconds of a process and of its children it has waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def _tree_cpu() -> float:
    """CPU seconds of this process and all its descendants (the JVM, Python workers)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    mine, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine} - mine
        mine |= more
        grew = bool(more)
    return sum(_proc_cpu(p) for p in mine)


def _machine_cpu() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, steal seconds)."""
    v = [int(x) / os.sysconf("SC_CLK_TCK") for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6], (v[7] if len(v) > 7 else 0.0)


def new_partition(spark, rows: int, marker: str):
    """The new content of partition PART: its rows (same ids), with changed values. `name` is
    the marker followed by a hash, 24 characters like source()'s, so that the new files
    compress like the old ones."""
    from pyspark.sql import functions as F

    name = F.concat(F.lit(marker), F.sha2(F.concat(F.lit(marker), F.col("id").cast("string")), 256).substr(1, 24 - len(marker)))
    return (source(spark, rows).where(F.col("part") == PART)
            .select("id", "part", (F.col("ts") + 1000).alias("ts"), name.alias("name"), (-F.col("amount")).alias("amount")))


def check(df, rows: int, part_rows: int, marker: str | None, what: str) -> None:
    """N rows in all; partition PART holds exactly its part_rows new rows (none for marker
    None: the source's rows); no other row is new."""
    from pyspark.sql import functions as F

    in_part = F.col("part") == PART
    new = F.col("name").startswith(marker) if marker is not None else F.col("ts") >= 1000  # source() has ts < 1000
    total, part, new_in_part, new_all = df.select(
        F.count(F.lit(1)), F.count_if(in_part), F.count_if(in_part & new), F.count_if(new)).first()
    n_new = part_rows if marker is not None else 0
    if (total, part, new_in_part, new_all) != (rows, part_rows, n_new, n_new):
        raise WrongResult(f"{what}: {total:,} rows (expected {rows:,}); partition part={PART} has {part:,} rows, {new_in_part:,} "
                          f"of them new (expected {part_rows:,} and {n_new:,}); {new_all:,} new rows in all")


class Sample:
    def __init__(self, peak, nbytes: int, files: int | None = None, replaced: int | None = None):
        self.seconds, self.py, self.jvm = peak.seconds, peak.py, peak.jvm
        self.bytes, self.files, self.replaced = nbytes, files, replaced


def measure(spark, fn):
    gc.collect()
    spark._jvm.java.lang.System.gc()
    t0 = time.time() - 0.05  # file mtimes come from a coarse clock
    with Peak(spark) as peak:
        out = fn()
    return peak, out, t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from pyspark.sql import functions as F

    from runtime.spark.session import get_spark
    from runtime.table import Table, TableConfig

    load_before, started = os.getloadavg(), time.perf_counter()
    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"}, app_name="pipe-bench")
    work = Path(tempfile.mkdtemp(prefix="pipe-overwrite-bench-"))
    samples: dict[str, list[Sample]] = {k: [] for k in WHAT}
    try:
        # --- setup: not a measurement --------------------------------------------------------------
        df = source(spark, args.rows).cache()
        df.count()
        part_rows = df.where(F.col("part") == PART).count()
        config = TableConfig(name="bench", record_key_fields=("id",), partition_fields=("part",), precombine_field="ts")
        table = Table.create(spark, str(work / "hudi"), config)
        t = time.perf_counter()
        setup = table.write(df, "bulk_insert", clean_retain=1)
        setup_s = time.perf_counter() - t
        df.unpersist()
        check(table.read(meta=False), args.rows, part_rows, None, "setup")
        setup_groups = len(table.view().latest_slices())
        cpu0, machine0 = _tree_cpu(), _machine_cpu()
        wall0 = time.perf_counter()

        plain = str(work / "plain")
        for rnd in range(1, args.rounds + 1):
            marker = {k: f"r{rnd}{TAG[k]}:" for k in WHAT}  # source()'s names are hex: no ':'
            news = {k: new_partition(spark, args.rows, marker[k]).cache() for k in WHAT}
            for k, new in news.items():
                assert new.count() == part_rows

            # insert_overwrite of the one partition
            peak, r, t0 = measure(spark, lambda: table.write(news[IO], "insert_overwrite", clean_retain=1))
            if r.bytes != dir_bytes(work / "hudi", newer_than=t0):
                raise WrongResult(f"{IO}: the commit names {r.bytes:,} bytes, {dir_bytes(work / 'hudi', newer_than=t0):,} were written")
            samples[IO].append(Sample(peak, r.bytes, r.files, r.replaced_file_groups))
            check(table.read(meta=False), args.rows, part_rows, marker[IO], f"round {rnd} {IO}")

            # the whole table rewritten with the same change
            def whole():
                snap = table.read(meta=False)
                return table.write(snap.where(F.col("part") != PART).unionByName(news[WHOLE]), "insert_overwrite_table", clean_retain=1)

            peak, r, t0 = measure(spark, whole)
            samples[WHOLE].append(Sample(peak, r.bytes, r.files, r.replaced_file_groups))
            check(table.read(meta=False), args.rows, part_rows, marker[WHOLE], f"round {rnd} {WHOLE}")

            # plain Spark: the same whole-table DataFrame into its own folder
            def spark_whole():
                snap = table.read(meta=False)
                snap.where(F.col("part") != PART).unionByName(news[SPARK_WHOLE]).write.mode("overwrite").partitionBy("part").parquet(plain)

            peak, _, t0 = measure(spark, spark_whole)
            samples[SPARK_WHOLE].append(Sample(peak, dir_bytes(Path(plain), newer_than=t0), len(list(Path(plain).rglob("*.parquet")))))
            check(spark.read.parquet(plain), args.rows, part_rows, marker[SPARK_WHOLE], f"round {rnd} {SPARK_WHOLE}")

            # plain Spark: dynamic partition overwrite of the one partition (runtime/spark/settings.py sets it)
            def spark_part():
                news[SPARK_PART].write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("part").parquet(plain)

            peak, _, t0 = measure(spark, spark_part)
            samples[SPARK_PART].append(Sample(peak, dir_bytes(Path(plain), newer_than=t0), len(list((Path(plain) / f"part={PART}").glob("*.parquet")))))
            check(spark.read.parquet(plain), args.rows, part_rows, marker[SPARK_PART], f"round {rnd} {SPARK_PART}")
            for new in news.values():
                new.unpersist()
            print(f"round {rnd}: " + ", ".join(f"{k} {samples[k][-1].seconds:.1f} s" for k in WHAT), flush=True)

        wall = time.perf_counter() - wall0
        cpu1, machine1 = _tree_cpu(), _machine_cpu()
        timeline = table.timeline()
        instants = len(timeline.instants)
    except WrongResult as exc:
        print(f"WRONG RESULT: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after, total_s = os.getloadavg(), time.perf_counter() - started
    others = max(0.0, (machine1[0] - machine0[0]) - (cpu1 - cpu0))
    steal = machine1[1] - machine0[1]

    med = {k: statistics.median(s.seconds for s in v) for k, v in samples.items()}
    best = {k: min(s.seconds for s in v) for k, v in samples.items()}
    nbytes = {k: statistics.median(s.bytes for s in v) for k, v in samples.items()}
    lines = [
        "## insert_overwrite of one partition against rewriting the whole table",
        "",
        "Generated by `python bench/overwrite_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; Spark local[2]",
        f"- {args.rows:,} rows (id, part = id % 10, ts, name, amount), partitioned by `part` (10 partitions); key `id`, precombine `ts`. "
        f"Setup (not measured): bulk_insert in {setup_s:.1f} s, {setup.bytes:,} bytes, {setup_groups} file groups.",
        f"- The change: partition `part={PART}` ({part_rows:,} rows) gets new content, the same ids with new ts, name and amount. "
        f"{args.rounds} rounds, interleaved; each measurement is followed by an untimed check (row count {args.rows:,}, "
        f"the partition holds exactly the new rows). Writes clean with `clean_retain=1`; the table ended with {instants} active instants.",
        "- Peak memory is sampled every 50 ms (max over the rounds): the Python driver's RSS and the JVM's used heap "
        "(in local mode the JVM also runs the executors); a GC runs before each measurement.",
        f"- Load: load average (1/5/15 min) before {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}, "
        f"after {load_after[0]:.2f} / {load_after[1]:.2f} / {load_after[2]:.2f}; during the {wall:.0f} s of measurements "
        f"other processes used {others:.0f} CPU-s and the hypervisor stole {steal:.0f} CPU-s (2 cores = {2 * wall:.0f} CPU-s)"
        + ("; **the machine was not idle: wall times are inflated**" if others > 0.1 * wall or steal > 0.1 * wall else "")
        + f". Whole run {total_s:.0f} s.",
        "",
        "| measurement | median s | best s | × whole rewrite (median) | bytes written (median) | files written | file groups replaced | peak Python driver RSS MB | peak JVM heap MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, what in WHAT.items():
        v = samples[k]
        files = "/".join(sorted({str(s.files) for s in v}))
        replaced = "/".join(sorted({str(s.replaced) for s in v})) if v[0].replaced is not None else "–"
        lines.append(f"| {what} | {med[k]:.1f} | {best[k]:.1f} | {med[k] / med[WHOLE]:.2f} | {nbytes[k]:,.0f} | {files} | {replaced} | "
                     f"{max(s.py for s in v):.0f} | {max(s.jvm for s in v):.0f} |")
    lines += [
        "",
        f"**insert_overwrite / whole rewrite**: time {med[IO] / med[WHOLE]:.2f} (median), {best[IO] / best[WHOLE]:.2f} (best); "
        f"bytes {nbytes[IO] / nbytes[WHOLE]:.3f}. Against Spark's whole rewrite: time {med[IO] / med[SPARK_WHOLE]:.2f} (median), "
        f"bytes {nbytes[IO] / nbytes[SPARK_WHOLE]:.3f}. Against Spark's 1-partition overwrite: time {med[IO] / med[SPARK_PART]:.2f} (median).",
        "",
        "Per round (s): " + "; ".join(f"{k}: " + ", ".join(f"{s.seconds:.1f}" for s in samples[k]) for k in WHAT) + ".",
    ]
    write_section("overwrite", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
