#!/usr/bin/env python
"""pipe's table engine against Java Hudi 0.15.0's Spark writer, side by side in one run, on the
same data, the same machine and the same core count (both Spark local[2], the same driver
memory, both JVMs with the G1 collector, Java 17's default), each side with each of its indexes:

  pipe                 pipe's default, the global index (a key unique across the table)
  pipe partition       `index: partition` (a key unique within its partition)
  pipe record          `index: record`: Hudi's record index in the metadata table (global);
                       its tables are loaded by an insert, as pipe refuses a bulk_insert
                       into a table that keeps one (that load is not raced)
  Java                 Java's defaults: the SIMPLE index, the metadata table on
  Java BLOOM           the BLOOM index (footers' bloom filters and key ranges), metadata table on
  Java RECORD_INDEX    the record-level index of the metadata table (global)
  Java GLOBAL_SIMPLE   the global join of every stored key (`--sides` adds it: pipe's old rival)

The cases:

  bulk_insert        N rows into a new copy-on-write table
  upsert 1%          into that table: N/100 changed rows in one of the 10 partitions, then
                     N/100 spread over all 10 partitions
  delete 1%          N/100 keys spread over all partitions
  incremental read   the changes of the table's last commit (a 1% spread upsert), count + sum
  merge-on-read      a 1% spread upsert into a merge-on-read table of N rows (bulk-inserted
                     first, timed too), its snapshot read (count + sum of a column, so
                     every row is merged and produced) and a full scan (an aggregate of
                     every column, so every column is merged too)
  first write        of a small batch (upsert into a new table) in a fresh process: a new
                     `python` for pipe, a new Java Hudi driver (JVM + SparkSession) for Java
                     with its defaults; process start-up included

The targets compare the pairs a user chooses between: pipe's default against Java's defaults,
pipe's partition index against Java's faster partition-scoped index (SIMPLE or BLOOM), and
pipe's global index and its record index each against Java's faster global one (RECORD_INDEX,
or GLOBAL_SIMPLE when run).

The data is generated once, as Parquet files all sides read (`spark.read.parquet` in pipe's
session; the driver's own `spark.read.parquet` on the Java side). pipe runs in this process
(runtime.table.Table on PySpark 4); Java Hudi runs in the long-lived driver of
tests/java_hudi (pyspark 3.5.9 + hudi-spark3.5-bundle_2.12 0.15.0), started once before the
measurements. Each repeat builds its own tables; in each case the sides take turns going first.
The machine's load is recorded through the run, and a run during which other processes took
more than a tenth of the machine is marked as no result. Results go to the `java` section of
bench/RESULTS.md.

    python bench/java_bench.py                      # 5,000,000 rows, 3 repeats
    python bench/java_bench.py --rows 1000000 --section java-1m
    python bench/java_bench.py --rows 100000 --repeats 1 --fresh-repeats 1 --section scratch   # quick
"""

from __future__ import annotations

import argparse
import collections
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
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH_DIR))

from report import Load, Measure, median as _median, tree, write_section  # noqa: E402

MEMORY = "3g"  # both drivers (local mode: the driver's JVM also runs the executors)
BASE_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z in epoch millis
DAY = 86_400_000
KEY, PARTITION, PRECOMBINE = "id", "part", "ts"

# pipe's engine: its defaults for local[2] (spark.sql.shuffle.partitions 4, default.parallelism 2),
# the drivers' memory, and timestamps written as Parquet's TIMESTAMP_MICROS (as the Java driver does)
G1 = "-XX:+UseG1GC"  # Java 17's default collector, on every JVM of the race (the tests' JVMs use the serial one)
PIPE_CONF = {"spark.driver.memory": MEMORY, "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS", "spark.driver.extraJavaOptions": G1}

# the sides: (pipe or Java, the index, extra Java options); --sides picks among them
SIDES = {
    "pipe": ("pipe", "global", {}),
    "pipe partition": ("pipe", "partition", {}),
    # pipe's record index (`index: record`); its tables are loaded by an insert (insert_duplicates:
    # drop), as pipe refuses a bulk_insert into a table that keeps a record index (it would drop it)
    "pipe record": ("pipe", "record", {}),
    "Java": ("Java", "SIMPLE", {}),
    "Java BLOOM": ("Java", "BLOOM", {}),
    "Java RECORD_INDEX": ("Java", "RECORD_INDEX", {"hoodie.metadata.record.index.enable": "true"}),
    "Java GLOBAL_SIMPLE": ("Java", "GLOBAL_SIMPLE", {}),
}
DEFAULT_SIDES = ("pipe", "pipe partition", "pipe record", "Java", "Java BLOOM", "Java RECORD_INDEX")
# (label, pipe's side, Java's sides of which the faster one counts)
PAIRS = (
    ("pipe's default / Java's defaults", "pipe", ("Java",)),
    ("pipe partition / Java's faster partition index", "pipe partition", ("Java", "Java BLOOM")),
    ("pipe's global index / Java's faster global index", "pipe", ("Java RECORD_INDEX", "Java GLOBAL_SIMPLE")),
    ("pipe record / Java's faster global index", "pipe record", ("Java RECORD_INDEX", "Java GLOBAL_SIMPLE")),
)
# sides whose bulk_insert cases are an insert (not raced against a bulk_insert)
LOADED_BY_INSERT = {"pipe record"}


