#!/usr/bin/env python
"""A unit test on the warm server (issue 44): `pipe test --unit` of the example project's unit
test (tests/unit/orders.yml: `this` given, five new rows, the upsert with precombine,
delete_when and a drop expectation, then the comparison with `expect`) as a user runs it, a fresh
command each time, on the project's own warm `pipe server`, beside the baseline a dbt user would
have: the table's SELECT run on the same given rows and compared with the expected rows, with no
write (what dbt's unit tests check: the rows that would be merged), as a fresh Python process
reaching the same server with Spark Connect.

    python bench/unit_test_bench.py                 # 7 rounds; about 3 minutes
    python bench/unit_test_bench.py --print-only    # leaves bench/RESULTS.md alone

Results go to the `unit-tests` section of bench/RESULTS.md. Each figure is the wall time of a
command (interpreter start, imports, compile, the run), median of --repeats after one warm-up of
each, the two taking turns. The machine's load is sampled during the timed runs (report.Load).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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
for p in (str(REPO), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

from report import Load, median, write_section  # noqa: E402

TARGET_S = 3.0
BIN = Path(sys.executable).parent

# The baseline, run as its own process: the SELECT of `orders` (from plan.json) on the rows the
# unit test gives its source, compared with the expected rows by exceptAll both ways, on the
# project's server. Types come from the source's declared schema, as pipe's given rows do.
BASELINE = r'''
import json, sys
from pyspark.sql import SparkSession, functions as F
import yaml
url, project = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote(url).getOrCreate()  # the token: SPARK_CONNECT_AUTHENTICATE_TOKEN
plan = json.load(open(f"{project}/target/plan.json"))
step = next(s for s in plan["steps"] if s["id"] == "table.orders")
source = next(s for s in plan["steps"] if s["id"] == "source.raw_orders")
test = yaml.safe_load(open(f"{project}/tests/unit/orders.yml"))["unit_tests"][0]
given = next(g for g in test["given"] if g["input"] == "source('raw_orders')")["rows"]
columns = source["config"]["schema"]  # [{name, type}], the source's declared schema
names = [c["name"] for c in columns]
raw = spark.createDataFrame([tuple(None if r.get(n) is None else str(r.get(n)) for n in names) for r in given], ", ".join(f"{n} string" for n in names))
typed = raw.select(*[F.col(c["name"]).cast(c["type"]).alias(c["name"]) for c in columns])
typed.createOrReplaceTempView("raw_orders")
got = spark.sql(step["sql"])
cols = list(test["expect"]["rows"][0])
# what the SELECT gives for each given row (dbt's expectation of an incremental model: the rows to merge)
rows = [{"order_id": r["order_id"], "status": r["status"].lower(), "region": r["region"].upper(), "updated_at": r["updated_at"]} for r in given]
expected = spark.createDataFrame([tuple(str(r[c]) for c in cols) for r in rows], ", ".join(f"{c} string" for c in cols))
types = dict((f.name, f.dataType.simpleString()) for f in got.schema.fields)
expected = expected.select(*[F.col(c).cast(types[c]).alias(c) for c in cols])
sel = got.select(*cols)
print(json.dumps({"missing": expected.exceptAll(sel).count(), "unexpected": sel.exceptAll(expected).count()}))
'''


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--print-only", action="store_true", help="print the section, leave bench/RESULTS.md alone")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pipe-unit-bench-"))
    env = {**{k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")},
           "PIPE_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(REPO)}
    pipe = [sys.executable, "-m", "pipe"]
    started = time.perf_counter()
    times: dict[str, list[float]] = {"pipe": [], "baseline": []}
    try:
        subprocess.run([*pipe, "init", "shop"], cwd=work, env=env, check=True, capture_output=True)
        project = work / "shop"
        subprocess.run([*pipe, "compile"], cwd=project, env=env, check=True, capture_output=True)
        t = time.perf_counter()
        subprocess.run([*pipe, "server", "start"], cwd=project, env=env, check=True, capture_output=True, text=True)
        server_s = time.perf_counter() - t
        state = json.loads(next((work / "cache" / "servers").glob("*.json")).read_text())
        baseline = [sys.executable, "-c", BASELINE, state["url"], str(project)]
        unit = [*pipe, "test", "--unit", "--quiet"]
        for cmd in (unit, baseline):  # warm-up of each, not reported
            _, r = _run(cmd, project, {**env, "SPARK_CONNECT_AUTHENTICATE_TOKEN": state["token"]} if cmd is baseline else env)
            assert r.returncode == 0, r.stdout + r.stderr
        load = Load(every=1.0, roots=[state["server_pid"]])  # the server runs both: its CPU is the benchmark's
        load.start()
        for _ in range(args.repeats):
            s, r = _run(unit, project, env)
            assert r.returncode == 0, r.stdout + r.stderr
            times["pipe"].append(s)
            s, r = _run(baseline, project, {**env, "SPARK_CONNECT_AUTHENTICATE_TOKEN": state["token"]})
            assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1]) == {"missing": 0, "unexpected": 0}, r.stdout + r.stderr
            times["baseline"].append(s)
        load.stop()
        results = json.loads((project / "target/run_results.json").read_text())
        step_s = next(s["elapsed_s"] for s in results["steps"] if s["kind"] == "unit")
    finally:
        subprocess.run([*pipe, "server", "stop"], cwd=work / "shop", env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    whole = time.perf_counter() - started

    pipe_s, base_s = median(times["pipe"]), median(times["baseline"])
    loads = load.loads or [os.getloadavg()[0]]
    lines = [
        "## A unit test on the warm server: `pipe test --unit` against a dbt-style check",
        "",
        "Generated by `python bench/unit_test_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"the example project's `pipe server` (local Spark Connect, started once in {server_s:.0f} s); whole run {whole:.0f} s",
        "- pipe: `pipe test --unit --quiet`, a fresh command each time: compile (partial parsing: nothing changed), then the example's "
        "unit test `orders_keep_the_latest_version` on the server: `this` (3 rows) written as the table's first commit in a "
        "throwaway lake, the 5 given rows upserted with precombine, delete_when and a drop expectation, the table read back and "
        "compared with the 3 expected rows",
        "- baseline (what a dbt unit test checks): a fresh Python process on the same server runs the table's SELECT (from "
        "plan.json) on the same given rows and compares it with the expected rows, with no write: it checks what would be "
        "merged, so `this`, precombine, delete_when and the expectation do not take part (its expected rows are the 5 the "
        "SELECT gives, so both pass)",
        f"- Medians of {args.repeats} interleaved runs after one warm-up of each; the unit test's own step took {step_s:.2f} s in "
        "the last run (run_results.json)",
        f"- Machine load (1-minute average): {load.before[0]:.2f} before, {sum(loads) / len(loads):.2f} mean and {max(loads):.2f} max "
        f"during the timed runs, {load.after[0]:.2f} after; CPU taken by other processes during them: {load.others:.0f} s",
        "",
        "| what | median s | runs s | × baseline |",
        "|---|---:|---|---:|",
        f"| the SELECT on the given rows, compared (baseline) | {base_s:.2f} | {', '.join(f'{x:.2f}' for x in times['baseline'])} | 1.00 |",
        f"| `pipe test --unit` | {pipe_s:.2f} | {', '.join(f'{x:.2f}' for x in times['pipe'])} | {pipe_s / base_s:.2f} |",
        "",
        f"Against the target, at most {TARGET_S:.0f} s for the example's unit test on the warm server: **{pipe_s:.2f} s, "
        f"{'met' if pipe_s <= TARGET_S else 'missed'}**.",
    ]
    if not args.print_only:
        write_section("unit-tests", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
