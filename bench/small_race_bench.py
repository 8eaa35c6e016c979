#!/usr/bin/env python
"""The small write against Java: an upsert of 100 rows (50 updates, 50 new keys) into a table of
1,000,000 rows in a warm session, pipe against Java Hudi 0.15.0, on an idle machine and then
under a load of 10 (ten busy processes on the machine's cores), in one run:

  pipe                 pipe's engine with its defaults (the global index), in this process
  Java                 Java's defaults, the SIMPLE index and the metadata table on: what a Java
                       user gets unless they choose otherwise
  Java RECORD_INDEX    the record-level index of the metadata table: Java's global index for
                       large tables, the counterpart of pipe's global index

Both sides run Spark local[2] with the same driver memory and the G1 collector (Java 17's
default; the tests' JVMs use the serial one), read the same Parquet files and write the same
table definition (java_bench.java_options: key, partition, precombine, file sizes, snappy). Each
side bulk-inserts a copy-on-write and a merge-on-read table; then, per condition, each table
takes 3 warm-up upserts and `--writes` measured ones, the sides in turns (who goes first
alternates), every side writing the same batches in the same order. A write is timed from the
call to the commit, with the CPU seconds and peak memory of its side's processes. The idle
condition is refused as a result when other processes took more than a tenth of the machine
meanwhile. Results go to the `small-race` section of bench/RESULTS.md.

    python bench/small_race_bench.py                          # about 15 minutes on 2 cores
    python bench/small_race_bench.py --rows 100000 --writes 3 # quick
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH_DIR))

from java_bench import DAY, G1, MEMORY, PIPE_CONF, Runs, _rows, make_side  # noqa: E402
from report import Load, Measure, median, write_section  # noqa: E402

WARM_UP = 3
BATCH = 50  # updates and as many new keys per write
TYPES = ("COPY_ON_WRITE", "MERGE_ON_READ")
JAVA_SIDES = ("Java", "Java RECORD_INDEX")  # java_bench.SIDES: its defaults, and its global index for large tables


class Hogs:
    """`n` busy processes (a load of about `n`) for the length of a `with` block."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def generate(spark, data: Path, rows: int, batches: int) -> tuple[Path, list[Path]]:
    """The table's rows and the batches (50 stored keys, a block of its own each, and 50 new
    keys), as Parquet files both sides read."""
    from pyspark.sql import functions as F

    i = F.col("id")
    base = data / "base"
    _rows(F, spark.range(0, rows, numPartitions=2), 0, "r-").write.mode("overwrite").parquet(str(base))
    out = []
    for n in range(batches):
        start = (n * 7919 * BATCH) % max(BATCH, rows - BATCH)  # blocks scattered over the table
        ids = spark.range(2 * BATCH, numPartitions=1).select(F.when(i < BATCH, i + start).otherwise(i - BATCH + rows + n * BATCH).alias("id"))
        path = data / f"batch{n}"
        _rows(F, ids, DAY + n, f"u{n}-").write.mode("overwrite").parquet(str(path))
        out.append(path)
    return base, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--writes", type=int, default=5, help="measured upserts per table, side and condition")
    ap.add_argument("--load", type=int, default=10, help="busy processes of the loaded condition")
    ap.add_argument("--section", default="small-race")
    args = ap.parse_args()

    os.environ.setdefault("JAVA_HUDI_MEMORY", MEMORY)
    from runtime.spark.session import get_spark
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import HUDI_015, ensure

    ensure((HUDI_015,))
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pipe-small-race-"))
    spark = get_spark("local[2]", PIPE_CONF, app_name="pipe-small-race")
    runtime_args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    if G1 not in runtime_args:
        raise SystemExit(f"pipe's JVM did not take {G1}: {runtime_args}")
    java = None
    results: dict[tuple[str, str, str], Runs] = {}
    conditions: dict[str, dict] = {}
    checks: dict[str, list] = {}
    try:
        per_condition = WARM_UP + args.writes
        base, batches = generate(spark, work / "data", args.rows, 2 * per_condition)
        java = JavaHudi(HUDI_015, work / "java-driver", jvm_options=G1)
        sides = [(who, make_side(who, spark, java, work)) for who in ("pipe", *JAVA_SIDES)]
        for who, side in sides:
            for table_type in TYPES:
                t0 = time.perf_counter()
                side.write(f"t-{table_type}", table_type, "bulk_insert", base)
                print(f"  bulk_insert {table_type:<14} {who:<20} {time.perf_counter() - t0:6.1f} s", flush=True)
        written = 0
        for condition in ("idle", f"load {args.load}"):
            hogs = Hogs(args.load) if condition != "idle" else None
            with hogs or contextlib.nullcontext():
                if hogs:
                    time.sleep(30)  # the load average climbs towards the load
                load = Load(every=2.0)
                load.start()
                t0 = time.perf_counter()
                for n in range(per_condition):
                    batch = batches[written + n]
                    order = sides if n % 2 == 0 else sides[::-1]
                    for table_type in TYPES:
                        for who, side in order:
                            with Measure(side.pids) as m:
                                side.write(f"t-{table_type}", table_type, "upsert", batch)
                            if n >= WARM_UP:
                                results.setdefault((condition, table_type, who), Runs()).add(m)
                            print(f"  {condition:<8} {table_type:<14} {who:<20} {'warm-up' if n < WARM_UP else 'write'} {m.seconds:6.2f} s "
                                  f"cpu {m.cpu:5.1f} s", flush=True)
                load.stop()
                whole = time.perf_counter() - t0
                conditions[condition] = {"seconds": whole, "loads": load.loads, "others": load.others,
                                         "busy": condition == "idle" and load.others > 0.1 * whole * (os.cpu_count() or 1)}
            written += per_condition
        for who, side in sides:
            checks[who] = [side.scan(f"t-{table_type}") for table_type in TYPES]
    finally:
        if java is not None:
            java.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, results, conditions, checks, [w for w, _ in sides], time.perf_counter() - started)