class Runs:
    def __init__(self):
        self.seconds: list[float] = []
        self.cpu: list[float] = []
        self.peak = 0.0

    def add(self, m: Measure) -> None:
        self.seconds.append(m.seconds)
        self.cpu.append(m.cpu)
        self.peak = max(self.peak, m.peak)

    @property
    def median(self) -> float:
        return _median(self.seconds)

    @property
    def median_cpu(self) -> float:
        return _median(self.cpu)


# --- where pipe's time goes: its Spark jobs ------------------------------------------------------

def spark_jobs(spark, after: int = -1) -> list[tuple[int, str, float, float]]:
    """The finished Spark jobs of this session with an id above `after`: (id, call site (the
    line of pipe's code that ran it), start, end) in epoch seconds, from Spark's status store."""
    seq = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    jobs = []
    for k in range(seq.length()):
        j = seq.apply(k)
        sub, end = j.submissionTime(), j.completionTime()
        if j.jobId() > after and sub.isDefined() and end.isDefined():
            jobs.append((j.jobId(), j.name(), sub.get().getTime() / 1000, end.get().getTime() / 1000))
    return sorted(jobs)


def job_profile(jobs, wall: float) -> str:
    """Spark jobs by call site (count, seconds), and the wall time outside any job."""
    by_site: dict[str, list[float]] = {}
    for _, name, start, end in jobs:
        site = name.replace(str(REPO) + "/", "")
        if "withThreadLocalCaptured" in site:
            site = "a broadcast (Spark's BroadcastExchange)"
        elif site.startswith("parquet at "):
            site = "spark.read.parquet of the input (listing, schema)"
        by_site.setdefault(site, []).append(end - start)
    covered, last = 0.0, None
    for _, _, start, end in sorted(jobs, key=lambda j: j[2]):  # the union of the jobs' intervals
        if last is None or start > last:
            covered += end - start
            last = end
        elif end > last:
            covered += end - last
            last = end
    parts = [f"{site if site.startswith(('a ', 'spark.')) else f'`{site}`'}{f' ×{len(d)}' if len(d) > 1 else ''} {sum(d):.2f} s" for site, d in sorted(by_site.items(), key=lambda kv: -sum(kv[1]))]
    return "; ".join(parts) + f"; outside Spark jobs (the driver: planning each job, py4j calls, the timeline, the commit) {max(0.0, wall - covered):.2f} s"


# --- the data --------------------------------------------------------------------------------

def _rows(F, ids, ts_shift: int, label: str):
    """Rows for the keys in `ids` (a one-column DataFrame `id`): 10 partitions (part = id % 10),
    an epoch-millis precombine `ts`, and a few typed columns."""
    i = F.col("id")
    ts = F.lit(BASE_TS + ts_shift) + i
    return ids.select(
        i.alias("id"),
        (i % 10).cast("int").alias("part"),
        ts.alias("ts"),
        F.concat(F.lit(label), F.sha2(i.cast("string"), 256).substr(1, 16)).alias("name"),
        (F.rand(7) * 1000).alias("amount"),
        (i % 97).cast("int").alias("qty"),
        ((i % 100_000) / 100).cast("decimal(12,2)").alias("price"),
        F.timestamp_millis(ts).alias("updated_at"),
    )


def generate(spark, data: Path, rows: int, small: int) -> dict[str, Path]:
    """The Parquet files of every case; returns their folders by name."""
    from pyspark.sql import functions as F

    n = rows // 100
    i = F.col("id")
    sets = {
        # 5,000,000 rows in 2 files (the two input tasks of a bulk_insert on 2 cores)
        "base": (spark.range(0, rows, numPartitions=2), 0, "r-"),
        # 1%, all in partition 3, across its keys (so every file group of it)
        "upsert_partition": (spark.range(n).select((i * 100 + 23).alias("id")), DAY, "p-"),
        # 1% over all 10 partitions (every file group of the table)
        "upsert_spread": (spark.range(n).select((i * 100 + i % 10).alias("id")), 2 * DAY, "s-"),
        # 1% over all 10 partitions, other keys than the upserts'
        "delete": (spark.range(n).select((i * 100 + 10 + i % 10).alias("id")), 3 * DAY, "d-"),
        # 1% over all partitions, into the merge-on-read table
        "mor_upsert": (spark.range(n).select((i * 100 + 30 + i % 10).alias("id")), 4 * DAY, "m-"),
        # a first write: new keys
        "small": (spark.range(small).select((i + rows).alias("id")), 0, "f-"),
    }
    out = {}
    for name, (ids, shift, label) in sets.items():
        path = data / name
        df = _rows(F, ids, shift, label)
        (df if name == "base" else df.coalesce(1)).write.mode("overwrite").parquet(str(path))
        out[name] = path
    return out


