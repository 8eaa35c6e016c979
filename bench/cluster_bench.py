#!/usr/bin/env python
"""pipe on Spark local[2] against a standalone cluster of two Workers (1 core each) on the same
machine, side by side in one run (issue 21):

  example project   `pipe init shop`, then `pipe run` twice (the second round with new orders),
                    each a `pipe` process as a user runs it, on local[2], on the cluster, and on
                    the cluster with the executors' Python from `pipe pack-env` (spark.archives);
                    the tables of the three read back with hudi-rs must be equal
  bulk_insert + 1%  N rows (default 5,000,000) bulk-inserted into a new copy-on-write table, then
                    a 1% upsert into one of its 10 partitions (across its keys) and a 1% upsert
                    spread over all of them, in a process per side (its own Spark driver)
  shipping pipe     per run on the cluster: the probe job and the zip of pipe's code (what
                    `pipe run` prints as "pipe's code shipped as ... (Xs)"), the zip built cold
                    and warm, Spark's start on each side; `pipe pack-env` cold (an empty cache:
                    venv, pip install, tar.gz) and warm (cached)

The cluster is tests/cluster/env.py's: a Master and two Workers started from the installed
pyspark on 127.0.0.1, the executors' Python a venv with pyspark[sql] and pipe's task packages but
not pipe (env.FULL, built once under <repo>/.cluster, or $PIPE_CLUSTER_HOME). Every side runs in
its own processes; each round runs the sides in turn, the order alternating. Measured: wall time;
peak RSS and CPU seconds of the driver's process tree (the `pipe` or bench process, its JVM and,
on local[2], the executors and Python workers inside it) and on the cluster of the executors' (the
executor JVMs and their Python workers, below the Workers); the machine's load during the run and
the CPU other processes took. Results go to the `cluster` section of bench/RESULTS.md.

    python bench/cluster_bench.py                        # 5,000,000 rows, 3 rounds
    python bench/cluster_bench.py --rows 200000 --rounds 1 --no-write   # quick, RESULTS.md untouched
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
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

from report import Load, Measure, median, tree, write_section  # noqa: E402

# The sides of the example project: the target of tests/test_cluster.py's project it runs on.
LOCAL, CLUSTER, PACKED = "local[2]", "cluster", "cluster, pack-env"
SIDES = (LOCAL, CLUSTER, PACKED)
TARGET = {LOCAL: "local2", CLUSTER: "cluster", PACKED: "cluster"}
TABLE_CASES = ("bulk_insert", "upsert 1% in 1 partition", "upsert 1% spread")
SAVED = BENCH_DIR / "out" / "cluster_bench.json"  # the last run's measurements (bench/out is not committed)
SHIPPED = re.compile(r"executors' Python: (.*?) \(Python ([\d., ]+)\) on (\d+) hosts?; pipe's code shipped as (\S+) \(([\d.]+)s\)")


def pipe_env(cache: Path) -> dict[str, str]:
    """The environment of a `pipe` process: this checkout's code, pipe's cache in the work folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIPE_CACHE_DIR": str(cache)}
    env.pop("PIPE_FAULT", None)
    return env


def run_measured(cmd: list[str], cwd: Path, env: dict[str, str], executors) -> tuple[subprocess.CompletedProcess, Measure, Measure]:
    """Runs `cmd` to its end; the Measures of its process tree (the driver) and of `executors`."""
    procs: list[subprocess.Popen] = []
    with Measure(executors) as ex, Measure(lambda: tree([p.pid for p in procs if p.poll() is None])) as drv:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        out, err = p.communicate(timeout=1800)
    done = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
    return done, drv, ex


class Cell:
    """The repeated measurements of one case on one side."""

    def __init__(self):
        self.seconds: list[float] = []
        self.driver_rss = self.executor_rss = 0.0
        self.driver_cpu: list[float] = []
        self.executor_cpu: list[float] = []
        self.extra: dict[str, list] = {}

    def add(self, seconds: float, driver: Measure | dict, executors: Measure | dict | None = None, **extra) -> None:
        get = (lambda m, k: m[k]) if isinstance(driver, dict) else (lambda m, k: getattr(m, k))
        self.seconds.append(seconds)
        self.driver_rss = max(self.driver_rss, get(driver, "peak"))
        self.driver_cpu.append(get(driver, "cpu"))
        if executors is not None:
            self.executor_rss = max(self.executor_rss, get(executors, "peak"))
            self.executor_cpu.append(get(executors, "cpu"))
        for k, v in extra.items():
            self.extra.setdefault(k, []).append(v)

    @classmethod
    def load(cls, saved: dict) -> "Cell":
        cell = cls()
        cell.__dict__.update(saved)
        return cell


