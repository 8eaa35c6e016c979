#!/usr/bin/env python
"""Small writes, the edit-run loop's kind: upserts of 100 rows (half updates, half new keys)
into a copy-on-write and a merge-on-read table of 10,000 rows, on local[2], in a warm session.
Two sessions side by side, each a fresh process, in turns:

  pipe's session     the settings pipe starts every session with (runtime/spark/settings.py)
  Spark's default    the same, but PySpark's DataFrame debugging on (Spark's default): the
                     Python call site of every DataFrame and Column function is recorded

For each: the median wall time of a write after three warm-up writes, the py4j calls a write
makes (counted in the driver), and the Spark jobs it runs. Results go to the `small-write`
section of bench/RESULTS.md and to stdout.

    python bench/small_write_bench.py              # about 3 minutes on 2 cores
    python bench/small_write_bench.py --writes 20
    python bench/small_write_bench.py --table-rows 1000000 --timeline   # a profile of one warm write:
        # each Spark job's start, length and task seconds, and the driver's time outside any job
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from report import Load, write_section  # noqa: E402

SESSIONS = {"pipe": {}, "spark-default": {"spark.python.sql.dataFrameDebugging.enabled": "true"}}

# One process: a table of each type, warm-up writes, then `writes` measured upserts of each.
CHILD = r"""
import json, sys, tempfile, time
from decimal import Decimal
sys.path.insert(0, sys.argv[1])
import py4j.clientserver as cs
from runtime.spark.session import get_spark
from runtime.table import Table, TableConfig
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ

conf, writes, table_rows, timeline = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
if timeline:  # the UI's REST API gives each job's times
    conf = {**conf, "spark.ui.enabled": "true"}
spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "4", **conf}, app_name="small-write-bench")
tracker = spark.sparkContext.statusTracker()
calls = [0]
send = cs.ClientServerConnection.send_command

def counted(self, command):
    calls[0] += 1
    return send(self, command)

cs.ClientServerConnection.send_command = counted
def call_site(name):
    # a stage's name, shortened to its call site's file and line
    if "withThreadLocalCaptured" in name:
        return "a broadcast's build (CompletableFuture)"
    if " at " in name:
        what, where = name.split(" at ", 1)
        return f"{what} at {where.rsplit('/', 1)[-1]}"
    return name

def job_times(ids, start):
    # each job's start (seconds after the write's), its duration and its stages' task seconds
    import urllib.request
    from datetime import datetime, timezone

    def get(path):
        url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/{path}"
        return json.loads(urllib.request.urlopen(url).read())

    def at(text):
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fGMT").replace(tzinfo=timezone.utc).timestamp()

    jobs = {j["jobId"]: j for j in get("jobs")}
    got = []
    for j in ids:
        job = jobs[j]
        tasks = sum(st["executorRunTime"] for sid in job["stageIds"] for st in get(f"stages/{sid}") if st["status"] == "COMPLETE")
        got.append((at(job["submissionTime"]) - start, at(job["completionTime"]) - at(job["submissionTime"]), tasks / 1000))
    return got