# --- the two sides -----------------------------------------------------------------------------

def java_options(table: str, table_type: str, operation: str, index: str, mdt: bool) -> dict[str, str]:
    """Java Hudi's options: the same table definition as pipe's (key, partition, precombine,
    hive-style partition paths, SimpleKeyGenerator), parallelism matched to 2 cores, snappy and
    the same file sizes as pipe (both default to 120 MB files and a 100 MB small-file limit);
    everything else Java's defaults (the row writer for bulk_insert, inline clean and archive)."""
    return {
        "hoodie.table.name": table,
        "hoodie.datasource.write.table.type": table_type,
        "hoodie.datasource.write.operation": operation,
        "hoodie.datasource.write.recordkey.field": KEY,
        "hoodie.datasource.write.partitionpath.field": PARTITION,
        "hoodie.datasource.write.precombine.field": PRECOMBINE,
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
        "hoodie.metadata.enable": str(mdt).lower(),
        "hoodie.index.type": index,
        "hoodie.bulkinsert.shuffle.parallelism": "2",
        "hoodie.insert.shuffle.parallelism": "2",
        "hoodie.upsert.shuffle.parallelism": "2",
        "hoodie.delete.shuffle.parallelism": "2",
        "hoodie.simple.index.parallelism": "2",
        "hoodie.global.simple.index.parallelism": "2",
        "hoodie.parquet.compression.codec": "snappy",
        "hoodie.parquet.max.file.size": str(120 * 1024 * 1024),
        "hoodie.parquet.small.file.limit": str(100 * 1024 * 1024),
    }


def write_commits(table: Path) -> list[str]:
    """The completed commits and deltacommits of a table, oldest first (its timeline's files)."""
    return sorted(p.name.split(".")[0] for p in (table / ".hoodie").iterdir() if p.name.endswith((".commit", ".deltacommit")) and p.name[0].isdigit())


class JavaSide:
    """Java Hudi 0.15.0 through the long-lived driver of tests/java_hudi."""

    def __init__(self, java, work: Path, index: str, mdt: bool, label: str, extra: dict[str, str] | None = None):
        self.java, self.work, self.index, self.mdt, self.label = java, work, index, mdt, label
        self.extra = dict(extra or {})  # more options (the record index's)
        self.views = 0

    def pids(self) -> list[int]:
        return tree([self.java.proc.pid])

    def write(self, table: str, table_type: str, operation: str, source: Path) -> None:
        opts = {**java_options(table, table_type, operation, self.index, self.mdt), **self.extra}
        self.java.call({"op": "write", "path": str(self.work / table), "input": str(source), "options": opts, "mode": "append"})

    def scan(self, table: str, query: str = None, **read) -> tuple[int, float]:
        """The first two values of `query` (QUERY: count and sum(amount)) over a snapshot (or
        incremental, `begin`/`end`) read."""
        self.views += 1
        view = f"bench_{self.views}"
        opts = {"path": str(self.work / table)}
        if "begin" in read:
            opts.update({"hoodie.datasource.query.type": "incremental", "hoodie.datasource.read.begin.instanttime": read["begin"],
                         "hoodie.datasource.read.end.instanttime": read["end"]})
        options = ", ".join(f"`{k}` '{v}'" for k, v in opts.items())
        self.java.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} USING hudi OPTIONS ({options})")
        count, total = self.java.sql((query or QUERY).format(t=view))[0][:2]
        return count, total or 0.0

    def commits(self, table: str) -> list[str]:
        return write_commits(self.work / table)


