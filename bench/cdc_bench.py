#!/usr/bin/env python
"""Debezium change events from PostgreSQL into an upsert table: `pipe run` against what a Hudi
user writes for the same job, side by side in one run, on the same broker data, the same cores
(both Spark local[2]) and the same driver memory (issue 40, item 8).

The data: real Debezium. PostgreSQL (tests/postgres/env.py) gets a table of about N/2 rows
(bigint id, text with accents and quotes, numeric(12,2), timestamptz, a nullable text); its
topic is made with 12 partitions before Debezium's connector starts (tests/kafka/connect.py), so
the rows arrive as snapshot events (`op: r`); then one UPDATE of every row (in transactions of
50,000 rows) and a delete of 1% of the rows are streamed (`u`, `d`, each delete followed by
Debezium's tombstone). About N messages in all (`--events`, 1,000,000 by default). Once
Debezium has caught up, the database's expected answer is taken (count, sums and a checksum of
ids and amounts), and Kafka Connect and PostgreSQL are stopped: the measured runs share the
machine with the broker only.

The two sides, each a fresh process per run, reading the same topic from offset 0 to its end:

  pipe       `python -m pipe --project-dir P run` of a project written into a temp folder: a
             `kind: kafka` source with `format: debezium` and a copy-on-write table keyed by id
             with `precombine: _cdc_position` (docs/sources.md "Debezium change events"); the
             target's Spark master local[2]. Also `pipe run` again with nothing new (its no-input
             cost).
  Hudi       a PySpark 3.5 batch job (the venv of tests/java_hudi/env.py, pyspark 3.5.9, Hudi's
             hudi-spark3.5-bundle_2.12 1.1.1, Spark's Kafka source spark-sql-kafka-0-10_2.12
             3.5.1): reads the offset range (startingOffsets/endingOffsets JSON), parses the
             Debezium envelope with from_json, takes `after` (`before` for a delete), orders by
             source.lsn (the precombine), and upserts with Hudi's Spark datasource (copy-on-write,
             record key id, `_hoodie_is_deleted` for deletes); once with the metadata table at
             Hudi's default (on), once with it off. Hudi Streamer would be the obvious baseline,
             but hudi-utilities(-slim)-bundle is not served by this machine's Maven mirror.

And the floor of any reader: the same range read and counted with nothing decoded or written,
by Kafka's C client in 2 processes (`read-c`, pipe's client) and by Spark 3.5's Kafka source in
local[2] (`read-spark`, the Hudi job's), each a fresh process.

After every run both tables are read back with hudi-rs (the `hudi` package) and compared with
the database: row count, sum of ids, sum of amounts, a checksum of (id, amount) pairs, the
characters of the names and the non-null notes. Each repeat makes fresh tables; the sides take
turns going first. Wall time, CPU seconds of the whole process tree (bench/report.py run_timed,
in a child process that is the subreaper of the measured command only), peak RSS of that tree,
the machine's load before and during each run and the CPU other processes took meanwhile, and
the broker's CPU. Results: the `cdc` section of bench/RESULTS.md.

    python bench/cdc_bench.py                          # 1,000,000 events, 2 repeats
    python bench/cdc_bench.py --events 20000 --repeats 1 --no-write   # a smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from report import Load, Measure, become_subreaper, cpu_of, median, run_timed, tree, write_section  # noqa: E402

CORES = 2
MASTER = f"local[{CORES}]"
MEMORY = "3g"  # both drivers (local mode: the driver's JVM also runs the executors), as bench/java_bench.py
PARTITIONS = 12
KAFKA_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.1"
SERIAL_GC = "-XX:+UseSerialGC"  # tests/jvm_options.py; both sides' JVMs, through SPARK_SUBMIT_OPTS
UPDATE_BATCH = 50_000
DELETE_EVERY = 100  # 1% of the rows are deleted
CHECK_MOD = 1_000_000_007
NAMES = ["Zoë", "O'Brien \"Bikes\"", "Łódź – market", "François d'Aubigné", "plain", "naïve café", "Søren", "Ünal \\ back"]

# Spark settings of both sides (pipe's own for local[2], given to the Hudi job too)
SPARK_COMMON = {
    "spark.driver.memory": MEMORY,
    "spark.sql.shuffle.partitions": str(CORES * 2),
    "spark.default.parallelism": str(CORES),
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
}
# what Hudi's quick start adds for its Spark datasource
SPARK_HUDI = {
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    "spark.kryo.registrator": "org.apache.spark.HoodieSparkKryoRegistrar",
    "spark.sql.extensions": "org.apache.spark.sql.hudi.HoodieSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.hudi.catalog.HoodieCatalog",
}


def hudi_options(mdt: bool) -> dict[str, str]:
    """The Hudi job's write options: everything else is Hudi 1.1.1's default (index SIMPLE,
    parallelism inferred, inline clean and archive, the embedded timeline server, table version 9)."""
    return {
        "hoodie.table.name": "accounts",
        "hoodie.datasource.write.table.type": "COPY_ON_WRITE",
        "hoodie.datasource.write.operation": "upsert",
        "hoodie.datasource.write.recordkey.field": "id",
        "hoodie.datasource.write.partitionpath.field": "",
        "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.NonpartitionedKeyGenerator",
        "hoodie.datasource.write.precombine.field": "_lsn",
        "hoodie.metadata.enable": str(mdt).lower(),
    }


# The Hudi side: a PySpark 3.5 job as a Hudi user writes it. Run by .java-hudi/venv-spark3.5's python.
HUDI_JOB = r'''
"""Debezium JSON (Kafka Connect JsonConverter, schemas on) from a Kafka offset range, upserted
into a Hudi table with Hudi's Spark datasource. argv[1]: a JSON file of the job's settings."""
import json
import sys
import time

from pyspark.sql import SparkSession, functions as F, types as T

job = json.load(open(sys.argv[1]))
builder = SparkSession.builder.master(job["master"]).appName("hudi-cdc-job")
for key, value in job["spark"].items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("WARN")
if job.get("resolve_only"):  # the jars spark.jars.packages resolved, for the measured runs
    print("JARS " + spark.sparkContext.getConf().get("spark.jars", ""))
    spark.stop()
    sys.exit(0)

if job.get("check"):  # count and checksums of a Hudi table (when hudi-rs cannot read it)
    df = spark.read.format("hudi").load(job["check"])
    cents = (F.col("amount") * 100).cast("long")
    row = df.agg(F.count(F.lit(1)), F.sum("id"), F.sum(cents),
                 F.sum(F.pmod(F.col("id") * 7919 + cents, F.lit(job["mod"]))), F.sum(F.length("name")), F.count("note")).first()
    print("CHECK " + json.dumps([int(v or 0) for v in row]))
    spark.stop()
    sys.exit(0)

if job.get("read_only"):  # the topic's range read by Spark's Kafka source and nothing else: its floor
    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", job["bootstrap"]).option("subscribe", job["topic"])
           .option("startingOffsets", json.dumps(job["starting"])).option("endingOffsets", json.dumps(job["ending"])).load())
    t0 = time.time()
    print("READ " + json.dumps(raw.agg(F.count(F.lit(1)), F.sum(F.length("value"))).first()[0]))
    print("WRITE_S %.3f" % (time.time() - t0))
    spark.stop()
    sys.exit(0)

row = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType()),
                    T.StructField("amount", T.StringType()),  # Connect Decimal: base64 of the unscaled two's complement
                    T.StructField("updated_at", T.StringType()),  # io.debezium.time.ZonedTimestamp, ISO 8601 UTC
                    T.StructField("note", T.StringType())])
envelope = T.StructType([T.StructField("payload", T.StructType([
    T.StructField("before", row), T.StructField("after", row),
    T.StructField("source", T.StructType([T.StructField("lsn", T.LongType())])),
    T.StructField("op", T.StringType()), T.StructField("ts_ms", T.LongType())]))])


def decimal_2(col):
    """A Connect Decimal of scale 2 (base64 big-endian two's complement) as decimal(12,2)."""
    h = F.hex(F.unbase64(col))
    unsigned = F.conv(h, 16, 10).cast("decimal(38,0)")
    signed = F.when(F.substring(h, 1, 1) >= F.lit("8"), unsigned - F.pow(F.lit(2), F.length(h) * 4).cast("decimal(38,0)")).otherwise(unsigned)
    return (signed / 100).cast("decimal(12,2)")


raw = (spark.read.format("kafka")
       .option("kafka.bootstrap.servers", job["bootstrap"])
       .option("subscribe", job["topic"])
       .option("startingOffsets", json.dumps(job["starting"]))
       .option("endingOffsets", json.dumps(job["ending"]))
       .load())
events = (raw.where(F.col("value").isNotNull())  # Debezium's tombstone after a delete
          .select(F.from_json(F.col("value").cast("string"), envelope)["payload"].alias("e"))
          .select("e.*"))
deleted = F.col("op") == "d"
image = F.when(deleted, F.col("before")).otherwise(F.col("after"))
rows = events.select(
    image["id"].alias("id"),
    image["name"].alias("name"),
    decimal_2(image["amount"]).alias("amount"),
    image["updated_at"].cast("timestamp").alias("updated_at"),
    image["note"].alias("note"),
    # the change's place in the log: source.lsn; at one LSN a snapshot read (op r) before a change
    (F.col("source.lsn") * 2 + F.when(F.col("op") == "r", 0).otherwise(1)).alias("_lsn"),
    deleted.alias("_hoodie_is_deleted"),
)
t0 = time.time()
rows.write.format("hudi").options(**job["hudi"]).mode("append").save(job["path"])
print("WRITE_S %.3f" % (time.time() - t0))
spark.stop()
'''


# The topic's range read with Kafka's C client (confluent-kafka, pipe's reader) and nothing else, by
# as many processes as cores, each a share of the partitions: the floor of any reader here.
C_READ = r'''
import json, sys
from multiprocessing import Pool

from confluent_kafka import Consumer, KafkaError, TopicPartition

job = json.load(open(sys.argv[1]))


def read(parts):
    c = Consumer({"bootstrap.servers": job["bootstrap"], "group.id": "cdc-bench-read", "enable.auto.commit": "false",
                  "enable.partition.eof": "true", "isolation.level": "read_committed"})
    n = 0
    for p in parts:
        lo, hi = job["starting"][job["topic"]][p], job["ending"][job["topic"]][p]
        if hi <= lo:
            continue
        c.assign([TopicPartition(job["topic"], int(p), lo)])
        done = False
        while not done:
            for m in c.consume(min(10000, hi - lo), 1.0):
                if m.error() is not None:  # the end of what is readable (the last offsets may be transaction markers)
                    done = m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= hi
                    if done:
                        break
                    continue
                n += 1
                m.value()
                done = m.offset() >= hi - 1
                if done:
                    break
    c.close()
    return n


if __name__ == "__main__":
    parts = sorted(job["ending"][job["topic"]], key=int)
    with Pool(job["cores"]) as pool:
        print("READ " + json.dumps(sum(pool.map(read, [parts[i::job["cores"]] for i in range(job["cores"])]))))
'''


# --- the measurement, in a child process that is the subreaper of the measured command only ------

def measure_child(spec_file: str) -> None:
    """`--_measure SPEC`: runs the command of SPEC (cmd, cwd, log) under run_timed as this
    process's only child, with its tree's peak RSS; prints the result as JSON. (The bench's own
    process has the broker as a child, which run_timed's reaping would kill.)"""
    spec = json.loads(Path(spec_file).read_text())
    if not become_subreaper():
        raise SystemExit("this bench counts the CPU of the JVMs it starts, which needs Linux (PR_SET_CHILD_SUBREAPER)")
    me = os.getpid()
    meter = Measure(lambda: [p for p in tree([me]) if p != me])
    meter.interval = 0.5  # a walk of /proc per sample: keep it cheap on 2 cores
    with meter:
        ran = run_timed(spec["cmd"], Path(spec["cwd"]), Path(spec["log"]), dict(os.environ), counts_cpu=True)
    print(json.dumps({"rc": ran.rc, "seconds": ran.seconds, "cpu": ran.cpu, "peak_mb": meter.peak, "jvm": ran.jvm}))


def logged(log: Path, tag: str, cast):
    """The value a job printed as `TAG value` in its log, or None."""
    return next((cast(line.split()[1]) for line in log.read_text(errors="replace").splitlines() if line.startswith(tag + " ")), None)


class Bench:
    def __init__(self, args, work: Path):
        self.args, self.work = args, work
        self.broker = None
        self.runs: list[dict] = []

    # --- the data ---------------------------------------------------------------------------

    def prepare(self) -> None:
        from tests.kafka.connect import DebeziumConnect
        from tests.kafka.env import KafkaBroker
        from tests.postgres.env import PostgresServer
        from tests.postgres.env import version as pg_version

        args, work = self.args, self.work
        t0 = time.perf_counter()
        self.broker = KafkaBroker(work / "kafka")
        postgres = PostgresServer(work / "postgres")
        connect = None
        try:
            self.pg_version = pg_version()
            postgres.create_database("bench")
            rows = round(args.events / (2 + 2 / DELETE_EVERY))  # r + u per row, d + tombstone per deleted row
            names = "ARRAY[" + ", ".join("'" + n.replace("'", "''") + "'" for n in NAMES) + "]"
            postgres.execute(f"""
                CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2) NOT NULL,
                                       updated_at timestamptz NOT NULL, note text);
                INSERT INTO accounts
                SELECT i, ({names})[1 + i % {len(NAMES)}] || ' #' || i,
                       ((i::bigint * 7919) % 2000001 - 1000000) / 100.0,
                       timestamptz '2025-01-01 00:00:00+00' + i * interval '1 second' + (i % 997) * interval '1 microsecond',
                       CASE WHEN i % 5 = 0 THEN NULL ELSE 'note «' || i || '»' END
                FROM generate_series(1, {rows}) i;
            """, database="bench")
            self.prefix = f"pg{secrets.token_hex(3)}"
            self.topic = f"{self.prefix}.public.accounts"
            self.broker.create_topic(self.topic, partitions=PARTITIONS)
            connect = DebeziumConnect(work / "connect", self.broker, postgres)
            connect.add_connector("bench", "bench", self.prefix, tables=["public.accounts"])
            connect.wait_caught_up(timeout_s=7200)  # the snapshot: every row as op r
            t_snap = time.perf_counter()
            for lo in range(1, rows + 1, UPDATE_BATCH):  # every row once: op u
                postgres.execute(f"""UPDATE accounts SET amount = amount + 1.25, updated_at = updated_at + interval '1 day',
                                     note = CASE WHEN id % 7 = 0 THEN NULL WHEN note IS NULL THEN 'set «' || id || '»' ELSE note END
                                     WHERE id BETWEEN {lo} AND {lo + UPDATE_BATCH - 1}""", database="bench")
            postgres.execute(f"DELETE FROM accounts WHERE id % {DELETE_EVERY} = 37", database="bench")  # op d (+ a tombstone)
            connect.wait_caught_up(timeout_s=7200)
            self.stream_s = time.perf_counter() - t_snap
            self.rows_inserted = rows
            self.expected = [int(v or 0) for v in postgres.query(f"""
                SELECT count(*), sum(id), sum((amount * 100)::bigint),
                       sum((((id * 7919 + (amount * 100)::bigint) % {CHECK_MOD}) + {CHECK_MOD}) % {CHECK_MOD}),
                       sum(length(name)), count(note)
                FROM accounts""", database="bench")[0]]
        finally:
            if connect is not None:
                connect.stop()
            postgres.remove()
        self.starting, self.ending = self.offsets()
        self.events = sum(self.ending[self.topic].values()) - sum(self.starting[self.topic].values())
        self.prepare_s = time.perf_counter() - t0
        print(f"topic {self.topic}: {self.events:,} messages in {PARTITIONS} partitions (rows {self.rows_inserted:,}); "
              f"database: {self.expected[0]:,} rows; prepared in {self.prepare_s:.0f} s", flush=True)

    def offsets(self) -> tuple[dict, dict]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "cdc-bench-offsets", "enable.auto.commit": False})
        try:
            low, high = {}, {}
            for p in range(PARTITIONS):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
                low[str(p)], high[str(p)] = lo, hi
        finally:
            consumer.close()
        return {self.topic: low}, {self.topic: high}

    # --- the sides --------------------------------------------------------------------------

    def env(self, side: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_", "PYTHONPATH"))}
        if self.args.gc == "serial":
            env["SPARK_SUBMIT_OPTS"] = SERIAL_GC
        env["TZ"] = "UTC"
        if side.startswith("pipe"):
            env["PYTHONPATH"] = str(REPO)
            env["PIPE_NO_FORKSERVER"] = "1"
        else:
            env["PYSPARK_PYTHON"] = str(self.hudi_python)
        return env

    def pipe_project(self, root: Path) -> Path:
        import yaml

        conf = {"spark.driver.memory": MEMORY}
        if self.args.event_log:  # Spark's event log of pipe's runs, to see where the time goes (stages, tasks)
            (self.work / "events").mkdir(exist_ok=True)
            conf.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(self.work / "events")})
        files = {
            "pipe_project.yml": {"name": "cdc_bench", "targets": {"dev": {"spark": {"master": MASTER, "conf": conf}}}},
            "sources/pg.yml": {"sources": {"pg": {"kind": "kafka", "bootstrap_servers": self.broker.bootstrap, "topic": self.topic,
                                                  "format": "debezium"}}},
            "tables/accounts.yml": {"tables": {"accounts": {"key": ["id"], "precombine": "_cdc_position"}}},
        }
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        (root / "tables/accounts.sql").write_text(
            "select id, name, amount, updated_at, note, _cdc_position, _hoodie_is_deleted from {{ source('pg') }}\n", encoding="utf-8")
        return root

    def hudi_job(self, path: Path, mdt: bool, **extra) -> list[str]:
        job = {"master": MASTER, "bootstrap": self.broker.bootstrap, "topic": self.topic, "starting": self.starting,
               "ending": self.ending, "path": str(path), "hudi": hudi_options(mdt),
               "spark": {**SPARK_COMMON, **SPARK_HUDI, "spark.jars": ",".join([str(self.bundle.jar), *self.kafka_jars])}, **extra}
        spec = self.work / f"job-{secrets.token_hex(4)}.json"
        spec.write_text(json.dumps(job))
        return [str(self.hudi_python), str(self.work / "hudi_cdc_job.py"), str(spec)]

    def read_job(self, side: str) -> list[str]:
        """The command of a read-only side: the topic's range read and counted, nothing else."""
        job = {"master": MASTER, "bootstrap": self.broker.bootstrap, "topic": self.topic, "starting": self.starting,
               "ending": self.ending, "cores": CORES, "read_only": True,
               "spark": {**SPARK_COMMON, "spark.jars": ",".join(self.kafka_jars)}}
        spec = self.work / f"job-{secrets.token_hex(4)}.json"
        spec.write_text(json.dumps(job))
        if side == "read-c":
            (self.work / "c_read.py").write_text(C_READ)
            return [sys.executable, str(self.work / "c_read.py"), str(spec)]
        return [str(self.hudi_python), str(self.work / "hudi_cdc_job.py"), str(spec)]

    def setup_hudi(self) -> None:
        """The Spark 3.5 venv and bundle (tests/java_hudi/env.py), and Spark's Kafka source resolved
        once through spark.jars.packages (Ivy, ~/.ivy2): the measured runs get its jars in
        spark.jars, so that no run pays the resolution."""
        from tests.java_hudi.env import HUDI_11, PYSPARK, ensure

        ensure((HUDI_11,))
        self.bundle, self.pyspark3 = HUDI_11, PYSPARK
        self.hudi_python = HUDI_11.python
        (self.work / "hudi_cdc_job.py").write_text(HUDI_JOB)
        spec = self.work / "resolve.json"
        spec.write_text(json.dumps({"master": MASTER, "resolve_only": True,
                                    "spark": {**SPARK_COMMON, "spark.jars.packages": KAFKA_PACKAGE}}))
        done = subprocess.run([str(self.hudi_python), str(self.work / "hudi_cdc_job.py"), str(spec)], env=self.env("hudi"),
                              capture_output=True, text=True, timeout=1800)
        jars = [line[5:] for line in done.stdout.splitlines() if line.startswith("JARS ")]
        if done.returncode or not jars:
            raise SystemExit(f"resolving {KAFKA_PACKAGE} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        self.kafka_jars = [j for j in jars[0].split(",") if j]
        print(f"Spark 3.5's Kafka source: {len(self.kafka_jars)} jars ({', '.join(Path(j).name for j in self.kafka_jars)})", flush=True)

    # --- one measured run -------------------------------------------------------------------

    def measure(self, side: str, cmd: list[str], cwd: Path, log: Path) -> dict:
        spec = self.work / f"measure-{secrets.token_hex(4)}.json"
        spec.write_text(json.dumps({"cmd": cmd, "cwd": str(cwd), "log": str(log)}))
        broker_pids = lambda: tree([self.broker.proc.pid])  # noqa: E731
        broker0 = cpu_of(broker_pids())
        before = os.getloadavg()
        load = Load(every=2.0)
        load.start()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_measure", str(spec)], env=self.env(side),
                              capture_output=True, text=True)
        load.stop()
        if done.returncode:
            raise SystemExit(f"the measurement of {side} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        if out["rc"]:
            raise SystemExit(f"{side} failed (exit {out['rc']}); its log {log}:\n{log.read_text(errors='replace')[-5000:]}")
        out.update(side=side, load_before=before[0], load_during=load.loads or [load.after[0]],
                   others_cpu=load.others, steal=load.steal, broker_cpu=cpu_of(broker_pids()) - broker0)
        return out

    def check(self, path: Path) -> tuple[list[int], str]:
        """(count, sum id, sum cents, checksum, name characters, non-null notes) of a table, and the reader."""
        try:
            import hudi
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()
            table = pa.Table.from_batches(batches).select(["id", "name", "amount", "note"])
            ids = table["id"].to_numpy().astype(np.int64)
            amount = table["amount"]
            if pa.types.is_decimal(amount.type):
                cents = pc.cast(pc.multiply(amount, pa.scalar(100, pa.int64())), pa.int64()).to_numpy()
            else:
                cents = np.round(amount.to_numpy().astype(float) * 100).astype(np.int64)
            return [len(ids), int(ids.sum()), int(cents.sum()), int(np.mod(ids * 7919 + cents, CHECK_MOD).sum()),
                    int(pc.sum(pc.utf8_length(table["name"])).as_py() or 0), len(ids) - table["note"].null_count], "hudi-rs"
        except Exception as exc:  # noqa: BLE001 - a table version hudi-rs does not read: Spark 3.5 with Hudi 1.1.1
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        done = subprocess.run(self.hudi_job(path, False, check=str(path), mod=CHECK_MOD), env=self.env("hudi"), capture_output=True,
                              text=True)
        got = [line[6:] for line in done.stdout.splitlines() if line.startswith("CHECK ")]
        if done.returncode or not got:
            raise SystemExit(f"reading {path} back failed (hudi-rs: {why}):\n{done.stderr[-3000:]}")
        return json.loads(got[0]), f"Spark 3.5 + Hudi 1.1.1 (hudi-rs: {why})"

    def one(self, r: int, side: str) -> dict:
        base = self.work / f"r{r}"
        base.mkdir(exist_ok=True)
        log = base / f"{side}.log"
        if side in READS:
            cmd = self.read_job(side)
            out = self.measure(side, cmd, base, log)
            count, out["write_s"] = logged(log, "READ", int), logged(log, "WRITE_S", float)
            out.update(repeat=r, check=count, reader="a count of the messages", ok=count == self.events)
            print(f"  repeat {r + 1} {side:<10} {out['seconds']:7.1f} s  cpu {out['cpu']:6.1f} s  {count} of {self.events} messages", flush=True)
            self.runs.append(out)
            return out
        if side == "pipe":
            root = self.pipe_project(base / "pipe")
            cmd = [sys.executable, "-m", "pipe", "--project-dir", str(root), "run"]
            out = self.measure(side, cmd, root, log)
            table = root / "lake" / "accounts"
            out["steps"] = self.steps(root)
        else:
            table = base / side / "accounts"
            cmd = self.hudi_job(table, side == "hudi")
            out = self.measure(side, cmd, base, log)
            out["write_s"] = logged(log, "WRITE_S", float)
        got, reader = self.check(table)
        out.update(repeat=r, check=got, reader=reader, ok=got == self.expected)
        status = "equal to the database" if out["ok"] else f"DIFFERS from the database: {got} against {self.expected}"
        print(f"  repeat {r + 1} {side:<10} {out['seconds']:7.1f} s  cpu {out['cpu']:6.1f} s  peak {out['peak_mb']:5.0f} MB  "
              f"load {out['load_before']:.1f} -> {max(out['load_during']):.1f}  others {out['others_cpu']:.0f} cpu-s  "
              f"broker {out['broker_cpu']:.1f} cpu-s  {self.events / out['seconds']:,.0f} events/s  table {status} ({reader})", flush=True)
        self.runs.append(out)
        if side == "pipe":  # again, with nothing new
            again = self.measure("pipe-noop", cmd, root, base / "pipe-noop.log")
            got, reader = self.check(table)
            again.update(repeat=r, steps=self.steps(root), check=got, reader=reader)
            again["ok"] = again["check"] == self.expected
            print(f"  repeat {r + 1} {'pipe, nothing new':<10} {again['seconds']:5.1f} s  cpu {again['cpu']:6.1f} s  "
                  f"peak {again['peak_mb']:5.0f} MB  step: {again['steps'].get('table.accounts', {}).get('state')}", flush=True)
            self.runs.append(again)
        if not self.args.keep:
            shutil.rmtree(base / side if side != "pipe" else base / "pipe", ignore_errors=True)
        return out

    @staticmethod
    def steps(root: Path) -> dict:
        try:
            results = json.loads((root / "target/run_results.json").read_text())
        except (OSError, ValueError):
            return {}
        return {s.get("id", str(k)): s for k, s in enumerate(results.get("steps", []))}


# --- the report ----------------------------------------------------------------------------------

LABELS = {
    "pipe": "pipe run",
    "hudi": "Hudi job, metadata table on (Hudi's default)",
    "hudi-nomdt": "Hudi job, metadata table off",
    "pipe-noop": "pipe run, nothing new",
    "read-c": "the topic read alone, Kafka's C client (pipe's), 2 processes",
    "read-spark": "the topic read alone, Spark 3.5's Kafka source (the Hudi job's), local[2]",
}
READS = ("read-c", "read-spark")  # sides that read the topic and nothing else: the floor of any reader


def versions(bench: Bench) -> dict[str, str]:
    def out(cmd, env=None):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    import pyspark

    from tests.kafka.connect import DEBEZIUM_VERSION
    from tests.kafka.env import VERSION as KAFKA_VERSION

    try:
        from importlib.metadata import version as dist_version

        hudi_rs = dist_version("hudi")
    except Exception:  # noqa: BLE001
        hudi_rs = "?"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {"pipe": out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]), "pyspark": pyspark.__version__,
            "pyspark3": bench.pyspark3, "java": java[0] if java else "?", "kafka": KAFKA_VERSION, "debezium": DEBEZIUM_VERSION,
            "postgres": bench.pg_version, "hudi_rs": hudi_rs, "python": platform.python_version()}


def report(bench: Bench, vers: dict, started: str, load_before, whole: float, done: int, final: bool) -> str:
    args, runs, events = bench.args, bench.runs, bench.events
    by = {}
    for run in runs:
        by.setdefault(run["side"], []).append(run)
    sides = [s for s in ("pipe", "hudi", "hudi-nomdt", "pipe-noop", *READS) if s in by]
    med = {s: median([r["seconds"] for r in by[s]]) for s in sides}
    opts = hudi_options(True)
    lines = [
        "## CDC: Debezium change events from PostgreSQL into an upsert table, pipe against a Hudi Spark job"
        + ("" if args.events == 1_000_000 else f" ({args.events:,} events)"),
        "",
        "Generated by `python bench/cdc_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {started}; {os.cpu_count()} cores; Python {vers['python']}; whole run {whole:.0f} s (data prepared in {bench.prepare_s:.0f} s)",
        f"- Load average (1/5/15 min) before the run: {' / '.join(f'{x:.2f}' for x in load_before)}"
        + (" — **the machine was shared: read the times with that in mind**" if load_before[0] > 1.5 else ""),
        *([] if final else [f"- **Partial: written after repeat {done} of {args.repeats}; the run did not finish.**"]),
        f"- **Data**: real Debezium {vers['debezium']} (PostgreSQL connector, pgoutput, Kafka Connect {vers['kafka']} JsonConverter "
        f"with schemas) from PostgreSQL {vers['postgres']} into Kafka {vers['kafka']}: topic `{bench.topic}`, {PARTITIONS} partitions "
        f"(made before the connector started; Debezium's key, the primary key, picks the partition), **{events:,} messages**: "
        f"{bench.rows_inserted:,} snapshot reads (`op: r`) of `accounts (id bigint primary key, name text (accents, quotes, "
        f"backslashes), amount numeric(12,2), updated_at timestamptz, note text null)`, then an UPDATE of every row "
        f"(transactions of {UPDATE_BATCH:,} rows: `u`), then a DELETE of 1% of the rows (`d`, each followed by Debezium's tombstone). "
        f"The database then holds {bench.expected[0]:,} rows. Kafka Connect and PostgreSQL are stopped before the measurements; "
        "the broker (one JVM, -Xmx512m) serves both sides and its CPU is counted apart.",
        f"- **pipe** (commit {vers['pipe']}, PySpark {vers['pyspark']}): `python -m pipe --project-dir P run`, a fresh process; the project "
        f"(written by the script): a `kind: kafka` source, `topic: {bench.topic}`, `format: debezium`; table `accounts`: `key: [id]`, "
        "`precombine: _cdc_position`, copy-on-write (pipe's default), global index (pipe's default), SQL `select id, name, amount, "
        "updated_at, note, _cdc_position, _hoodie_is_deleted from {{ source('pg') }}`; target spark master "
        f"`{MASTER}`, `spark.driver.memory: {MEMORY}`, everything else pipe's defaults (4 shuffle partitions, 2 default parallelism, "
        "AQE, UTC). pipe reads each partition's range with Kafka's C client in its Python workers (12 tasks), decodes the events "
        "and upserts. `pipe run, nothing new`: the same command again right after, no new message.",
        f"- **Hudi job** (the baseline: what a Hudi user writes when Hudi Streamer is not at hand — hudi-utilities-bundle and "
        "hudi-utilities-slim-bundle are not served by this machine's Maven Central mirror: 404 for 0.14.1, 0.15.0, 1.1.1 and, tried on 2026-12-03, 1.2.0): a "
        f"PySpark {vers['pyspark3']} batch job (its code: `HUDI_JOB` in bench/cdc_bench.py), a fresh `python` per run, with "
        f"hudi-spark3.5-bundle_2.12 **1.1.1** and Spark's Kafka source `{KAFKA_PACKAGE}` (resolved once through "
        "`spark.jars.packages` before the measurements; the runs get the resolved jars in `spark.jars`). It reads the topic's offset "
        "range (`startingOffsets`/`endingOffsets` JSON, 0 to the end of every partition), drops tombstones, parses the envelope with "
        "`from_json` (payload: before, after, source.lsn, op, ts_ms), takes `after` (`before` for `d`), decodes the Connect Decimal "
        "(base64 two's complement) and the ZonedTimestamp, orders by `source.lsn` as the precombine field (`_lsn = lsn * 2 + (op != "
        "'r')`: at one LSN a snapshot read before a change, as pipe's `_cdc_position`; no global sort), marks `d` with "
        "`_hoodie_is_deleted`, and writes with Hudi's Spark datasource, mode append: "
        + ", ".join(f"`{k}={v}`" for k, v in opts.items() if k != "hoodie.metadata.enable")
        + "; `hoodie.metadata.enable` at Hudi's default (`true`) and, as a second row, `false`; everything else Hudi's defaults "
        "(table version 9, SIMPLE index, inline clean and archive, the embedded timeline server). Spark: "
        + ", ".join(f"`{k}={v}`" for k, v in {**SPARK_COMMON, **SPARK_HUDI}.items()) + f", master `{MASTER}`.",
        f"- Both sides: Java `{vers['java']}`, "
        + (f"`SPARK_SUBMIT_OPTS={SERIAL_GC}` (the serial collector, as every JVM of the tests: tests/jvm_options.py)" if args.gc == "serial"
           else "the JDK's default collector (G1 here), as a user runs both")
        + f", driver memory {MEMORY}, {MASTER}, TZ=UTC.",
        f"- Each of {done} repeat(s) writes fresh tables; the sides take turns going first (pipe first in odd repeats, last in even ones). "
        "Wall: launch to exit of the command. CPU: user + system seconds of the command and every process it started (the JVM and "
        "Python workers): the larger of the rusage of the processes reaped (the bench is their subreaper) and the sum of each "
        "process's CPU as /proc last showed it, read every 0.25 s (bench/report.py run_timed; PySpark's Python workers escape the "
        "first: before 2026-11-29 this column missed about 70 CPU-s of pipe's 1M-event run). Peak RSS: the sum over that process tree, "
        "sampled every 0.5 s. Events/s: the topic's messages (tombstones included) over the wall time; per core: over "
        f"{CORES} cores. Load: the 1-minute load average just before the run, and its mean and maximum during it (sampled every 2 s); "
        "others: CPU seconds taken meanwhile by processes outside the bench (the broker is inside).",
        "- Checked after every run: the table read back (with hudi-rs, or with Spark 3.5 and Hudi 1.1.1 where hudi-rs cannot read it: "
        "the checks column names the reader) equals the database in row count, sum of ids, sum of amounts (cents), a checksum of (id, amount) pairs (sum of (id·7919 + cents) mod 1e9+7), "
        "the characters of the names and the count of non-null notes.",
        "",
        "| side | wall s (median) | runs s | CPU s (median) | events/s | events/s per core | events per CPU-s | peak RSS MB | "
        "broker CPU s | load before → during (mean, max) | others CPU s | checks |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for side in sides:
        rs = by[side]
        wall, cpu = med[side], median([r["cpu"] for r in rs])
        loads = "; ".join(f"{r['load_before']:.1f} → {sum(r['load_during']) / len(r['load_during']):.1f}, {max(r['load_during']):.1f}" for r in rs)
        readers = ", ".join(sorted({r["reader"] for r in rs}))
        ok = (f"equal ×{len(rs)}" if all(r["ok"] for r in rs) else "**differs** in repeat " + ", ".join(str(r["repeat"] + 1) for r in rs if not r["ok"])) + f" ({readers})"
        rate = "" if side == "pipe-noop" else f"{events / wall:,.0f} | {events / wall / CORES:,.0f} | {events / cpu:,.0f}"
        walls = ", ".join(f"{r['seconds']:.1f}" for r in rs)
        others = ", ".join(f"{r['others_cpu']:.0f}" for r in rs)
        lines.append(f"| {LABELS[side]} | **{wall:.1f}** | {walls} | {cpu:.1f} | " + (rate or "— | — | —")
                     + f" | {max(r['peak_mb'] for r in rs):.0f} | {median([r['broker_cpu'] for r in rs]):.1f} | {loads} | {others} | {ok} |")
    lines += ["", "**Against the target** (issue 40: pipe at most 0.5x the baseline's wall time):", ""]
    for base in ("hudi", "hudi-nomdt"):
        if base in med and "pipe" in med:
            ratio = med["pipe"] / med[base]
            lines.append(f"- pipe / {LABELS[base]}: **{ratio:.2f}x — {'met' if ratio <= 0.5 else 'missed'}** "
                         f"({med['pipe']:.1f} s against {med[base]:.1f} s; CPU {median([r['cpu'] for r in by['pipe']]):.0f} s against "
                         f"{median([r['cpu'] for r in by[base]]):.0f} s)")
    floors = [f"{med[side]:.1f} s with {LABELS[side].split(', ', 1)[1]}" for side in READS if side in med]
    if floors:
        spark_read = [r.get("write_s") for r in by.get("read-spark", [])]
        inner = (f" (Spark's read itself, without its start, {median(spark_read):.1f} s)"
                 if spark_read and all(x is not None for x in spark_read) else "")
        half = f"; 0.5x of the Hudi job with its metadata table would be {0.5 * med['hudi']:.1f} s" if "hudi" in med else ""
        lines.append("- The floor: the topic's range read and counted, nothing decoded or written, from a fresh process: "
                     + "; ".join(floors) + inner + half + ".")
    # the work itself, without the process's and Spark's start: pipe's table step, the Hudi job's save()
    work = []
    if "pipe" in by:
        steps = [(r["steps"].get("table.accounts") or {}).get("elapsed_s") for r in by["pipe"]]
        if all(x is not None for x in steps):
            work.append(f"pipe's table step (the read of the ranges, decoding, upsert, commit; from target/run_results.json) "
                        f"{median(steps):.1f} s")
    for base in ("hudi", "hudi-nomdt"):
        saves = [r.get("write_s") for r in by.get(base, [])]
        if saves and all(x is not None for x in saves):
            work.append(f"`save()` (the read, parsing, upsert, commit) of the {LABELS[base]} {median(saves):.1f} s")
    if work:
        lines.append("- The work without the process's and Spark's start (medians): " + "; ".join(work) + ".")
    noop = by.get("pipe-noop")
    if noop:
        states = sorted({(r["steps"].get("table.accounts") or {}).get("state", "?") for r in noop})
        lines.append(f"- `pipe run` with nothing new: {med['pipe-noop']:.1f} s (step state: {', '.join(states)}).")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--_measure":
        measure_child(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="about how many messages the topic holds")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-mdt-off", action="store_true", help="leave out the Hudi job with its metadata table off")
    ap.add_argument("--gc", choices=("serial", "default"), default="default", help="both sides' JVM collector: the JDK's own choice (G1 on a 2-core machine with this memory), as a user runs them, or the serial one of the tests")
    ap.add_argument("--section", default="cdc")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write bench/RESULTS.md")
    ap.add_argument("--event-log", action="store_true", help="pipe's runs write Spark's event log into the work folder's events/")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (tables, logs)")
    ap.add_argument("--sides", default="pipe,hudi,hudi-nomdt,read-c,read-spark",
                    help="which sides run, of pipe, hudi, hudi-nomdt, read-c, read-spark (comma-separated; to profile one)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))

    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="pipe-cdc-bench-"))
    os.chmod(work, 0o755)
    bench = Bench(args, work)
    sides = [s for s in args.sides.split(",") if s and not (args.no_mdt_off and s == "hudi-nomdt")]
    if not sides or set(sides) - {"pipe", "hudi", "hudi-nomdt", *READS}:
        ap.error("--sides takes pipe, hudi, hudi-nomdt, read-c and read-spark")
    done, body = 0, ""
    try:
        bench.setup_hudi()
        bench.prepare()
        vers = versions(bench)
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            for side in (sides if r % 2 == 0 else sides[::-1]):
                bench.one(r, side)
            done = r + 1
            body = report(bench, vers, started, load_before, time.perf_counter() - t0, done, final=done == args.repeats)
            if not args.no_write:
                write_section(args.section, body)  # after every repeat: a run cut short leaves what it measured
    finally:
        if bench.broker is not None:
            bench.broker.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(body)
    bad = [r for r in bench.runs if not r["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