SCHEMA = "id long, region string, ts long, amount decimal(12,2), note string"
REGIONS = ("EU", "US/West", "APAC")
out = {}
root = tempfile.mkdtemp(prefix="small-write-")
for kind in (COPY_ON_WRITE, MERGE_ON_READ):
    config = TableConfig(name="orders", table_type=kind, record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    table = Table.create(spark, f"{root}/{kind}", config)
    base = 1_732_000_000_000
    from pyspark.sql import functions as F
    seed = (spark.range(table_rows).select(F.col("id"), F.element_at(F.array(*[F.lit(r) for r in REGIONS]), (F.col("id") % 3 + 1).cast("int")).alias("region"),
            F.lit(base).alias("ts"), (F.col("id") / 100).cast("decimal(12,2)").alias("amount"), F.concat(F.lit("n"), F.col("id").cast("string")).alias("note")))
    table.write(seed, "bulk_insert")
    walls, per_write, jobs, names = [], [], [], []
    for n in range(3 + writes):
        rows = [(i, REGIONS[i % 3], base + n + 1, Decimal(i) / 50, f"u{n}") for i in range(n * 50, n * 50 + 50)]
        rows += [(table_rows * 2 + n * 50 + i, REGIONS[i % 3], base + n + 1, Decimal(i) / 10, f"new{n}") for i in range(50)]
        df = spark.createDataFrame(rows, SCHEMA)
        c0, j0, t0, start = calls[0], len(tracker.getJobIdsForGroup(None)), time.perf_counter(), time.time()
        table.write(df, "upsert")
        if n >= 3:
            walls.append(time.perf_counter() - t0)
            per_write.append(calls[0] - c0)
            ids = sorted(tracker.getJobIdsForGroup(None))[j0:]
            jobs.append(len(ids))
            if n == 3:  # what the jobs of one write are: the call site of each job's last stage
                for j in ids:
                    info = tracker.getJobInfo(j)
                    stage = tracker.getStageInfo(max(info.stageIds)) if info and info.stageIds else None
                    names.append(call_site(stage.name if stage else "?"))
                if timeline:
                    spent = {"write": walls[-1], "jobs": [(name, *times) for name, times in zip(names, job_times(ids, start))]}
    if timeline:
        out[kind] = spent
        continue
    out[kind] = {"walls": walls, "calls": per_write, "jobs": jobs, "names": names, "rows": table.read().count()}
print(json.dumps(out))
"""


def run_session(name: str, writes: int, table_rows: int, timeline: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(REPO), json.dumps(SESSIONS[name]), str(writes), str(table_rows), "1" if timeline else "0"],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"session {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=15, help="measured upserts per table and session (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per session, in turns (default 2)")
    parser.add_argument("--table-rows", type=int, default=10_000, help="rows of each table before the upserts (default 10,000; issue 42's goal is for 1,000,000)")
    parser.add_argument("--section", default="small-write", help="the section of bench/RESULTS.md to write")
    parser.add_argument("--timeline", action="store_true",
                        help="a profile instead: when each Spark job of one warm write (pipe's session) starts and ends, and the "
                             "driver's time between them; needs Spark's UI, so nothing goes to RESULTS.md")
    args = parser.parse_args()
    if args.timeline:
        print_timeline(run_session("pipe", 1, args.table_rows, timeline=True))
        return

    results: dict[str, dict[str, dict[str, list]]] = {name: {} for name in SESSIONS}
    load = Load()
    load.start()
    for _ in range(args.rounds):
        for name in SESSIONS:
            for kind, got in run_session(name, args.writes, args.table_rows).items():
                slot = results[name].setdefault(kind, {"walls": [], "calls": [], "jobs": [], "rows": [], "names": got["names"]})
                for k in ("walls", "calls", "jobs"):
                    slot[k] += got[k]
                slot["rows"].append(got["rows"])
    load.stop()
    for kind in results["pipe"]:
        rows = {tuple(results[name][kind]["rows"]) for name in SESSIONS}
        if len(rows) != 1:
            raise SystemExit(f"{kind}: the sessions' tables differ in rows: {rows}")

    command = "python bench/small_write_bench.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v != parser.get_default(k))
    lines = [f"## Small writes: 100-row upserts into {args.table_rows:,} rows in a warm session, pipe's settings against Spark's default", "",
             f"Generated by `{command}` on {dt.date.today()} — do not edit by hand; run the script again.", "",
             f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; local[2]",
             f"- {args.rounds} fresh processes per session, in turns; in each, per table type, 3 warm-up upserts then "
             f"{args.writes} measured ones: 50 updates and 50 new keys into a table of {args.table_rows:,} rows in 3 partitions "
             f"(bulk-inserted; the global index, pipe's default)",
             "- *pipe's session*: the settings pipe starts every session with; *Spark's default*: the same with "
             "`spark.python.sql.dataFrameDebugging.enabled: true` (PySpark's default), which records the Python call site "
             "of every DataFrame and Column function",
             f"- load: 1-minute load average {min(load.loads, default=load.before[0]):.1f}–{max(load.loads, default=load.after[0]):.1f} "
             f"(before {load.before[0]:.1f}, after {load.after[0]:.1f}); other processes' CPU {load.others:.0f} s, steal {load.steal:.0f} s",
             "- *py4j calls*: round trips from the driver's Python to its JVM during one write; *jobs*: Spark jobs one write runs", "",
             "| table | session | median s / write | best s | py4j calls / write | Spark jobs / write |",
             "|---|---|---:|---:|---:|---:|"]
    for kind in results["pipe"]:
        for name, label in (("pipe", "pipe's session"), ("spark-default", "Spark's default")):
            r = results[name][kind]
            lines.append(f"| {kind} | {label} | {statistics.median(r['walls']):.3f} | {min(r['walls']):.3f} | "
                         f"{statistics.median(r['calls']):.0f} | {statistics.median(r['jobs']):.0f} |")
    for kind in results["pipe"]:
        names = results["pipe"][kind]["names"]
        runs = [(n, len(list(same))) for n, same in itertools.groupby(names)]  # consecutive jobs of one call site, counted
        lines += ["", f"The Spark jobs of one {kind} write in pipe's session, in order (the call site of each job's last stage): "
                  + "; ".join(n + (f" ×{k}" if k > 1 else "") for n, k in runs) + "."]
    body = "\n".join(lines)
    print(body)
    write_section(args.section, body)


def print_timeline(got: dict) -> None:
    for kind, spent in got.items():
        jobs, busy, covered_to = spent["jobs"], 0.0, 0.0
        print(f"{kind}: one write {spent['write']:.3f} s, {len(jobs)} Spark jobs")
        print(f"  {'job (call site)':<58} {'starts':>7} {'lasts':>7} {'task s':>7}")
        for name, at, lasts, tasks in jobs:
            busy += max(0.0, at + lasts - max(at, covered_to))  # jobs may overlap (broadcasts): time under any job
            covered_to = max(covered_to, at + lasts)
            print(f"  {name[:58]:<58} {at:7.3f} {lasts:7.3f} {tasks:7.3f}")
        print(f"  under a job {busy:.3f} s; the driver alone (planning, py4j, between jobs) {spent['write'] - busy:.3f} s")


if __name__ == "__main__":
    main()