class PipeSide:
    """pipe's engine (runtime.table.Table) in this process."""

    def __init__(self, spark, work: Path, index: str):
        from runtime.table import TableConfig
        from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ

        self.spark, self.work, self.index = spark, work, index
        record = index == "record"
        self.configs = {t: TableConfig(name="bench", table_type=t, record_key_fields=(KEY,), partition_fields=(PARTITION,), precombine_field=PRECOMBINE,
                                       metadata_table=record, record_index=record)
                        for t in (COPY_ON_WRITE, MERGE_ON_READ)}
        self.types = {"COPY_ON_WRITE": COPY_ON_WRITE, "MERGE_ON_READ": MERGE_ON_READ}
        self.jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()

    def pids(self) -> list[int]:
        # this process (not its other children: the Java driver) and the JVM with its Python workers
        return [os.getpid(), *tree([self.jvm_pid])]

    def table(self, name: str, table_type: str):
        from runtime.table import Table

        return Table.create(self.spark, str(self.work / name), self.configs[self.types[table_type]])

    def write(self, name: str, table_type: str, operation: str, source: Path) -> None:
        options = {"index": self.index}
        if self.index == "record":  # the global index, kept by the table's record index
            options["index"] = "global"
            if operation == "bulk_insert":  # (refused with a record index: SIDES)
                operation, options["insert_duplicates"] = "insert", "drop"
        self.table(name, table_type).write(self.spark.read.parquet(str(source)), operation, **options)

    def scan(self, name: str, query: str = None, **read) -> tuple[int, float]:
        """As pipe run reads a table for a model's SQL: a view with the columns the SQL names
        (runtime/steps/views.py: a merge-on-read table's merge reads only those), then the SQL."""
        from runtime.steps.views import names_used, view_filters
        from runtime.table import Table

        query = query or QUERY
        named = names_used([query.format(t="t")])
        where = view_filters([query.format(t="t")], ["t"]).get("t", ())  # partition pruning, as pipe run's views
        table = Table.open(self.spark, str(self.work / name))
        if "begin" in read:
            df = table.read(since=read["begin"], until=read["end"], meta=False, named=named, where=where)
        else:
            df = table.read(meta=False, named=named, where=where)
        df.createOrReplaceTempView("bench_scan")
        row = self.spark.sql(query.format(t="bench_scan")).first()
        return row[0], row[1] or 0.0

    def commits(self, name: str) -> list[str]:
        return write_commits(self.work / name)


def make_side(who: str, spark, java, work: Path):
    """The side SIDES names `who`, on tables of its own under `work` (Java's with the metadata table on)."""
    kind, index, extra = SIDES[who]
    folder = work / who.lower().replace(" ", "-")
    return PipeSide(spark, folder, index) if kind == "pipe" else JavaSide(java, folder, index, True, who, extra)


FRESH_PIPE = """
import time
marks = [time.time()]
import json, sys
from runtime.spark.session import get_spark
from runtime.table import Table, TableConfig
marks.append(time.time())
src, path, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spark = get_spark("local[2]", conf, app_name="pipe-bench-fresh")
marks.append(time.time())
config = TableConfig(name="bench", record_key_fields=("id",), partition_fields=("part",), precombine_field="ts")
Table.create(spark, path, config).write(spark.read.parquet(src), "upsert")
marks.append(time.time())
seq = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
jobs = [(seq.apply(k).jobId(), seq.apply(k).name(), seq.apply(k).submissionTime().get().getTime() / 1000,
         seq.apply(k).completionTime().get().getTime() / 1000) for k in range(seq.length())]
spark.stop()
marks.append(time.time())
print(json.dumps([marks, [j for j in jobs if j[2] >= marks[2]]]))
"""
# the phases of a fresh process, by side
PHASES = {
    "pipe": ("python start", "imports (runtime.spark.session, runtime.table)", "Spark start (get_spark)", "the write", "Spark stop", "exit"),
    "Java": ("driver start (python, JVM, SparkSession, Hudi bundle)", "the write", "quit and exit"),
}