# --- the example project ---------------------------------------------------------------------------


def _shop(home: Path, cluster, python) -> Path:
    """The example project of `pipe init` with a target `cluster` (the bench's cluster, executors
    running `python`; the project folder named as shared, since every node of this cluster sees
    it) and a target `local2` (local[2])."""
    from tests.test_example_project import _pipe

    home.mkdir(parents=True, exist_ok=True)
    _pipe(home, "init", "shop")
    project = home / "shop"
    conf = {"spark.pyspark.python": str(python), "spark.executor.memory": "1g", "spark.cores.max": "2",
            "spark.driver.host": "127.0.0.1", "spark.sql.shuffle.partitions": "4"}
    lines = ["targets:", "  cluster:", f'    shared_paths: ["{home}"]', "    spark:", f'      master: "{cluster.master_url}"', "      conf:"]
    lines += [f'        {k}: "{v}"' for k, v in conf.items()]
    lines += ["  local2:", "    spark:", '      master: "local[2]"', "      conf:", '        spark.sql.shuffle.partitions: "4"']
    path = project / "pipe_project.yml"
    text = path.read_text()
    assert "\ntargets:\n" in text
    path.write_text(text.replace("\ntargets:\n", "\n" + "\n".join(lines) + "\n", 1))
    return project


def example_round(r: int, work: Path, cluster, sides: tuple[str, ...], packed_settings: dict[str, str], env: dict[str, str], executors,
                  cells) -> None:
    """One round of the example project on every side: a fresh `pipe init shop`, `pipe run`, new
    orders, `pipe run`; then the three sides' tables must be equal."""
    from tests.cluster import env as cluster_env
    from tests.test_cluster import SHOP_TABLES as TABLES
    from tests.test_cluster import _hudi_table
    from tests.test_example_project import NEW_ORDERS, _results

    projects = {}
    order = sides if r % 2 == 0 else sides[::-1]
    for side in order:
        python = "./pipe_env/bin/python" if side == PACKED else cluster_env.FULL.python
        project = _shop(work / f"shop-{r}-{side.replace(', ', '-').replace('[', '').replace(']', '')}", cluster, python)
        if side == PACKED:
            yml = project / "pipe_project.yml"
            text = yml.read_text()
            line = '        spark.pyspark.python: "./pipe_env/bin/python"\n'
            assert line in text, text
            yml.write_text(text.replace(line, line + f'        spark.archives: "{packed_settings["spark.archives"]}"\n', 1))
        projects[side] = project
        for run, what in ((1, "first run"), (2, "second run, new orders")):
            if run == 2:
                (project / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
            t0 = time.perf_counter()
            done, drv, ex = run_measured([sys.executable, "-m", "pipe", "run", "--target", TARGET[side]], project, env,
                                         executors if side != LOCAL else (lambda: []))
            wall = time.perf_counter() - t0
            states = {s["id"]: s["state"] for s in _results(project).values()}
            if "failed" in states.values():
                raise RuntimeError(f"{side}: {what} failed: {states}\n{done.stderr[-2000:]}")
            shipped = SHIPPED.search(done.stderr)
            if side != LOCAL and not shipped:
                raise RuntimeError(f"{side}: pipe run did not say what it shipped:\n{done.stderr[-2000:]}")
            cells.setdefault((what, side), Cell()).add(
                wall, drv, ex if side != LOCAL else None,
                ship=float(shipped.group(5)) if shipped else None, python=shipped.group(1) if shipped else None,
                hosts=int(shipped.group(3)) if shipped else None, archive=shipped.group(4) if shipped else None)
            print(f"  [{r + 1}] example {what:<24} {side:<18} {wall:6.1f} s"
                  + (f"  shipped {shipped.group(5)} s" if shipped else "") + f"  driver peak {drv.peak:5.0f} MB", flush=True)
    for table in TABLES:
        rows = {side: _hudi_table(project / "lake" / table) for side, project in projects.items()}
        if not rows[LOCAL] or any(v != rows[LOCAL] for v in rows.values()):
            raise RuntimeError(f"round {r + 1}: table {table} differs between the sides: " + ", ".join(f"{s} {len(v)} rows" for s, v in rows.items()))


# --- bulk_insert and upserts: one process per side -------------------------------------------------

def table_side(args) -> None:
    """The child process of one side: Spark start (and shipping, on the cluster), a warm-up, then
    bulk_insert and the two 1% upserts, each measured; prints one JSON line."""
    from java_bench import PipeSide

    from runtime.spark import cluster
    from runtime.spark.session import get_spark

    data = Path(args.data)
    workers = [int(p) for p in args.workers.split(",") if p]
    executors = (lambda: [p for p in tree(workers) if p not in workers]) if workers else (lambda: [])
    out: dict = {"cases": {}}
    t0 = time.perf_counter()
    spark = get_spark(args.master, json.loads(args.conf), app_name="pipe-cluster-bench")
    out["spark_start"] = time.perf_counter() - t0
    out["ship"] = cluster.shipment.seconds if cluster.shipment else None
    if cluster.shipment:  # the probe again, in a session whose executors are up: the probe's own cost
        t0 = time.perf_counter()
        cluster.probe(spark, cluster.requirements_for(False))
        out["probe_again"] = time.perf_counter() - t0
    try:
        pipe = PipeSide(spark, Path(args.work), "global")
        # warm-up, not reported: the first writes pay the JIT, the Python workers' start and imports
        pipe.write("warm", "COPY_ON_WRITE", "bulk_insert", data / "small")
        pipe.write("warm", "COPY_ON_WRITE", "upsert", data / "small")
        steps = (("bulk_insert", "bulk_insert", "base"), ("upsert 1% in 1 partition", "upsert", "upsert_partition"),
                 ("upsert 1% spread", "upsert", "upsert_spread"))
        for case, operation, source in steps:
            with Measure(executors) as ex, Measure(pipe.pids) as drv:
                pipe.write("cow", "COPY_ON_WRITE", operation, data / source)
            out["cases"][case] = {"seconds": drv.seconds, "driver": {"peak": drv.peak, "cpu": drv.cpu},
                                  "executors": {"peak": ex.peak, "cpu": ex.cpu} if workers else None}
        out["check"] = pipe.scan("cow")
    finally:
        spark.stop()
    print(json.dumps(out))


def table_round(r: int, work: Path, data: Path, cluster, conf: dict[str, dict[str, str]], env: dict[str, str], cells, checks) -> None:
    order = (LOCAL, CLUSTER) if r % 2 == 0 else (CLUSTER, LOCAL)
    for side in order:
        workers = ",".join(str(p.pid) for p in cluster.processes[1:]) if side == CLUSTER else ""
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--table-side", "--master", cluster.master_url if side == CLUSTER else "local[2]",
                               "--conf", json.dumps(conf[side]), "--data", str(data), "--work", str(work / f"tables-{r}-{TARGET[side]}"),
                               "--workers", workers], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(f"the {side} side of the table cases failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        for case, m in out["cases"].items():
            cells.setdefault((case, side), Cell()).add(m["seconds"], m["driver"], m["executors"])
            print(f"  [{r + 1}] {case:<33} {side:<18} {m['seconds']:6.1f} s  driver peak {m['driver']['peak']:5.0f} MB", flush=True)
        cells.setdefault(("process", side), Cell()).extra.setdefault("wall", []).append(wall)
        cells[("process", side)].extra.setdefault("spark_start", []).append(out["spark_start"])
        cells[("process", side)].extra.setdefault("ship", []).append(out["ship"])
        cells[("process", side)].extra.setdefault("probe_again", []).append(out.get("probe_again"))
        checks.setdefault(side, []).append(tuple(out["check"]))
        shutil.rmtree(work / f"tables-{r}-{TARGET[side]}", ignore_errors=True)  # 5M rows: about a GB a side


# --- shipping: the zip, pack-env -------------------------------------------------------------------

def code_zip(work: Path) -> dict:
    """The zip of pipe's code built into an empty folder, then again (found by its content hash)."""
    from runtime.spark.cluster import code_archive

    folder = work / "zip-cache"
    t0 = time.perf_counter()
    path = code_archive(folder)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    code_archive(folder)
    return {"cold": cold, "warm": time.perf_counter() - t0, "bytes": path.stat().st_size, "name": path.name}


def pack_env_timed(cache: Path, env: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """`pipe pack-env` with an empty cache, then again; the settings it printed."""
    out = {}
    for what in ("cold", "warm"):
        t0 = time.perf_counter()
        done, drv, _ = run_measured([sys.executable, "-m", "pipe", "pack-env"], REPO, env, lambda: [])
        out[what] = {"seconds": time.perf_counter() - t0, "peak": drv.peak, "cpu": drv.cpu}
    settings = dict(re.findall(r'^\s+(spark\.[a-z.]+): "(.*)"$', done.stdout, re.M))
    assert set(settings) == {"spark.archives", "spark.pyspark.python"}, done.stdout
    out["bytes"] = Path(settings["spark.archives"].split("#")[0]).stat().st_size
    return out, settings


# --- the report ------------------------------------------------------------------------------------

def _s(values) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def _med(values, digits: int = 1) -> str:
    values = [v for v in values if v is not None]
    return f"{median(values):.{digits}f}" if values else "–"


def save(state: dict, cells: dict) -> None:
    """The measurements so far, to re-render the section from (`--render`)."""
    SAVED.parent.mkdir(exist_ok=True)
    SAVED.write_text(json.dumps({**state, "cells": {"|".join(k): vars(c) for k, c in cells.items()}}, indent=1))


def render(state: dict) -> str:
    """The `cluster` section of bench/RESULTS.md from the measurements (see `save`)."""
    args = argparse.Namespace(**state["args"])
    cells = {tuple(k.split("|")): Cell.load(v) for k, v in state["cells"].items()}
    checks, zip_info, pack, whole = state["checks"], state["zip"], state["pack"], state["whole"]
    load = argparse.Namespace(**state["load"])
    done_rounds, final = state["done_rounds"], state["final"]
    busy = max(load.loads or [0.0]) > (os.cpu_count() or 1) + 1 or load.others > 0.1 * whole
    lines = [
        "## pipe on local[2] against a two-worker standalone cluster on the same machine" + ("" if args.rows == 5_000_000 else f" ({args.rows:,} rows)"),
        "",
        "Generated by `python bench/cluster_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {state['date']} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"pyspark {state['pyspark']}; whole run {whole:.0f} s; {done_rounds} round{'s' if done_rounds != 1 else ''}"
        + ("" if final else f" of {args.rounds} (**partial: the run did not finish**)"),
        f"- Load average (1 min) before {load.before[0]:.2f}, after {load.after[0]:.2f}; sampled every "
        f"{load.every:.0f} s during the run: min {min(load.loads or [0]):.2f}, median {median(load.loads or [0]):.2f}, max {max(load.loads or [0]):.2f}. "
        f"Processes outside this benchmark took {load.others:.0f} CPU seconds during the run ({load.others / whole:.2f} cores on average; "
        f"steal {load.steal:.0f} s)" + (" — **the machine was shared during the run: read the times with that in mind**" if busy else ""),
        f"- local[2]: one JVM (driver memory 3g for the table cases, pipe's 2g default for the project) runs the driver and both executor "
        f"threads; the Python workers are its children. Cluster: a Master and two Workers (1 core, {args.worker_memory} each) of "
        f"tests/cluster/env.py on 127.0.0.1, an executor JVM per Worker ({args.worker_memory} for the table cases, 1g for the project), "
        "the driver in the `pipe` (or bench) process, client mode (driver memory 3g for the table cases, Spark's 1g default for the "
        "project); executors' Python: the venv env.FULL (pyspark[sql], pyarrow, pandas, numpy, "
        "fastavro; not pipe). 2 cores in total on both sides, 4 shuffle partitions, on a machine of 2 cores: the cluster's Master, "
        "Workers, executor JVMs and driver JVM all share them.",
        "- Driver: the process tree of the `pipe` (or bench) process: Python, its JVM and, on local[2], the executors' Python workers. "
        "Executors (cluster): the executor JVMs and their Python workers. Peak RSS sampled every 100 ms; CPU: user + system seconds of the tree.",
        "",
        "### The example project (`pipe init shop`)",
        "",
        "`pipe run` as a user runs it (a new process, Spark started and stopped in it): the first run builds the three tables, the second "
        "reads one new orders file (NEW_ORDERS of tests/test_example_project.py). Each round starts from a fresh `pipe init`. "
        f"`{PACKED}`: the cluster, with the executors' Python the packed environment of `pipe pack-env` (spark.archives, unpacked by every "
        "executor in each run) instead of the venv. Shipping: what `pipe run` printed (\"pipe's code shipped as ... (Xs)\": the zip "
        "added to the session and the probe job, after Spark's start). After every round the three sides' tables read back with hudi-rs are equal.",
        "",
        "| run | side | wall s (median) | runs s | shipping s (median) | driver peak RSS MB | driver CPU s | executors peak RSS MB | executors CPU s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for what in ("first run", "second run, new orders"):
        for side in SIDES:
            c = cells.get((what, side))
            if not c:
                continue
            lines.append(f"| {what} | {side} | {median(c.seconds):.1f} | {_s(c.seconds)} | "
                         f"{_med(c.extra.get('ship', []))} | {c.driver_rss:.0f} | {median(c.driver_cpu):.1f} | "
                         + (f"{c.executor_rss:.0f} | {median(c.executor_cpu):.1f} |" if side != LOCAL else "in the driver | in the driver |"))
    lines += [
        "",
        f"### bulk_insert of {args.rows:,} rows and 1% upserts, copy-on-write",
        "",
        "java_bench.py's data (id key, part = id % 10: 10 partitions, ts precombine, name, amount, qty, price decimal, updated_at timestamp), "
        "generated once as Parquet files that both sides read; pipe's engine (runtime.table.Table, index `global`) in a process per side "
        "and round, after a warm-up write of 1,000 rows. bulk_insert into a new table, then in it an upsert of 1% of the keys in partition 3 "
        "(every file group of it) and an upsert of 1% spread over all partitions (every file group of the table).",
        "",
        "| case | side | median s | runs s | cluster / local | driver peak RSS MB | driver CPU s (median) | executors peak RSS MB | executors CPU s (median) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for case in TABLE_CASES:
        for side in (LOCAL, CLUSTER):
            c = cells.get((case, side))
            if not c:
                continue
            base = cells.get((case, LOCAL))
            ratio = f"{median(c.seconds) / median(base.seconds):.2f}" if side == CLUSTER and base else ""
            lines.append(f"| {case} | {side} | {median(c.seconds):.1f} | {_s(c.seconds)} | {ratio} | {c.driver_rss:.0f} | {median(c.driver_cpu):.1f} | "
                         + (f"{c.executor_rss:.0f} | {median(c.executor_cpu):.1f} |" if side == CLUSTER else "in the driver | in the driver |"))
    found = [tuple(v) for vs in checks.values() for v in vs]
    # the sum of a double column depends on the order of addition: equal up to rounding
    same = all(c == found[0][0] and math.isclose(s, found[0][1], rel_tol=1e-12) for c, s in found)
    lines.append("")
    lines.append("Check: the table read back (count, sum(amount)) " + ("is the same on both sides in every round: " if same else "**differs**: ")
                 + "; ".join(f"{side} {c:,} rows, {s:,.2f}" for side, vs in checks.items() for c, s in vs[:1]))
    lines += ["", "### What shipping pipe costs", ""]
    for side in (LOCAL, CLUSTER):
        p = cells.get(("process", side))
        if p:
            ship = [x for x in p.extra["ship"] if x is not None]
            lines.append(f"- Table cases, {side}: Spark's start in the bench's process {median(p.extra['spark_start']):.1f} s (runs {_s(p.extra['spark_start'])})"
                         + (f", of which shipping pipe {median(ship):.2f} s (runs {', '.join(f'{x:.2f}' for x in ship)}); the probe run again "
                            f"right after, with the executors up and their Python workers started, {_med(p.extra.get('probe_again', []), 2)} s"
                            if ship else "") + ".")
    for side in (CLUSTER, PACKED):
        c = cells.get(("first run", side))
        c2 = cells.get(("second run, new orders", side))
        if c and c2:
            ship = [x for x in c.extra["ship"] + c2.extra["ship"] if x is not None]
            lines.append(f"- `pipe run` on the {side} side: \"pipe's code shipped as {c.extra['archive'][0]} (Xs)\" said X = "
                         f"{', '.join(f'{x:.1f}' for x in ship)} s over its runs (median {median(ship):.1f} s), with the executors' Python "
                         f"{c.extra['python'][0]} on {c.extra['hosts'][0]} host(s)" + (", each executor fetching and unpacking the archive first"
                                                                                       if side == PACKED else "") + ".")
    lines.append("- What \"shipped ... (Xs)\" covers: the zip added to the session (built once per content of pipe's code; the first cluster run "
                 "of the first round built it in an empty cache) and the probe, the session's first job. That job waits for the executors to "
                 "start and register and starts their Python workers (which import pyarrow, pandas, numpy and fastavro to report their "
                 "versions): costs the first write would otherwise pay itself. The probe run again in a warm session (above) is what the check "
                 "itself costs.")
    if zip_info:
        lines.append(f"- The zip of pipe's code (runtime/ and compiler/): {zip_info['bytes'] / 1024:.0f} KiB, built in {zip_info['cold']:.2f} s "
                     f"into an empty folder; found again by its content hash in {zip_info['warm'] * 1000:.0f} ms (it hashes every file).")
    if pack:
        lines.append(f"- `pipe pack-env`: cold (empty pipe cache; venv, pip install of pipe's task packages at the driver's versions, tar.gz) "
                     f"{pack['cold']['seconds']:.1f} s ({pack['cold']['cpu']:.0f} CPU s; pip's own caches are not emptied: here its wheel cache and a "
                     "local wheel folder (PIP_FIND_LINKS) held the packages, so a first pack-env that must download them takes longer), warm (the cached "
                     f"archive) {pack['warm']['seconds']:.1f} s; the archive {pack['bytes'] / 1e6:.0f} MB.")
    lines += ["", "### Reading", ""] + reading(cells)
    return "\n".join(lines)


def reading(cells: dict) -> list[str]:
    """What the figures say, computed from them."""
    def med(what: str, side: str, attr: str = "seconds") -> float | None:
        c = cells.get((what, side))
        return median(getattr(c, attr)) if c and getattr(c, attr) else None

    out = []
    runs = [(what, med(what, LOCAL), med(what, CLUSTER)) for what in ("first run", "second run, new orders")]
    if all(a and b for _, a, b in runs):
        out.append("- The example project: the cluster side takes " + " and ".join(f"{b / a:.2f}× local[2]'s wall time in the {what}"
                                                                               for what, a, b in runs)
                   + ". Its tables are a few rows: what the runs measure is fixed costs (starting Spark and its executors, shipping, "
                   "scheduling each step's jobs onto executors in other JVMs), not throughput.")
    ship = [x for what in ("first run", "second run, new orders") for x in (cells.get((what, CLUSTER)).extra.get("ship", [])
                                                                             if cells.get((what, CLUSTER)) else []) if x is not None]
    wall = [x for what in ("first run", "second run, new orders") for x in (cells[(what, CLUSTER)].seconds if (what, CLUSTER) in cells else [])]
    if ship and wall:
        out.append(f"- Shipping pipe (zip + probe) is {median(ship):.1f} s of a cluster run's {median(wall):.1f} s (medians), once per "
                   "`pipe run`, whatever the size of the data.")
    packed = [x for what in ("first run", "second run, new orders") for x in (cells[(what, PACKED)].extra.get("ship", [])
                                                                               if (what, PACKED) in cells else []) if x is not None]
    if packed and ship:
        out.append(f"- With the executors' Python from `pipe pack-env` instead of the venv, shipping takes {median(packed):.1f} s against "
                   f"{median(ship):.1f} s (medians): each executor fetches the archive from the driver and unpacks it before it runs the "
                   "probe, in every run.")
    for case in TABLE_CASES:
        a, b = med(case, LOCAL), med(case, CLUSTER)
        if a and b:
            out.append(f"- {case}: the cluster takes {b / a:.2f}× local[2]'s time.")
    drv = [(cells[(w, s)].driver_rss, s) for w in ("first run", "second run, new orders", *TABLE_CASES) for s in (LOCAL, CLUSTER) if (w, s) in cells]
    if drv:
        local_peak = max((r for r, s in drv if s == LOCAL), default=0)
        cluster_peak = max((r for r, s in drv if s == CLUSTER), default=0)
        out.append(f"- The driver's peak RSS: {local_peak:.0f} MB on local[2], where the driver's JVM also runs the executors and their "
                   f"Python workers; {cluster_peak:.0f} MB on the cluster, where the driver holds the plan, the timeline and the tasks' "
                   "small results only.")
    out.append("- Both sides have 2 cores for tasks on a machine of 2 cores, but the cluster side adds a Master, two Workers and two "
               "executor JVMs beside the driver's, which compete for the same cores and exchange shuffle data and results through the "
               "loopback network; on real nodes each executor has its own cores, memory and disk, and these figures say nothing of how pipe "
               "scales there.")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker-memory", default="2g", help="each Worker's memory, and the executors' for the table cases")
    ap.add_argument("--skip", action="append", default=[], choices=("project", "tables", "pack-env"), help="leave a part out")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave bench/RESULTS.md alone")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--render", action="store_true", help=f"only render the section again from {SAVED.relative_to(REPO)}")
    # the child process of the table cases
    ap.add_argument("--table-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--conf", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--workers", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.table_side:
        return table_side(args)
    if args.render:
        saved = json.loads(SAVED.read_text())
        saved.setdefault("date", f"{dt.datetime.fromtimestamp(SAVED.stat().st_mtime, dt.timezone.utc):%Y-%m-%d %H:%M}")
        text = render(saved)
        if not args.no_write:
            write_section("cluster", text)
        return print(text)

    from pyspark.version import __version__ as pyspark_version

    from tests.cluster import env as cluster_env

    load = Load()
    load.start()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pipe-cluster-bench-"))
    env = pipe_env(work / "pipe-cache")
    cells: dict = {}
    checks: dict = {}
    zip_info = pack = None
    cluster = None
    done_rounds = 0

    def report(final: bool) -> None:
        state = {"args": {"rows": args.rows, "rounds": args.rounds, "worker_memory": args.worker_memory}, "checks": checks,
                 "zip": zip_info, "pack": pack, "whole": time.perf_counter() - started, "pyspark": pyspark_version,
                 "done_rounds": done_rounds, "final": final, "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M}",
                 "load": {"before": load.before, "after": getattr(load, "after", os.getloadavg()), "loads": load.loads,
                          "others": load.others, "steal": load.steal, "every": load.every}}
        save(state, cells)
        text = render(json.loads(SAVED.read_text()))
        if not args.no_write:
            write_section("cluster", text)
        if final:
            print(text)

    try:
        cluster_env.ensure(cluster_env.FULL)
        cluster = cluster_env.start(work / "cluster", workers=2, cores=1, memory=args.worker_memory)
        workers = [p.pid for p in cluster.processes[1:]]
        executors = lambda: [p for p in tree(workers) if p not in workers]  # noqa: E731
        print(f"cluster {cluster.master_url} up; work folder {work}", flush=True)
        settings: dict[str, str] = {}
        if "pack-env" not in args.skip:
            pack, settings = pack_env_timed(work / "pipe-cache", env)
            print(f"pipe pack-env: cold {pack['cold']['seconds']:.1f} s, warm {pack['warm']['seconds']:.1f} s", flush=True)
        zip_info = code_zip(work)
        data = work / "data"
        if "tables" not in args.skip:
            gen = subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = sys.argv[1:3]; from java_bench import generate; "
                                  "from runtime.spark.session import get_spark; s = get_spark('local[2]', {'spark.driver.memory': '3g'}); "
                                  "generate(s, __import__('pathlib').Path(sys.argv[3]), int(sys.argv[4]), 1000); s.stop()",
                                  str(BENCH_DIR), str(REPO), str(data), str(args.rows)], cwd=REPO, env=env, capture_output=True, text=True)
            if gen.returncode:
                raise RuntimeError(f"generating the data failed:\n{gen.stderr[-3000:]}")
        shared = {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "3g"}
        conf = {LOCAL: shared, CLUSTER: {**shared, "spark.executor.memory": args.worker_memory, "spark.cores.max": "2",
                                         "spark.driver.host": "127.0.0.1", "spark.pyspark.python": str(cluster_env.FULL.python)}}
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            if "project" not in args.skip:
                sides = SIDES if settings else (LOCAL, CLUSTER)
                example_round(r, work, cluster, sides, settings, env, executors, cells)
            if "tables" not in args.skip:
                table_round(r, work, data, cluster, conf, env, cells, checks)
            done_rounds = r + 1
            report(final=False)  # a run cut short still leaves what it measured
    finally:
        if cluster is not None:
            cluster.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    load.stop()
    report(final=True)


if __name__ == "__main__":
    main()
