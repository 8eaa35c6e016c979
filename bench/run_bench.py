#!/usr/bin/env python
"""`pipe run` against Spark Declarative Pipelines (`spark-pipelines run`, pyspark 4.1+), side by
side in one run, on the example project (`pipe init shop`: orders, customers, customer_revenue)
and the same pipeline written for SDP in bench/sdp_shop/:

  cold start    `pipe run` of a fresh `pipe init` copy  vs  `spark-pipelines run` of a fresh copy of
                bench/sdp_shop (both read the same JSON files); wall time from launch to exit of
                the command, JVM start included
  warm no-op    a second `pipe run` with no new input (pipe starts no Spark)  vs  the bare cost of
                starting Spark and stopping it (`runtime.spark.session.get_spark('local[*]')` in a
                subprocess)  vs  a second `spark-pipelines run` with no new input
  incremental   one new orders file, then `pipe run`  vs  `spark-pipelines run`

Each repetition works in a fresh temporary folder: `pipe init shop` and a copy of bench/sdp_shop
next to it (its spec reads ../shop/data), then cold, warm and incremental runs in that order; pipe
and SDP take turns going first. Each measurement is repeated (--repeats, 3) and the median and
the minimum are reported, with the CPU time of the command and all its descendants (JVMs, Python
workers: the bench makes itself their subreaper, so it reaps and counts them). After each
repetition the three outputs of both tools are read back (pipe's Hudi tables with hudi-rs, SDP's
Parquet tables with pyarrow) and compared row by row. Results go to the `run` section of
bench/RESULTS.md and to stdout.

    python bench/run_bench.py        # about 10 minutes on 2 cores
    python bench/run_bench.py --repeats 1 --keep   # one quick round; keep the folders to look at

customer_revenue is `operation: insert_overwrite_table` in the example project. When pipe's table
engine does not support that operation yet, the bench runs a copy of the project in which it is
`upsert` (same rows here) and says so in the results (--revenue-operation overrides the check).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SDP_PROJECT = BENCH_DIR / "sdp_shop"
BIN = Path(sys.executable).parent  # the venv's bin: pipe, spark-pipelines
sys.path.insert(0, str(BENCH_DIR))

from report import become_subreaper as _become_subreaper, children_cpu as _children_cpu  # noqa: E402
from report import machine_cpu as _cpu_machine, reap as _reap, run_timed, write_section  # noqa: E402

# Spark Connect's Python packages (pyspark's `connect` extra, minus what pipe already requires).
CONNECT_MODULES = {"grpc": "grpcio", "grpc_status": "grpcio-status", "google.rpc": "googleapis-common-protos",
                   "zstandard": "zstandard"}

# The new export of the incremental run: a late, stale version of order 1 (ignored), order 3
# cancelled (removed), order 5 updated, order 8 new.
NEW_ORDERS = [
    {"order_id": 1, "customer_id": 101, "amount": 99.0, "status": "placed", "region": "eu", "updated_at": "2024-03-01T10:00:00Z"},
    {"order_id": 3, "customer_id": 101, "amount": 12.0, "status": "cancelled", "region": "eu", "updated_at": "2024-03-03T08:00:00Z"},
    {"order_id": 5, "customer_id": 104, "amount": 7.75, "status": "placed", "region": "us", "updated_at": "2024-03-03T09:00:00Z"},
    {"order_id": 8, "customer_id": 104, "amount": 30.0, "status": "placed", "region": "us", "updated_at": "2024-03-03T10:00:00Z"},
]

# Columns compared between the two tools' outputs.
OUTPUTS = {
    "orders": ["order_id", "customer_id", "amount", "status", "region", "updated_at"],
    "customers": ["customer_id", "name", "email", "country", "updated_at"],
    "customer_revenue": ["customer_id", "name", "country", "orders", "revenue"],
}
TABLES = tuple(OUTPUTS)


class BenchError(Exception):
    pass


# --- processes -----------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    cpu: float | None
    detail: str = ""
    parts: dict[str, float] = field(default_factory=dict)  # where the time went (see check_pipe, check_sdp)


def _tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace").splitlines()
    keep = [l for l in text if not l.lstrip().startswith("at ")]  # drop Java stack frames
    return "\n".join(keep[-lines:])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    env.pop("PYTHONSTARTUP", None)
    # Python as users run it: compiled modules are cached (a shell of ours may turn that off)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _local_conf() -> dict[str, str]:
    """The settings pipe's runtime.spark.session.get_spark uses for local[*], given to SDP too, so that
    both run Spark alike: UI off, 2g driver, shuffle partitions sized to the cores, UTC."""
    cores = os.cpu_count() or 2
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": str(max(2, cores * 2)),
        "spark.default.parallelism": str(max(2, cores)),
        "spark.sql.adaptive.enabled": "true",
    }


# SDP's Spark settings: a persistent catalog (the tables are managed tables; with Spark's default
# in-memory catalog a second run forgets them and fails on their folders, LOCATION_ALREADY_EXISTS)
# and pipe's local settings. They go into a spark-defaults.conf (SPARK_CONF_DIR), not `--conf`s:
# spark-pipelines hands its Spark conf to the Python CLI in environment variables of 10 entries
# each (PYSPARK_REMOTE_INIT_CONF_0..n), and pyspark 4.3 keeps only the last of them when it starts
# the local Connect server, so with more than ~10 settings some are silently dropped.
SDP_STATIC = {"spark.sql.catalogImplementation": "hive"}


def sdp_conf_dir(work: Path) -> Path:
    conf = work / "sdp-spark-conf"
    conf.mkdir()
    settings = {**SDP_STATIC, **_local_conf()}
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    return conf


def sdp_command(spec: Path) -> list[str]:
    # Spark Connect with remote `local`, i.e. local[*] like pipe's dev target (--master is refused)
    return [str(BIN / "spark-pipelines"), "run", "--spec", str(spec)]


BASELINE_CODE = "from runtime.spark.session import get_spark; get_spark('local[*]').stop()"


# --- checks of what each run did ----------------------------------------------------------------


def _pipe_states(project: Path) -> dict[str, dict]:
    path = project / "target/run_results.json"
    if not path.exists():
        raise BenchError(f"pipe run wrote no {path}")
    return {s["id"]: s for s in json.loads(path.read_text())["steps"]}


def check_pipe(project: Path, log: Path, rc: int, jvm: bool, expect: dict[str, str], what: str) -> tuple[str, dict[str, float]]:
    """pipe's exit code and run_results.json against the expected state of each table; the
    duration of each table step that wrote."""
    steps = _pipe_states(project)
    errors = [f"{sid}: {s.get('message')}" for sid, s in steps.items() if s["state"] == "error"]
    if any("not supported by this table engine" in e for e in errors):
        raise BenchError(f"{what}: {'; '.join(errors)}\n  hint: the engine lacks an operation the example project uses; "
                         "run with --revenue-operation upsert")
    got = {t: steps.get(f"table.{t}", {}).get("state") for t in expect}
    if rc != 0 or errors or got != expect:
        raise BenchError(f"{what}: exit code {rc}, table states {got} (expected {expect}); errors: {errors}\n"
                         f"--- {log} (tail)\n{_tail(log)}")
    ran = [t for t, s in got.items() if s == "success"]
    rows = sum((steps[f"table.{t}"].get("rows_written") or 0) for t in ran)
    detail = (f"{len(ran)} of {len(got)} tables written ({rows} rows)" if ran else f"0 of {len(got)} tables written (no new input)") + \
        ("; Spark started" if jvm else "; no JVM started")
    return detail, {t: steps[f"table.{t}"].get("elapsed_s") or 0.0 for t in ran}


FLOW_DONE = re.compile(r"Flow (\S+) has COMPLETED")


# spark-pipelines' own log lines: "2026-11-21 17:25:23: Starting run..." (local time, whole seconds)
SDP_EVENT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d): (Loading pipeline spec|Creating dataflow graph|Starting run|Run is COMPLETED)", re.M)


def check_sdp(log: Path, rc: int, what: str, launched: float, seconds: float) -> tuple[str, dict[str, float]]:
    """The exit code and the log of `spark-pipelines run`; the phases of the run from its log."""
    text = log.read_text(errors="replace")
    if rc != 0 or "Run is COMPLETED" not in text:
        raise BenchError(f"{what}: exit code {rc}\n--- {log} (tail)\n{_tail(log)}")
    flows = sorted({m.split(".")[-1] for m in FLOW_DONE.findall(text)})
    streaming = [f for f in flows if f.startswith("raw_")]
    views = [f for f in flows if not f.startswith("raw_")]
    at = {event: dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() for stamp, event in SDP_EVENT.findall(text)}
    parts = {}
    if len(at) == 4:
        parts = {  # whole-second stamps: each part is good to about a second
            "launcher JVM + Python CLI": at["Loading pipeline spec"] - launched,
            "Spark Connect server + session": at["Creating dataflow graph"] - at["Loading pipeline spec"],
            "graph registration": at["Starting run"] - at["Creating dataflow graph"],
            "the run (flows)": at["Run is COMPLETED"] - at["Starting run"],
            "stop and exit": launched + seconds - at["Run is COMPLETED"],
        }
    return f"{len(views)} materialized views recomputed; {len(streaming)} streaming-table flows run (new files only)", parts


# --- outputs -------------------------------------------------------------------------------------


def _norm(v):
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)  # Spark's INT96: UTC instants without a zone
        return v.astimezone(dt.timezone.utc).isoformat()
    if isinstance(v, float):
        return round(v, 6)
    return v


def _multiset(columns: dict[str, list], names: list[str]) -> collections.Counter:
    return collections.Counter(zip(*[[_norm(x) for x in columns[c]] for c in names]))


def pipe_rows(table_dir: Path, names: list[str]) -> collections.Counter:
    from hudi import HudiTableBuilder

    out: collections.Counter = collections.Counter()
    for batch in HudiTableBuilder.from_base_uri(str(table_dir)).build().read():
        out += _multiset(batch.to_pydict(), names)
    return out


def sdp_rows(table_dir: Path, names: list[str]) -> collections.Counter:
    import pyarrow.dataset as ds

    table = ds.dataset(str(table_dir), format="parquet", partitioning="hive").to_table()
    return _multiset(table.to_pydict(), names)


def compare_outputs(shop: Path, sdp: Path) -> tuple[bool | None, str]:
    if importlib.util.find_spec("hudi") is None:
        return None, "not compared: the `hudi` package (pipe's dev extra) is not installed"
    diffs, sizes = [], []
    for table, names in OUTPUTS.items():
        a, b = pipe_rows(shop / "lake" / table, names), sdp_rows(sdp / "spark-warehouse" / table, names)
        sizes.append(f"{table} {sum(a.values())}")
        if a != b:
            diffs.append(f"{table}: only in pipe {sorted(a - b, key=repr)}, only in SDP {sorted(b - a, key=repr)}")
    return (not diffs), ("; ".join(diffs) if diffs else "identical rows: " + ", ".join(sizes))


def tree_size(path: Path) -> tuple[int, int]:
    files = size = 0
    if path.exists():
        for p in path.rglob("*"):
            if p.is_file():
                files += 1
                size += p.stat().st_size
    return files, size


def disk_report(shop: Path, sdp: Path) -> list[tuple[str, str, int, int]]:
    lake = shop / "lake"
    rows = []
    data_files = [p for t in TABLES for p in (lake / t).rglob("*.parquet") if ".hoodie" not in p.parts]
    timeline = [tree_size(lake / t / ".hoodie") for t in TABLES]
    rows.append(("pipe", "lake/: data files of the 3 Hudi tables (Parquet, file versions kept for time travel)",
                 len(data_files), sum(p.stat().st_size for p in data_files)))
    rows.append(("pipe", "lake/*/.hoodie: timelines (instants with checkpoints, hoodie.properties, schemas)",
                 sum(f for f, _ in timeline), sum(s for _, s in timeline)))
    wh = sdp / "spark-warehouse"
    for label, tables in (("materialized views orders, customers, customer_revenue (Parquet, rewritten each run)", TABLES),
                          ("streaming tables raw_orders, raw_customers (Parquet copy of the input + _spark_metadata)",
                           ("raw_orders", "raw_customers"))):
        sizes = [tree_size(wh / t) for t in tables]
        rows.append(("SDP", f"spark-warehouse/: {label}", sum(f for f, _ in sizes), sum(s for _, s in sizes)))
    f, s = tree_size(sdp / "pipeline-storage")
    rows.append(("SDP", "pipeline-storage/: streaming checkpoints (offsets, commits, file-source logs)", f, s))
    f, s = tree_size(sdp / "metastore_db")
    rows.append(("SDP", "metastore_db/: the Derby Hive metastore holding the table definitions", f, s))
    return rows


def timeline_counts(shop: Path) -> str:
    parts = []
    for t in TABLES:
        done = [p.name for p in (shop / "lake" / t / ".hoodie").glob("*") if re.fullmatch(r"\d+\.(commit|replacecommit|deltacommit)", p.name)]
        kinds = collections.Counter(n.split(".", 1)[1] for n in done)
        parts.append(f"{t} " + " + ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    return "; ".join(parts)


# --- the bench -----------------------------------------------------------------------------------


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=lambda: collections.defaultdict(list))
    checks: list[tuple[bool | None, str]] = field(default_factory=list)
    disk: list[tuple[str, str, int, int]] = field(default_factory=list)
    timeline: str = ""

    def add(self, key: str, s: Sample) -> None:
        self.samples[key].append(s)


SERVER_LOOP = 3  # new files run one after another on the warm server, each a sample of server-incremental


def server_start(project: Path, env: dict[str, str], log: Path, subreaper: bool, *flags: str) -> float:
    """`pipe server start` in `project`: its wall time. The server outlives the command, so this
    bench stops being a subreaper while it starts (the server is not one of the bench's
    descendants to reap, and its CPU is not counted)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True) if subreaper else None
    if libc is not None:
        libc.prctl(36, 0, 0, 0, 0)
    try:
        t0 = time.perf_counter()
        r = subprocess.run([str(BIN / "pipe"), "server", "start", *flags], cwd=project, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
    finally:
        if libc is not None:
            libc.prctl(36, 1, 0, 0, 0)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise BenchError(f"pipe server start failed: {r.stdout}{r.stderr}")
    return seconds


def prepare(work: Path, env: dict[str, str], revenue_upsert: bool, sdp_too: bool = True) -> tuple[Path, Path | None]:
    work.mkdir(exist_ok=True)
    rc = subprocess.run([str(BIN / "pipe"), "init", "shop"], cwd=work, env=env, capture_output=True, text=True)
    if rc.returncode != 0:
        raise BenchError(f"pipe init failed: {rc.stdout}{rc.stderr}")
    shop = work / "shop"
    if revenue_upsert:
        yml = shop / "tables/customer_revenue.yml"
        text = yml.read_text()
        if "operation: insert_overwrite_table" not in text:
            raise BenchError(f"{yml} has no `operation: insert_overwrite_table` to replace")
        yml.write_text(text.replace("operation: insert_overwrite_table", "operation: upsert"))
    if not sdp_too:
        return shop, None
    sdp = work / "sdp_shop"
    shutil.copytree(SDP_PROJECT, sdp, ignore=shutil.ignore_patterns("__pycache__", "spark-warehouse", "metastore_db",
                                                                        "pipeline-storage", "derby.log"))
    spec = sdp / "spark-pipeline.yml"
    text, n = re.subn(r"(?m)^storage:.*$", f"storage: {(sdp / 'pipeline-storage').as_uri()}", spec.read_text())
    if n != 1:
        raise BenchError(f"{spec}: no `storage:` line to point at the copy")
    spec.write_text(text)
    return shop, sdp


def one_round(rep: int, work: Path, env: dict[str, str], res: Results, revenue_upsert: bool, subreaper: bool) -> None:
    shop, sdp = prepare(work, env, revenue_upsert)
    sdp_env = {**env, "SPARK_CONF_DIR": str(sdp_conf_dir(work))}
    logs = work / "logs"
    logs.mkdir()
    spec = sdp / "spark-pipeline.yml"
    pipe_cmd = [str(BIN / "pipe"), "run"]
    tag = f"[{rep + 1}]"

    def pipe(phase: str, expect: dict[str, str], project: Path = shop, run_env: dict[str, str] = env) -> None:
        log = logs / f"{phase}-pipe.log"
        r = run_timed(pipe_cmd, project, log, run_env, subreaper)
        secs = r.seconds
        detail, parts = check_pipe(project, log, r.rc, r.jvm, expect, f"{tag} {phase} pipe run")
        res.add(f"{phase}/pipe", Sample(secs, r.cpu, detail, parts))
        print(f"{tag} {phase:<11} pipe run             {secs:6.1f} s  {detail}", flush=True)

    def sdp_run(phase: str) -> None:
        log = logs / f"{phase}-sdp.log"
        r = run_timed(sdp_command(spec), sdp, log, sdp_env, subreaper)
        secs = r.seconds
        detail, parts = check_sdp(log, r.rc, f"{tag} {phase} spark-pipelines run", r.launched, secs)
        if not (sdp / "metastore_db").is_dir():
            raise BenchError(f"{tag} {phase} spark-pipelines run did not use the Hive catalog (no metastore_db): "
                             f"the settings in {sdp_env['SPARK_CONF_DIR']} were not applied")
        res.add(f"{phase}/sdp", Sample(secs, r.cpu, detail, parts))
        print(f"{tag} {phase:<11} spark-pipelines run  {secs:6.1f} s  {detail}", flush=True)

    def baseline() -> None:
        log = logs / "warm-baseline.log"
        r = run_timed([sys.executable, "-c", BASELINE_CODE], shop, log, env, subreaper)
        secs = r.seconds
        if r.rc != 0 or not r.jvm:
            raise BenchError(f"{tag} Spark start/stop baseline: exit code {r.rc}, JVM seen: {r.jvm}\n{_tail(log)}")
        res.add("warm/baseline", Sample(secs, r.cpu, "SparkSession up, then stopped"))
        print(f"{tag} {'warm':<11} start + stop Spark    {secs:6.1f} s", flush=True)

    pipe_first = rep % 2 == 0  # take turns: drift and a warmer page cache hit both alike
    all_ran = {t: "success" for t in TABLES}
    none_ran = {t: "no_input" for t in TABLES}
    incremental = {"orders": "success", "customers": "no_input", "customer_revenue": "success"}

    for f in ((lambda: pipe("cold", all_ran)), (lambda: sdp_run("cold")))[:: 1 if pipe_first else -1]:
        f()
    warm = [lambda: pipe("warm", none_ran), baseline, lambda: sdp_run("warm")]
    for f in warm[rep % 3:] + warm[:rep % 3]:
        f()
    (shop / "data/orders/orders-0003.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
    for f in ((lambda: pipe("incremental", incremental)), (lambda: sdp_run("incremental")))[:: 1 if pipe_first else -1]:
        f()

    ok, message = compare_outputs(shop, sdp)
    res.checks.append((ok, message))
    print(f"{tag} outputs: {message}", flush=True)

    # the warm loop: a copy of the project on its own `pipe server`: started, a first run, the
    # same new file, then a run with nothing new
    srv_env = {**env, "PIPE_CACHE_DIR": str(work / "pipe-cache")}
    srv_shop, _ = prepare(work / "srv", srv_env, revenue_upsert, sdp_too=False)
    started = server_start(srv_shop, srv_env, logs / "server-start.log", subreaper)
    res.add("server/start", Sample(started, None, "`pipe server start`: the Connect server's JVM up"))
    print(f"{tag} {'server':<11} pipe server start    {started:6.1f} s", flush=True)
    try:
        pipe("server-first", all_ran, srv_shop, srv_env)
        # the loop: a new file at a time, SERVER_LOOP times; after the first, files holding the
        # same orders again (the same versions win), so the tables stay comparable with SDP's
        for k in range(SERVER_LOOP):
            (srv_shop / f"data/orders/orders-{3 + k:04d}.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
            pipe("server-incremental", incremental, srv_shop, srv_env)
        pipe("server-noop", none_ran, srv_shop, srv_env)
    finally:
        subprocess.run([str(BIN / "pipe"), "server", "stop"], cwd=srv_shop, env=srv_env, capture_output=True)
    ok, message = compare_outputs(srv_shop, sdp)
    res.checks.append((ok, "on the pipe server: " + message))
    print(f"{tag} outputs on the pipe server: {message}", flush=True)
    if not res.disk:
        res.disk = disk_report(shop, sdp)
        res.timeline = timeline_counts(shop)


def _engine_supports(operation: str) -> bool:
    try:
        from runtime.table import writer
    except Exception:  # noqa: BLE001 - an engine that does not import runs nothing anyway
        return False
    return operation in getattr(writer, "OPERATION_TYPES", {})


def prerequisites() -> str | None:
    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:  # a missing parent package (google)
            return False

    missing = [pkg for mod, pkg in CONNECT_MODULES.items() if not found(mod)]
    if missing:
        return ("spark-pipelines (Spark Declarative Pipelines) is a Spark Connect client and needs "
                f"{', '.join(missing)}, which are not installed. pipe depends on them (pyspark[connect]):\n\n"
                '    pip install -e .\n')
    for tool in ("pipe", "spark-pipelines"):
        if not (BIN / tool).exists():
            return f"{BIN / tool} not found: run the bench with the Python of the venv pipe and pyspark are installed in"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java found (java on PATH or JAVA_HOME): Spark needs Java 17+"
    return None


# --- report --------------------------------------------------------------------------------------


def _code_hash() -> str:
    """sha256 of pipe's code and example project: the figures are of the code on disk during the run."""
    import hashlib

    h = hashlib.sha256()
    for top in ("runtime", "pipe", "compiler", "project_template"):
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def _versions() -> dict[str, str]:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "runtime", "pipe", "compiler", "project_template"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    model = ""
    try:
        model = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "machine": f"{model or platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores; {platform.platform()}",
        "software": f"Python {platform.python_version()}; pyspark {pyspark.__version__}; {java[0] if java else 'java ?'}",
        "pipe": f"commit {commit or 'unknown'}" + (" with uncommitted changes in runtime/, pipe/, compiler/ or project_template/" if dirty else ""),
    }


ROWS = [  # key, scenario, command
    ("cold/pipe", "cold start", "`pipe run` (fresh project)"),
    ("cold/sdp", "cold start", "`spark-pipelines run` (fresh project)"),
    ("warm/pipe", "warm no-op", "`pipe run`, no new input"),
    ("warm/baseline", "warm no-op", "baseline: start Spark, stop it"),
    ("warm/sdp", "warm no-op", "`spark-pipelines run`, no new input"),
    ("incremental/pipe", "incremental (+1 orders file)", "`pipe run`"),
    ("incremental/sdp", "incremental (+1 orders file)", "`spark-pipelines run`"),
    ("server/start", "warm local server", "`pipe server start` (once)"),
    ("server-first/pipe", "warm local server", "`pipe run` (fresh project, first run on the server)"),
    ("server-incremental/pipe", f"warm local server, incremental (+1 orders file, {SERVER_LOOP} in a row)", "`pipe run`"),
    ("server-noop/pipe", "warm local server, no-op", "`pipe run`, no new input"),
]


def _median_parts(samples: list[Sample]) -> dict[str, float]:
    names = list(dict.fromkeys(n for s in samples for n in s.parts))
    return {n: statistics.median(s.parts[n] for s in samples if n in s.parts) for n in names}


def _fmt(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def render(res: Results, meta: dict, repeats: int) -> tuple[str, str]:
    med = {k: statistics.median(s.seconds for s in v) for k, v in res.samples.items()}
    best = {k: min(s.seconds for s in v) for k, v in res.samples.items()}
    cpu = {k: statistics.median(s.cpu for s in v) if all(s.cpu is not None for s in v) else None for k, v in res.samples.items()}

    table = ["| scenario | command | median s | min s | runs s | CPU s (median) | × pipe (median) | what it did |",
             "|---|---|---:|---:|---|---:|---:|---|"]
    for key, scenario, command in ROWS:
        if key not in res.samples:
            continue
        phase = key.split("/")[0]
        ratio = med[key] / med[f"{phase}/pipe"] if f"{phase}/pipe" in med and med[f"{phase}/pipe"] > 0 else None
        runs = ", ".join(f"{s.seconds:.1f}" for s in res.samples[key])
        details = collections.Counter(s.detail for s in res.samples[key])
        detail = "; ".join(d if n == len(res.samples[key]) else f"{d} (×{n})" for d, n in details.items())
        table.append(f"| {scenario} | {command} | {med[key]:.1f} | {best[key]:.1f} | {runs} | {_fmt(cpu[key])} | "
                     f"{_fmt(ratio, 2) if not key.endswith('/pipe') else '1.00'} | {detail} |")

    out: list[str] = []
    w = out.append
    w("## pipe run against Spark Declarative Pipelines: cold start, no-op, incremental run")
    w("")
    w("Generated by `python bench/run_bench.py` — do not edit by hand; run the script again.")
    w("")
    w(f"- Date: {meta['started']:%Y-%m-%d %H:%M} UTC; {meta['versions']['machine']}")
    code_before, code_after = meta["code"]
    w(f"- {meta['versions']['software']}; pipe {meta['versions']['pipe']}; code hash {code_before} "
      "(sha256 of runtime/, pipe/, compiler/, project_template/)")
    if code_before != code_after:
        w(f"- **WARNING: pipe's code changed during this run** (hash {code_before} at the start, {code_after} at the end): "
          "the `pipe run`s ran whatever was on disk at the time; these figures mix versions. Run again.")
    w(f"- {repeats} repetitions, each in a fresh temporary folder; whole bench {meta['wall']:.0f} s")
    comp = meta.get("competition")
    load = f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in meta['load_before'])}, after: {' / '.join(f'{x:.2f}' for x in meta['load_after'])}"
    if comp:
        load += (f"; during the bench other processes used {comp[0]:.0f} CPU-s and the hypervisor stole {comp[1]:.0f} CPU-s "
                 f"(over {meta['wall']:.0f} s of wall time on {os.cpu_count()} cores)")
        if comp[0] + comp[1] > 0.1 * meta["wall"]:
            load += " — **the machine was not idle: wall times are inflated and noisy; CPU times less so**"
    w(load)
    w(f"- customer_revenue: {meta['revenue_note']}")
    w("")
    w("### What is compared")
    w("")
    w("- **pipe**: `pipe run` of the example project (`pipe init shop`), target `dev` (`local[*]`). "
      "orders and customers are Hudi upserts by key with `updated_at` as precombine (orders partitioned by region, "
      "cancelled orders deleted); customer_revenue is rebuilt from the two tables when one of them has a new commit.")
    w("- **SDP**: the same pipeline for Spark Declarative Pipelines, [bench/sdp_shop/](sdp_shop/), run with "
      "`spark-pipelines run` with `spark.sql.catalogImplementation=hive` (a Derby metastore, so that the tables "
      "outlive the process) and the local settings pipe's session uses (UI off, 2g driver, shuffle partitions = "
      "2 × cores) in a `spark-defaults.conf`. "
      "raw_orders and raw_customers are streaming tables (`@dp.table` over `spark.readStream…json`, so each run "
      "appends only the files not consumed yet); orders, customers (latest version per key by `updated_at`, via "
      "`row_number()`; cancelled orders left out; amount rounded; email lower-cased) and customer_revenue (join + "
      "aggregate) are materialized views (`CREATE MATERIALIZED VIEW`), which open-source SDP recomputes in full on "
      "every run. SDP has no upsert into a Parquet table: AUTO CDC (`create_auto_cdc_flow`) needs a target format "
      "supporting MERGE and fails on Parquet with `AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE`.")
    w("- Both read the same JSON files (the SDP copy's spec points at `../shop/data`). The incremental run adds "
      "`orders-0003.json` (4 rows: a stale version of order 1, order 3 cancelled, order 5 updated, order 8 new).")
    w("- **baseline**: `python -c \"from runtime.spark.session import get_spark; get_spark('local[*]').stop()\"`: the "
      "least any run that uses Spark pays (interpreter, JVM, SparkSession, stop).")
    w("- Times are wall-clock seconds of the command as a subprocess, from launch to exit (JVM start included). "
      "*CPU s* is user + system CPU of the command and all its descendants (JVMs, Python workers). In each "
      "repetition the runs go cold → warm → incremental; pipe and SDP take turns going first.")
    checked = [c for c in res.checks if c[0] is not None]
    if checked:
        same = sum(1 for ok, _ in checked if ok)
        w(f"- Outputs: after each repetition the three outputs of both were read back (pipe's Hudi tables with "
          f"hudi-rs, SDP's Parquet with pyarrow) and compared row by row: identical in {same} of {len(checked)} "
          f"repetitions (after the incremental run: {res.checks[0][1].split(': ', 1)[-1]} rows).")
        for ok, msg in res.checks:
            if not ok:
                w(f"  - **differences**: {msg}")
    elif res.checks:
        w(f"- Outputs: {res.checks[0][1]}.")
    w("")
    w("### Figures")
    w("")
    out.extend(table)
    w("")
    w("### Where the time goes")
    w("")
    w("Medians over the repetitions. SDP's phases come from the timestamps of its own log lines (whole seconds, so "
      "each is good to about a second); pipe's are the durations of its table steps in `target/run_results.json`, "
      "from the step's start to its commit (orders and customers run at the same time and the first of them starts "
      "the SparkSession; customer_revenue runs after them).")
    w("")
    w("| run | tool | wall s | parts, s |")
    w("|---|---|---:|---|")
    for key, scenario, command in ROWS:
        if key.endswith("/baseline") or key not in res.samples:
            continue
        parts = _median_parts(res.samples[key])
        text = " · ".join(f"{name} {v:.1f}" for name, v in parts.items()) or (
            "no table step wrote: no Spark" if key.endswith("/pipe") else "(its log lines were not found)")
        w(f"| {scenario} | {'pipe' if key.endswith('/pipe') else 'spark-pipelines'} | {med[key]:.1f} | {text} |")
    w("")
    w("### What each writes")
    w("")
    w("- **pipe** writes three Apache Hudi tables (table version 6, copy-on-write) under `lake/`: Parquet data files "
      "and, per table, a `.hoodie/` timeline whose commits carry the source checkpoints, so there is no other state. "
      "Upserts rewrite only the affected file groups; earlier file versions stay readable (time travel, incremental "
      "reads) until cleaned. The raw JSON is not copied. `target/` holds plan.json and run_results.json.")
    w("- **SDP** writes managed Parquet tables of Spark's session catalog (no Delta: no transaction log, no time "
      "travel, no upsert) in `spark-warehouse/`: the two streaming tables (a Parquet copy of every input row, plus the "
      "file sink's `_spark_metadata` log) and the three materialized views (overwritten in full each run); the "
      "streaming checkpoints in the spec's `storage` folder; and the table definitions in a Derby Hive metastore "
      "(`metastore_db/`, needed for the tables to survive the process).")
    if res.disk:
        w("")
        w("On disk after the three runs of the first repetition:")
        w("")
        w("| tool | what | files | bytes |")
        w("|---|---|---:|---:|")
        for tool, what, files, size in res.disk:
            w(f"| {tool} | {what} | {files:,} | {size:,} |")
        if res.timeline:
            w("")
            w(f"pipe's timelines then hold: {res.timeline}.")
    w("")
    w("### Reading the figures")
    w("")
    w(_reading(med, best))
    return "\n".join(out), "\n".join(table)


def _reading(med: dict[str, float], best: dict[str, float]) -> str:
    lines = []
    g, b = med.get, best.get
    if g("cold/pipe") and g("cold/sdp"):
        lines.append(f"- Cold start: `spark-pipelines run` took {g('cold/sdp') / g('cold/pipe'):.2f}× the time of `pipe run` "
                     f"(medians {g('cold/sdp'):.1f} s and {g('cold/pipe'):.1f} s; minimums {b('cold/sdp'):.1f} s and {b('cold/pipe'):.1f} s). "
                     "Both start Spark; SDP starts two JVMs (spark-submit runs the Python CLI, which starts a local Spark "
                     "Connect server) and a Hive metastore, then registers the graph over Spark Connect.")
    if g("warm/pipe") and g("warm/baseline") and g("warm/sdp"):
        lines.append(f"- No new input: `pipe run` finishes in {g('warm/pipe'):.1f} s without starting Spark, "
                     f"{g('warm/baseline') / g('warm/pipe'):.0f}× below the bare start and stop of Spark ({g('warm/baseline'):.1f} s); "
                     f"`spark-pipelines run` takes {g('warm/sdp'):.1f} s: it starts Spark and recomputes its materialized views "
                     "whether or not anything changed.")
    if g("incremental/pipe") and g("incremental/sdp"):
        lines.append(f"- One new file: `pipe run` {g('incremental/pipe'):.1f} s (minimum {b('incremental/pipe'):.1f} s: upserts the "
                     f"new rows into orders, rebuilds customer_revenue, leaves customers alone), `spark-pipelines run` "
                     f"{g('incremental/sdp'):.1f} s (minimum {b('incremental/sdp'):.1f} s: appends the file to raw_orders, "
                     "recomputes the three views). With 16 input rows at first and 4 new ones, both are dominated by fixed "
                     "costs (JVM and session start, per-table write overhead): the figures compare those, not throughput.")
    if g("server-incremental/pipe") and g("incremental/pipe"):
        sdp = f", {g('server-incremental/pipe') / g('incremental/sdp'):.2f}× `spark-pipelines run` ({g('incremental/sdp'):.1f} s)" \
            if g("incremental/sdp") else ""
        lines.append(f"- On a warm local server (`pipe server start`, {g('server/start'):.1f} s once): the same new file, then "
                     f"{SERVER_LOOP - 1} more one after another, in {g('server-incremental/pipe'):.1f} s (minimum {b('server-incremental/pipe'):.1f} s) against "
                     f"{g('incremental/pipe'):.1f} s with embedded Spark{sdp}; a run with nothing new "
                     f"{g('server-noop/pipe'):.1f} s. The server's own CPU is not in the CPU column of these rows.")
    return "\n".join(lines)


def server_round(rep: int, work: Path, env: dict[str, str], res: Results, revenue_upsert: bool, subreaper: bool) -> None:
    """--server-only: the warm loop alone (`pipe server start`, then the runs of the run section's
    warm local server rows), once with the server's warm-up and once without it (--no-warmup),
    in turns: what the warm-up costs at start and what it saves the first runs."""
    tag = f"[{rep + 1}]"
    logs = work / "logs"
    logs.mkdir(parents=True)
    all_ran = {t: "success" for t in TABLES}
    none_ran = {t: "no_input" for t in TABLES}
    incremental = {"orders": "success", "customers": "no_input", "customer_revenue": "success"}
    for warm in ((True, False) if rep % 2 == 0 else (False, True)):
        kind = "warm" if warm else "nowarm"
        srv_env = {**env, "PIPE_CACHE_DIR": str(work / f"cache-{kind}")}
        shop, _ = prepare(work / kind, srv_env, revenue_upsert, sdp_too=False)

        def pipe(phase: str, expect: dict[str, str]) -> None:
            log = logs / f"{kind}-{phase}-pipe.log"
            r = run_timed([str(BIN / "pipe"), "run"], shop, log, srv_env, subreaper)
            detail, parts = check_pipe(shop, log, r.rc, r.jvm, expect, f"{tag} {kind} {phase} pipe run")
            res.add(f"{kind}:{phase}/pipe", Sample(r.seconds, r.cpu, detail, parts))
            print(f"{tag} {kind:<7} {phase:<19} pipe run           {r.seconds:6.1f} s  {detail}", flush=True)

        started = server_start(shop, srv_env, logs / f"{kind}-server-start.log", subreaper, *(() if warm else ("--no-warmup",)))
        said = re.search(r"in ([\d.]+)s, (?:warmed up in ([\d.]+)s|not warmed up)", (logs / f"{kind}-server-start.log").read_text())
        detail = (f"JVM up in {said.group(1)} s" + (f", warm-up {said.group(2)} s" if said.group(2) else ", no warm-up")) if said else ""
        res.add(f"{kind}:server/start", Sample(started, None, detail))
        print(f"{tag} {kind:<7} {'server':<19} pipe server start  {started:6.1f} s  {detail}", flush=True)
        try:
            pipe("server-first", all_ran)
            for k in range(SERVER_LOOP):
                (shop / f"data/orders/orders-{3 + k:04d}.json").write_text("".join(json.dumps(o) + "\n" for o in NEW_ORDERS))
                pipe("server-incremental", incremental)
            pipe("server-noop", none_ran)
        finally:
            subprocess.run([str(BIN / "pipe"), "server", "stop"], cwd=shop, env=srv_env, capture_output=True)


SERVER_ROWS = [  # key, command
    ("server/start", "`pipe server start` (once)"),
    ("server-first/pipe", "`pipe run` (fresh project, first run on the server)"),
    ("server-incremental/pipe", f"`pipe run`, +1 orders file ({SERVER_LOOP} in a row)"),
    ("server-noop/pipe", "`pipe run`, no new input"),
]


def render_server(res: Results, meta: dict, repeats: int) -> str:
    out = ["## pipe server start: its warm-up, and the runs after it", "",
           "Generated by `python bench/run_bench.py --server-only` — do not edit by hand; run the script again.", "",
           f"- Date: {meta['started']:%Y-%m-%d %H:%M} UTC; {meta['versions']['machine']}",
           f"- {meta['versions']['software']}; pipe {meta['versions']['pipe']}; code hash {meta['code'][0]}",
           f"- {repeats} repetition(s), each in a fresh temporary folder, with and without the warm-up in turns; "
           f"whole bench {meta['wall']:.0f} s",
           f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in meta['load_before'])}, "
           f"after: {' / '.join(f'{x:.2f}' for x in meta['load_after'])}"
           + (" — **the machine was not idle: wall times are inflated and noisy**" if meta["load_before"][0] > 1.5 else ""),
           "- The example project (`pipe init shop`) on a `pipe server` of its own: `pipe server start`, a first `pipe run`, "
           f"{SERVER_LOOP} runs with one new orders file each, a run with nothing new. The warm-up (pipe/warmup.py) is a "
           "small project of pipe's own: a JSON source, a keyed, partitioned Hudi table written twice (inserts, then "
           "upserts into its files), a table reading it with ref(), a test.", "",
           "| server | command | median s | min s | runs s | what it did |", "|---|---|---:|---:|---|---|"]
    for kind, label in (("warm", "warmed up"), ("nowarm", "`--no-warmup`")):
        for key, command in SERVER_ROWS:
            samples = res.samples.get(f"{kind}:{key}")
            if not samples:
                continue
            secs = [x.seconds for x in samples]
            details = collections.Counter(x.detail for x in samples)
            detail = "; ".join(d if n == len(samples) else f"{d} (×{n})" for d, n in details.items())
            out.append(f"| {label} | {command} | {statistics.median(secs):.1f} | {min(secs):.1f} | "
                       f"{', '.join(f'{x:.1f}' for x in secs)} | {detail} |")
    med = {k: statistics.median(x.seconds for x in v) for k, v in res.samples.items()}
    if all(f"{k}:{r}" in med for k in ("warm", "nowarm") for r in ("server/start", "server-first/pipe")):
        cost = med["warm:server/start"] - med["nowarm:server/start"]
        saved = med["nowarm:server-first/pipe"] - med["warm:server-first/pipe"]
        out += ["", f"The warm-up adds {cost:.1f} s to `pipe server start` and takes {saved:.1f} s off the first `pipe run` "
                f"({med['nowarm:server-first/pipe']:.1f} s → {med['warm:server-first/pipe']:.1f} s); start plus first run "
                f"{med['warm:server/start'] + med['warm:server-first/pipe']:.1f} s warmed up against "
                f"{med['nowarm:server/start'] + med['nowarm:server-first/pipe']:.1f} s without. It pays off when the first run "
                "matters more than the start (a server started ahead of the working day); `--no-warmup` is the choice otherwise. "
                "Later runs are the same either way."]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--revenue-operation", choices=("auto", "template", "upsert"), default="auto",
                    help="customer_revenue's operation: the template's (insert_overwrite_table), upsert, or "
                         "auto: the template's when pipe's table engine supports it")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (their paths are printed)")
    ap.add_argument("--no-write", action="store_true", help="print the results; leave bench/RESULTS.md alone")
    ap.add_argument("--server-only", action="store_true",
                    help="only `pipe server start` and the runs on it, with and without its warm-up (section server-start)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    problem = prerequisites()
    if problem:
        print(problem, file=sys.stderr)
        return 2

    if args.revenue_operation == "auto":
        upsert = not _engine_supports("insert_overwrite_table")
    else:
        upsert = args.revenue_operation == "upsert"
    revenue_note = ("run with `operation: upsert` instead of the template's `insert_overwrite_table`, "
                    "which pipe's table engine does not support yet (same rows in this pipeline)" if upsert else
                    "the template's `operation: insert_overwrite_table`")
    print(f"customer_revenue: {revenue_note}", flush=True)

    subreaper = _become_subreaper()
    env = _env()
    started = dt.datetime.now(dt.timezone.utc)
    code_before = _code_hash()
    load_before, cpu_before, own_before = os.getloadavg(), _cpu_machine(), _children_cpu()
    t0 = time.perf_counter()
    res = Results()
    for rep in range(args.repeats):
        work = Path(tempfile.mkdtemp(prefix=f"pipe-run-bench-{rep + 1}-"))
        try:
            (server_round if args.server_only else one_round)(rep, work, env, res, upsert, subreaper)
        except BenchError as e:
            print(f"\nbench failed: {e}\n(folder kept: {work})", file=sys.stderr)
            return 1
        finally:
            _reap(5)
        if args.keep:
            print(f"[{rep + 1}] kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - t0
    cpu_after, own_after = _cpu_machine(), _children_cpu()
    competition = None
    if cpu_before and cpu_after:
        me = resource.getrusage(resource.RUSAGE_SELF)
        busy = cpu_after[0] - cpu_before[0]
        mine = (own_after - own_before) + me.ru_utime + me.ru_stime
        competition = (max(busy - mine, 0.0), cpu_after[1] - cpu_before[1]) if subreaper else None

    meta = dict(started=started, versions=_versions(), wall=wall, load_before=load_before, load_after=os.getloadavg(),
                competition=competition, revenue_note=revenue_note, code=(code_before, _code_hash()))
    if args.server_only:
        section = render_server(res, meta, args.repeats)
        if not args.no_write:
            write_section("server-start", section)
        print("\n" + section)
        return 0
    section, table = render(res, meta, args.repeats)
    if not args.no_write:
        write_section("run", section)
    print()
    print(table)
    print()
    print(_reading({k: statistics.median(s.seconds for s in v) for k, v in res.samples.items()},
                   {k: min(s.seconds for s in v) for k, v in res.samples.items()}))
    print("\n" + "\n".join(l for l in section.splitlines() if l.startswith(("- Load average", "- customer_revenue", "- Outputs", "- **WARNING"))))
    if not args.no_write:
        print(f"\nwritten to {BENCH_DIR / 'RESULTS.md'} (section run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