# --- the run -------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--small", type=int, default=1000, help="rows of the first write in a fresh process")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fresh-repeats", type=int, default=3)
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES), help=f"the sides, of: {', '.join(SIDES)}")
    ap.add_argument("--section", default="java")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    chosen = [w.strip() for w in args.sides.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in SIDES]
    if unknown or "pipe" not in chosen or "Java" not in chosen:
        ap.error(f"--sides: {', '.join(unknown) or 'pipe and Java are needed'}; the sides are: {', '.join(SIDES)}")

    os.environ.setdefault("JAVA_HUDI_MEMORY", MEMORY)
    from tests.java_hudi.client import JavaHudi
    from tests.java_hudi.env import HUDI_015, ensure

    from runtime.spark.session import get_spark

    ensure((HUDI_015,))
    load = Load(every=5.0)
    load.start()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pipe-java-bench-"))
    # this process's own session, alive through the whole run, neither writes nor waits for the
    # class archive: the fresh processes below make and map it, as a user's runs do
    os.environ["PIPE_JVM_CACHE"] = "off"
    spark = get_spark("local[2]", PIPE_CONF, app_name="pipe-bench")
    java = None
    results: dict[tuple[str, str], Runs] = {}
    checks: dict[tuple[str, str], list] = collections.defaultdict(list)
    phases: dict[str, list[list[float]]] = collections.defaultdict(list)
    profiles: dict[str, str] = {}  # pipe's Spark jobs in the last run of each case
    done = 0
    try:
        t0 = time.perf_counter()
        data = generate(spark, work / "data", args.rows, args.small)
        gen_seconds = time.perf_counter() - t0
        java = JavaHudi(HUDI_015, work / "java-driver", jvm_options=G1)
        sides = [(who, make_side(who, spark, java, work)) for who in chosen]

        def measure(case: str, who: str, side, fn):
            last_job = spark_jobs(spark)[-1][0] if who == "pipe" and spark_jobs(spark) else -1
            with Measure(side.pids) as m:
                out = fn()
            results.setdefault((case, who), Runs()).add(m)
            if who == "pipe":
                profiles[case] = job_profile(spark_jobs(spark, last_job), m.seconds)
            print(f"  {case:<40} {who:<20} {m.seconds:7.2f} s  cpu {m.cpu:6.1f} s  peak {m.peak:6.0f} MB", flush=True)
            return out

        # warm-up, not reported: each side's first write and read pays JIT and class loading
        for who, side in sides:
            for table_type in ("COPY_ON_WRITE", "MERGE_ON_READ"):
                side.write(f"warm-{table_type}", table_type, "bulk_insert", data["small"])
                side.write(f"warm-{table_type}", table_type, "upsert", data["small"])
                side.write(f"warm-{table_type}", table_type, "delete", data["small"])
                side.scan(f"warm-{table_type}")

        cow, mor = "COPY_ON_WRITE", "MERGE_ON_READ"
        fresh_case = "first write of a small batch, fresh process"
        # the first write of a small batch in a fresh process, process start-up included: each side's defaults
        env = {**os.environ, "PIPE_JVM_CACHE": "on", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        # a machine's first pipe session writes the class archive every later one maps
        # (runtime/spark/class_archive.py): made here, outside the measurements, as a user's first run would
        subprocess.run([sys.executable, "-c", FRESH_PIPE, str(data["small"]), str(work / "pipe" / "fresh-archive"), json.dumps(PIPE_CONF)],
                       cwd=REPO, env=env, capture_output=True, text=True, check=True)
        for r in range(args.fresh_repeats):
            for who in (("pipe", "Java") if r % 2 == 0 else ("Java", "pipe")):
                if who == "pipe":
                    target = work / "pipe" / f"fresh{r}"
                    proc: list = []

                    def run_pipe():
                        t0 = time.time()
                        p = subprocess.Popen([sys.executable, "-c", FRESH_PIPE, str(data["small"]), str(target), json.dumps(PIPE_CONF)],
                                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                        proc.append(p)
                        out, err = p.communicate()
                        t1 = time.time()
                        if p.returncode:
                            raise RuntimeError(f"pipe's fresh write failed:\n{err[-3000:]}")
                        marks, jobs = json.loads(out.strip().splitlines()[-1])
                        marks = [t0, *marks, t1]
                        phases["pipe"].append([b - a for a, b in zip(marks, marks[1:])])
                        profiles[fresh_case] = job_profile(jobs, marks[4] - marks[3])

                    with Measure(lambda: tree([p.pid for p in proc if p.poll() is None])) as meas:
                        run_pipe()
                else:
                    holder: list = []

                    def run_java():
                        marks = [time.time()]
                        j = JavaHudi.__new__(JavaHudi)
                        holder.append(j)
                        JavaHudi.__init__(j, HUDI_015, work / f"java-fresh-{r}", jvm_options=G1)
                        marks.append(time.time())
                        JavaSide(j, work / "java-fresh", "SIMPLE", True, "Java").write(f"fresh{r}", cow, "upsert", data["small"])
                        marks.append(time.time())
                        j.close()
                        marks.append(time.time())
                        phases["Java"].append([b - a for a, b in zip(marks, marks[1:])])

                    with Measure(lambda: tree([j.proc.pid for j in holder if getattr(j, "proc", None) and j.proc.poll() is None])) as meas:
                        run_java()
                results.setdefault((fresh_case, who), Runs()).add(meas)
                print(f"  fresh process                            {who:<20} {meas.seconds:7.2f} s  peak {meas.peak:6.0f} MB", flush=True)
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            order = sides[r % len(sides):] + sides[:r % len(sides)]  # who goes first turns
            t, m = f"cow{r}", f"mor{r}"
            steps = [
                ("bulk_insert", lambda s: s.write(t, cow, "bulk_insert", data["base"])),
                ("upsert 1% in 1 partition", lambda s: s.write(t, cow, "upsert", data["upsert_partition"])),
                ("delete 1%", lambda s: s.write(t, cow, "delete", data["delete"])),
                ("upsert 1% spread", lambda s: s.write(t, cow, "upsert", data["upsert_spread"])),
            ]
            for case, fn in steps:
                for who, side in order:
                    measure(case, who, side, lambda: fn(side))
            for who, side in order:
                before, last = side.commits(t)[-2:]
                checks[("incremental read", who)].append(measure("incremental read (last commit)", who, side,
                                                                 lambda: side.scan(t, begin=before, end=last)))
            for who, side in order:
                checks[("snapshot read", who)].append(measure("snapshot read (copy-on-write)", who, side, lambda: side.scan(t)))
            for who, side in order:
                measure("bulk_insert (merge-on-read)", who, side, lambda: side.write(m, mor, "bulk_insert", data["base"]))
            for who, side in order:
                measure("merge-on-read upsert 1%", who, side, lambda: side.write(m, mor, "upsert", data["mor_upsert"]))
            for who, side in order:
                checks[("merge-on-read snapshot read", who)].append(measure("merge-on-read snapshot read", who, side, lambda: side.scan(m)))
            for who, side in order:
                checks[("merge-on-read full scan", who)].append(measure("merge-on-read full scan (every column)", who, side,
                                                                        lambda: side.scan(m, FULL_QUERY)))
            for who, side in order:
                checks[("merge-on-read read of one partition", who)].append(measure("merge-on-read read of one partition", who, side,
                                                                                    lambda: side.scan(m, PART_QUERY)))
            done = r + 1
            # the section after every repeat: a run cut short still leaves what it measured
            report(args, results, checks, phases, profiles, chosen, gen_seconds, time.perf_counter() - started, load, done)

    finally:
        if java is not None:
            java.close()
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    load.stop()
    report(args, results, checks, phases, profiles, chosen, gen_seconds, time.perf_counter() - started, load, done, final=True)


# The reads' SQL, over a view `{t}` of the table: every side runs the same. QUERY needs two columns
# (a reader that prunes reads only them and the merge's key and ordering fields); FULL_QUERY needs
# every column, so each is read and merged.
QUERY = "SELECT count(*), sum(amount) FROM {t}"
FULL_QUERY = ("SELECT count(*), sum(amount), sum(id), sum(part), sum(ts), max(name), sum(qty), sum(price), max(updated_at) FROM {t}")
PART_QUERY = "SELECT count(*), sum(amount) FROM {t} WHERE part = 3"  # one partition of ten: a reader that prunes partitions reads one

# why pipe is slower than Java in a case, as the profiles of the runs show (bench/RESULTS.md)
WHY = {
    "first write of a small batch, fresh process": (
        "the start-up. pipe's process starts PySpark 4 (`get_spark`: the JVM, the SparkContext, the session) and then runs its write as several "
        "small Spark jobs in a cold JVM (the batch's size and null checks, the index lookup, the file-group summary, the write); the write's job "
        "starts the Python workers (mapInArrow), each importing pyarrow and pipe's runtime before it encodes a row. Java's driver starts Spark 3.5 "
        "with the Hudi bundle and writes inside the JVM, with no Python worker to start."),
    "merge-on-read snapshot read": (
        "the merge of base and log files runs in Python workers (mapInArrow, one task per core over the file slices: pyarrow reads each "
        "base file and its log files and merges them by key); pipe's view reads and merges only the column the SQL names (amount) with the "
        "key and precombine field, as Java's relation does (`MergeOnReadSnapshotRelation`, `ReadSchema: struct<amount:double>`), and hands "
        "Spark only that column, but its rows still cross from the Python workers to the JVM as Arrow batches, and each Python task costs "
        "50 to 100 ms to start, where Java's merge runs inside the JVM on Spark's vectorized Parquet reader."),
    "merge-on-read full scan (every column)": (
        "every column of every row is read by pyarrow in the Python workers, merged, and handed to the JVM as Arrow batches, which Spark "
        "converts to its rows; Java reads the base files with Spark's vectorized Parquet reader and merges the log records in the JVM."),
    "upsert 1% in 1 partition": (
        "pipe's default index is global, and the keys' text gives every file a key range that spans the batch's: one Spark job asks the "
        "files' bloom filters whether a key going to partition 3 may be in another partition's file, and reads the key column of any file "
        "whose filter says yes (numbers as keys give false positives far above the nominal rate); when none can, partition tasks decide "
        "the batch as with `index: partition` (writer._keys_stay_put, docs/tables.md). `pipe record` keeps Hudi's record index instead: "
        "its lookup (a shuffle by index file group, then a Python stage reading HFile blocks) also shows that no key leaves its "
        "partition, so the same partition tasks decide the batch, reading only the groups the index named, and return the keys they "
        "insert and delete; the index's new log files are one more Spark job, and the metadata table's deltacommit follows."),
    "merge-on-read upsert 1%": (
        "as for the upsert in one partition: with the global index the batch's ten partitions' key ranges meet, so the bloom filters' job "
        "first shuffles the keys by key (a key coming in two partitions would show), and the logs the table's slices have took no new key "
        "(their deltacommits' write stats), so partition tasks decide the batch, each merging its partition's slices; `pipe record` pays "
        "its record index's two jobs (the lookup, which also shows that no key moves, and the index's new log files) around the same "
        "partition tasks."),
    "merge-on-read read of one partition": (
        "a short read's fixed costs: both sides read one partition of ten (pipe's view prunes the others by the SQL's `part = 3`, "
        "runtime/table/partition_pruning.py); pipe then loads the timeline and the listing in Python and starts a Python task per "
        "group of slices with logs, where Java's relation plans and merges inside the JVM; the merge of 100,000 rows itself is small."),
    "snapshot read (copy-on-write)": (
        "a short read's fixed costs: pipe loads the timeline and the file listing in Python, then hands Spark the base files to scan; Java does "
        "the same in the JVM. The scan itself is Spark's Parquet reader on both sides."),
    "incremental read (last commit)": (
        "a short read's fixed costs: pipe loads the timeline and the commit's write stats in Python, then Spark scans the files the commit "
        "wrote and keeps its rows."),
}

TARGETS = {"bulk_insert": 1.0, "upsert 1% in 1 partition": 0.5, "upsert 1% spread": 0.5, "delete 1%": 0.5, "merge-on-read upsert 1%": 0.5}
READ_TARGET = 1.0  # every read: at most Java's time


def target_of(case: str) -> float | None:
    return TARGETS.get(case, READ_TARGET if "read" in case else None)


def pair_ratio(results, case: str, pipe_side: str, java_sides) -> tuple[float, str] | None:
    """pipe's median over the faster of `java_sides` (those run) in `case`, and which it was."""
    if (case, pipe_side) not in results:
        return None
    java = [(results[(case, j)].median, j) for j in java_sides if (case, j) in results]
    if not java:
        return None
    best, who = min(java)
    return results[(case, pipe_side)].median / best, who


def report(args, results, checks, phases, profiles, whos, gen_seconds, whole, load, done: int, final: bool = False) -> None:
    cases = sorted(dict.fromkeys(case for case, _ in results), key=lambda c: c.startswith("first write"))  # the fresh process last
    cores = os.cpu_count() or 1
    after = getattr(load, "after", None) or os.getloadavg()
    loads = load.loads or [after[0]]
    busy = load.others > 0.1 * whole * cores
    lines = [
        "## pipe against Java Hudi 0.15.0, each with its indexes: bulk_insert, upserts, delete, merge-on-read, reads, a fresh process"
        + ("" if args.rows == 5_000_000 else f" ({args.rows:,} rows)"),
        "",
        f"Generated by `python bench/java_bench.py --rows {args.rows} --repeats {args.repeats}"
        + (f" --sides '{args.sides}'" if args.sides != ",".join(DEFAULT_SIDES) else "")
        + (f" --fresh-repeats {args.fresh_repeats}" if args.fresh_repeats != 3 else "")
        + f" --section {args.section}` — do not edit by hand; "
        "run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {cores} cores; Python {platform.python_version()}; whole run {whole:.0f} s "
        f"(data generated in {gen_seconds:.0f} s)",
        f"- Load: 1-minute load average {min(loads):.1f}–{max(loads):.1f} during the run (before: {' / '.join(f'{x:.2f}' for x in load.before)}); "
        f"other processes took {load.others:.0f} CPU s, steal {load.steal:.0f} s"
        + (" — **other processes took more than a tenth of the machine: this run is not a result**" if busy else ""),
        f"- **{args.rows:,} rows** (id bigint key, part int = id % 10: 10 partitions, ts bigint epoch millis as precombine, name string, amount double, "
        "qty int, price decimal(12,2), updated_at timestamp), generated once as Parquet files that every side reads",
        "- pipe: runtime.table.Table on PySpark 4 in the benchmark's process, Spark local[2] with pipe's defaults for it (4 shuffle partitions), "
        f"driver memory {MEMORY}, G1; snappy, 120 MB files. *pipe*: its default, the global index; *pipe partition*: `index: partition`; "
        "*pipe record*: `index: record` (Hudi's record index in the metadata table, kept in step by every write; its tables are loaded by an "
        "`insert` with `insert_duplicates: drop`, as pipe refuses a `bulk_insert` into a table with a record index: its bulk_insert times "
        "are that insert's, and not raced)",
        f"- Java: Hudi 0.15.0 (hudi-spark3.5-bundle_2.12) on pyspark 3.5.9, Spark local[2], driver memory {MEMORY}, G1, one long-lived driver "
        "(tests/java_hudi/driver.py) started before the measurements, its tables apart per side; the metadata table on (`hoodie.metadata.enable=true`, "
        "Java's default) on every side; shuffle and index parallelism 2, snappy, 120 MB files and a 100 MB small-file limit (pipe's too), "
        "SimpleKeyGenerator, hive-style partitions, Java's defaults otherwise. *Java*: its default index, SIMPLE; *Java BLOOM*: BLOOM; "
        "*Java RECORD_INDEX*: RECORD_INDEX with `hoodie.metadata.record.index.enable=true`; *Java GLOBAL_SIMPLE*: GLOBAL_SIMPLE",
        f"- Sides: {', '.join(whos)}",
        *([] if final else [f"- **Partial: written after repeat {done} of {args.repeats}; the run did not finish.**"]),
        f"- Each repeat ({done}) writes its own tables per side: bulk_insert, upsert 1% in partition 3 (every file group of it), delete 1%, "
        "upsert 1% spread (every file group of the table), the incremental read of that last commit; then a merge-on-read table: bulk_insert, upsert "
        "1% spread, snapshot read, full scan, read of one partition. The sides take turns going first. Reads are SQL over a view of the table made inside the timing "
        "(Java: a temporary view `USING hudi`; pipe: `Table.read` with the names and partition conditions the SQL uses, as `pipe run` reads a model's inputs): "
        f"`{QUERY.format(t='t')}` (every row produced, two columns needed), for the full scan `{FULL_QUERY.format(t='t')}` (every column needed), and for the read of one partition `{PART_QUERY.format(t='t')}` (pipe's view prunes the partitions by the condition, as `pipe run` does; Java's file index prunes them too).",
        f"- First write in a fresh process ({args.fresh_repeats} runs, pipe and Java with their defaults): an upsert of {args.small:,} rows into a new "
        "table; pipe: a new `python` (imports, Spark start, write, Spark stop), after one unmeasured session that wrote the Spark driver's class "
        "archive (runtime/spark/class_archive.py: a machine's first pipe session does, once); Java: a new driver (python, JVM, SparkSession with the Hudi bundle), "
        "the write, quit.",
        "- Peak RSS: the process tree of each side (pipe: this process, its JVM and the JVM's Python workers; Java: the driver and its JVM), sampled "
        "every 100 ms; a JVM keeps the heap it grew, so later cases carry earlier peaks. CPU: user + system seconds of the same tree. "
        "Ratios are of medians; a pair's Java side is the faster of the indexes named.",
        "",
        "Wall time, median seconds (and the ratios of the pairs a user chooses between; target: at most 0.5x for upserts and deletes, at most "
        "1.0x for bulk_insert and reads):",
        "",
        "| case | " + " | ".join(whos) + " | " + " | ".join(label for label, _, _ in PAIRS) + " |",
        "|---|" + "---:|" * len(whos) + "---:|" * len(PAIRS),
    ]
    verdicts = []
    for case in cases:
        cells = [f"{results[(case, w)].median:.2f}" if (case, w) in results else "" for w in whos]
        target = target_of(case)
        ratios = []
        for label, pipe_side, java_sides in PAIRS:
            got = None if pipe_side in LOADED_BY_INSERT and case.startswith("bulk_insert") else pair_ratio(results, case, pipe_side, java_sides)
            if got is None:
                ratios.append("")
                continue
            ratio, against = got
            mark = "" if target is None else (" ✓" if ratio <= target else " ✗")
            ratios.append(f"**{ratio:.2f}**{mark} ({against})" if len(java_sides) > 1 else f"**{ratio:.2f}**{mark}")
            if target is not None:
                verdicts.append((case, label, ratio, target, against))
        lines.append(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    lines += ["", "Each run, seconds; CPU seconds (median); peak RSS MB:", "", "| case | side | runs s | CPU s | peak MB |", "|---|---|---|---:|---:|"]
    for case in cases:
        for w in whos:
            r = results.get((case, w))
            if r:
                lines.append(f"| {case} | {w} | {', '.join(f'{x:.1f}' for x in r.seconds)} | {r.median_cpu:.1f} | {r.peak:.0f} |")
    missed = [v for v in verdicts if v[2] > v[3]]
    lines += ["", f"Against the targets: {len(verdicts) - len(missed)} of {len(verdicts)} pairs met." + (" Missed:" if missed else ""), ""]
    for case, label, ratio, target, against in missed:
        lines.append(f"- **{case}**, {label} ({against}): **{ratio:.2f}x** against ≤ {target:.1f}x")
    slow_cases = sorted({case for case, *_ in missed} | {case for case in cases if (case, "pipe") in results and (case, "Java") in results
                                                          and results[(case, "pipe")].median > results[(case, "Java")].median})
    lines += ["", "Where pipe misses a target, or is slower than Java's defaults, and why (pipe's Spark jobs in the last run, by the line of "
              "pipe's code that ran them, from Spark's status store; the rest of the wall time is the driver's own work):", ""]
    if not slow_cases:
        lines.append("- nowhere in this run")
    for case in slow_cases:
        lines.append(f"- **{case}**: {WHY.get(case, 'no profile-based explanation recorded yet for this case')}")
        if case.startswith("first write"):
            for who, runs in phases.items():
                lines.append(f"  - {who}, phases (median s): " + "; ".join(f"{name} {_median([r[k] for r in runs]):.2f}" for k, name in enumerate(PHASES[who])))
            lines.append(f"  - pipe's write in it, by Spark job (last run): {profiles.get(case, '')}")
        elif case in profiles:
            lines.append(f"  - pipe, by Spark job (last run): {profiles[case]}")
    lines += ["", "Checks (the same answers on every side and in every repeat):"]
    for what in sorted({what for what, _ in checks}):
        answers = {(c, round(s, 2)) for (w, _), values in checks.items() if w == what for c, s in values}
        first = next(values for (w, _), values in checks.items() if w == what)
        c, s = first[0]
        lines.append(f"- {what}: {c:,} rows, sum(amount) {s:,.2f}" + ("" if len(answers) == 1 else " — **the sides or repeats differ!**"))
    write_section(args.section, "\n".join(lines))
    if final:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
