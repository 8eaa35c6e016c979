#!/usr/bin/env python
"""What keeping the metadata table in step costs a write (issue 41, part 7): a 1% upsert into a
table of N rows, by pipe at version 6 (no metadata table: pipe's default), pipe at version 9
without and with its metadata table (`metadata_table: true`: the files partition gets a
deltacommit before every commit), and Java Hudi 1.1.1's Spark writer at version 9 with its
defaults (metadata table on with its files, column stats and partition stats; SIMPLE index),
side by side in one run, on the same data, both Spark local[2]:

  bulk_insert        N rows into a new copy-on-write table (timed too)
  upsert 1% spread   N/100 changed rows over all 10 partitions (every file group)
  merge-on-read      bulk_insert of N rows, then the same kind of 1% upsert into its logs

The data and the sides' set-up are bench/java_bench.py's (the same Parquet input, options and
driver); pipe's index is `partition` here, the counterpart of Java's default SIMPLE. Each
repeat builds its own tables; the sides take turns going first. After the upserts each side's
table is counted, and the counts must agree. Results go to the `mdt` section of
bench/RESULTS.md; a run started on a busy machine (load average above 1.5 per core) is
reported as such and its figures are not a result.

    python bench/mdt_bench.py                     # 1,000,000 rows, 3 repeats
    python bench/mdt_bench.py --rows 100000       # quick
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from java_bench import KEY, MEMORY, PARTITION, PIPE_CONF, PRECOMBINE, JavaSide, PipeSide, Runs, generate, java_options  # noqa: E402
from report import Measure, write_section  # noqa: E402

COW, MOR = "COPY_ON_WRITE", "MERGE_ON_READ"
PIPE_V6, PIPE_V9, PIPE_V9_MDT, JAVA = "pipe v6", "pipe v9", "pipe v9 + metadata table", "Java 1.1 v9 (defaults)"


class PipeVersionSide(PipeSide):
    """pipe's engine writing new tables at `version`, with or without a metadata table."""

    def __init__(self, spark, work: Path, version: int, metadata_table: bool):
        from runtime.table import TableConfig
        from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ

        super().__init__(spark, work, "partition")
        self.configs = {t: TableConfig(name="bench", table_type=t, record_key_fields=(KEY,), partition_fields=(PARTITION,),
                                       precombine_field=PRECOMBINE, create_version=version, metadata_table=metadata_table)
                        for t in (COPY_ON_WRITE, MERGE_ON_READ)}