def report(args, results, conditions, checks, whos, whole: float) -> None:
    default = "Java"
    lines = [
        f"## A 100-row upsert into {args.rows:,} rows in a warm session: pipe against Java Hudi 0.15.0, idle and under a load of {args.load}",
        "",
        "Generated by `python bench/small_race_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; whole run {whole:.0f} s",
        f"- Tables of {args.rows:,} rows (java_bench's columns: id key, part = id % 10, ts epoch-millis precombine, typed columns), bulk-inserted by "
        f"each side; each write: {BATCH} stored keys (a block of consecutive ids, another block each write) and {BATCH} new keys, one Parquet "
        "file both sides read",
        f"- Both sides: Spark local[2], driver memory {MEMORY}, the G1 collector, snappy, 120 MB files and a 100 MB small-file limit. pipe: its "
        "defaults (the global index), in this process. Java: one long-lived driver (tests/java_hudi) for both of its configurations: "
        "its defaults (`hoodie.index.type=SIMPLE`, `hoodie.metadata.enable=true`) and `RECORD_INDEX` (with "
        "`hoodie.metadata.record.index.enable=true`), each on tables of its own",
        f"- Per condition, table and side: {WARM_UP} warm-up writes, then {args.writes} measured; the sides take turns, who goes first alternating",
    ]
    for condition, c in conditions.items():
        loads = c["loads"] or [0.0]
        lines.append(f"- {condition}: {c['seconds']:.0f} s; 1-minute load average {min(loads):.1f}–{max(loads):.1f} (median {median(loads):.1f}); "
                     f"other processes' CPU {c['others']:.0f} s" + (" — **the machine was not idle: this condition is not a result**" if c["busy"] else ""))
    lines += ["", "| condition | table | side | median s / write | runs s | CPU s (median) | peak RSS MB | pipe / this side |",
              "|---|---|---|---:|---|---:|---:|---:|"]
    for condition in conditions:
        for table_type in TYPES:
            pipe = results[(condition, table_type, "pipe")]
            for who in whos:
                r = results[(condition, table_type, who)]
                ratio = "" if who == "pipe" else f"**{pipe.median / r.median:.2f}**"
                lines.append(f"| {condition} | {table_type} | {who} | {r.median:.2f} | {', '.join(f'{x:.2f}' for x in r.seconds)} | "
                             f"{r.median_cpu:.1f} | {r.peak:.0f} | {ratio} |")
    lines += ["", "pipe / Java with its defaults, idle against loaded (issue 42: the same ratio under a load of 10 as idle):", ""]
    idle, loaded = list(conditions)
    for table_type in TYPES:
        ratio = {c: results[(c, table_type, "pipe")].median / results[(c, table_type, default)].median for c in (idle, loaded)}
        lines.append(f"- {table_type}: idle **{ratio[idle]:.2f}x**, {loaded} **{ratio[loaded]:.2f}x** (loaded / idle {ratio[loaded] / ratio[idle]:.2f})")
    lines += ["", "Checks (count and sum(amount) of each side's tables after every write; equal on every side when all applied the same upserts):", ""]
    for who, values in checks.items():
        lines.append(f"- {who}: " + "; ".join(f"{t} {c:,} rows, {s:,.2f}" for t, (c, s) in zip(TYPES, values)))
    write_section(args.section, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