class Java11Side(JavaSide):
    """Java Hudi 1.1.1 through the long-lived driver of tests/java_hudi: version 9 (its default),
    metadata table on (its default), SIMPLE index (its default)."""

    def write(self, table: str, table_type: str, operation: str, source: Path) -> None:
        opts = java_options(table, table_type, operation, self.index, self.mdt)
        opts["hoodie.write.table.version"] = "9"
        self.java.call({"op": "write", "path": str(self.work / table), "input": str(source), "options": opts, "mode": "append"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--section", default="mdt")
    args = ap.parse_args()

    os.environ.setdefault("JAVA_HUDI_MEMORY", MEMORY)
    from runtime.spark.session import get_spark
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import HUDI_11, ensure

    ensure((HUDI_11,))
    load_before = os.getloadavg()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pipe-mdt-bench-"))
    spark = get_spark("local[2]", PIPE_CONF, app_name="pipe-mdt-bench")
    java = None
    results: dict[tuple[str, str], Runs] = {}
    counts: dict[str, list] = collections.defaultdict(list)
    done = 0
    try:
        data = generate(spark, work / "data", args.rows, 1000)
        java = JavaHudi(HUDI_11, work / "java-driver")
        sides = [(PIPE_V6, PipeVersionSide(spark, work / "v6", 6, False)), (PIPE_V9, PipeVersionSide(spark, work / "v9", 9, False)),
                 (PIPE_V9_MDT, PipeVersionSide(spark, work / "v9mdt", 9, True)), (JAVA, Java11Side(java, work / "java", "SIMPLE", True, JAVA))]

        def measure(case: str, who: str, side, fn) -> None:
            with Measure(side.pids) as m:
                fn()
            results.setdefault((case, who), Runs()).add(m)
            print(f"  {case:<32} {who:<26} {m.seconds:7.2f} s  cpu {m.cpu:6.1f} s", flush=True)

        for who, side in sides:  # warm-up, not reported: JIT and class loading
            for table_type in (COW, MOR):
                side.write(f"warm-{table_type}", table_type, "bulk_insert", data["small"])
                side.write(f"warm-{table_type}", table_type, "upsert", data["small"])
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            order = sides[r % len(sides):] + sides[:r % len(sides)]  # who goes first turns
            t, m = f"cow{r}", f"mor{r}"
            for case, table, table_type, op, source in (
                    ("bulk_insert (copy-on-write)", t, COW, "bulk_insert", "base"),
                    ("upsert 1% spread (copy-on-write)", t, COW, "upsert", "upsert_spread"),
                    ("bulk_insert (merge-on-read)", m, MOR, "bulk_insert", "base"),
                    ("upsert 1% spread (merge-on-read)", m, MOR, "upsert", "mor_upsert")):
                for who, side in order:
                    measure(case, who, side, lambda: side.write(table, table_type, op, data[source]))
            for who, side in sides:
                counts[who].append((side.scan(t)[0], side.scan(m)[0]))
                for name in (t, m):  # the sides wrote what they say: a files partition only where the metadata table is on
                    files = side.work / name / ".hoodie" / "metadata" / "files"
                    if files.is_dir() != (who in (PIPE_V9_MDT, JAVA)):
                        raise SystemExit(f"{who}: {name} {'has' if files.is_dir() else 'lacks'} a metadata table's files partition")
            done = r + 1
            report(args, results, counts, [w for w, _ in sides], time.perf_counter() - started, load_before, os.getloadavg(), done)
    finally:
        if java is not None:
            java.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, results, counts, [w for w, _ in sides], time.perf_counter() - started, load_before, os.getloadavg(), done, final=True)


def report(args, results, counts, whos, whole, load_before, load_after, done: int, final: bool = False) -> None:
    busy = max(load_before[0], load_after[0]) > 1.5 * (os.cpu_count() or 1)
    cases = list(dict.fromkeys(case for case, _ in results))
    agree = done > 0 and all(len({counts[w][r] for w in whos}) == 1 for r in range(done))  # (copy-on-write, merge-on-read) counts
    lines = [
        "## The metadata table's cost: a 1% upsert at version 9 with and without it, against version 6 and Java 1.1"
        + ("" if args.rows == 1_000_000 else f" ({args.rows:,} rows)"),
        "",
        "Generated by `python bench/mdt_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; whole run {whole:.0f} s",
        f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}, after: {' / '.join(f'{x:.2f}' for x in load_after)}"
        + (" — **the machine was busy: these figures are no result**" if busy else ""),
        f"- {args.rows:,} rows in 10 partitions (bench/java_bench.py's data: bigint key, epoch-millis precombine, decimal, timestamp); "
        "the 1% upserts change N/100 keys spread over every partition",
        "- pipe: runtime.table.Table on PySpark 4 in the benchmark's process, local[2], index `partition` (the counterpart of Java's SIMPLE); "
        "`pipe v9 + metadata table` is a table created with `metadata_table: true`, whose files partition gets a deltacommit (an HFile log "
        "block) before each commit, compacted every 10",
        "- Java: Hudi 1.1.1 (hudi-spark3.5-bundle_2.12) on pyspark 3.5.9, local[2], one long-lived driver; `hoodie.write.table.version=9`, "
        "metadata table on, SIMPLE index (its defaults), bench/java_bench.py's parallelism and file sizes",
        *([] if final else [f"- **Partial: written after repeat {done} of {args.repeats}; the run did not finish.**"]),
        f"- {done} repeats, each on its own tables; the sides take turns going first. Counts after the upserts "
        + ("agree on every side." if agree else "**differ between sides**: " + repr(dict(counts))),
        "",
        "| case | " + " | ".join(f"{w} s (median)" for w in whos) + " | metadata table's cost (v9 + MDT / v9) | v9 + MDT / v6 | v9 + MDT / Java | "
        + " | ".join(f"{w} CPU s" for w in whos) + " |",
        "|---|" + "---:|" * (len(whos) + 3) + "---:|" * len(whos),
    ]
    overheads = {}
    for case in cases:
        runs = [results.get((case, w)) for w in whos]
        if any(r is None for r in runs):
            continue
        med = {w: r.median for w, r in zip(whos, runs)}
        cost = med[PIPE_V9_MDT] / med[PIPE_V9] - 1
        overheads[case] = cost
        lines.append(f"| {case} | " + " | ".join(f"{med[w]:.2f}" for w in whos) + f" | **{cost:+.0%}** | {med[PIPE_V9_MDT] / med[PIPE_V6]:.2f}x | "
                     f"{med[PIPE_V9_MDT] / med[JAVA]:.2f}x | " + " | ".join(f"{r.median_cpu:.1f}" for r in runs) + " |")
    upserts = {c: o for c, o in overheads.items() if c.startswith("upsert")}
    if upserts:
        lines += ["", "Target (issue 41): keeping the metadata table in step costs below 20% of the write: "
                  + "; ".join(f"{c}: {o:+.0%} — **{'met' if o < 0.20 else 'missed'}**" for c, o in upserts.items())]
    write_section(args.section, "\n".join(lines))


if __name__ == "__main__":
    main()
