"""The tests' side of driver.py: one long-lived Java Hudi process per bundle, and helpers that
turn its answers (and pipe's and hudi-rs's reads) into comparable rows."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.java_hudi.env import Bundle
from tests.jvm_options import SERIAL_GC

DRIVER = Path(__file__).with_name("driver.py")
META = ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path", "_hoodie_file_name")


class JavaError(AssertionError):
    """A command Java Hudi answered with an exception; its text is Java's."""

    def __init__(self, op: str, answer: dict):
        self.answer = answer
        self.java = answer.get("java") or ""
        super().__init__(f"Java Hudi {op} failed: {answer.get('error')}\n{self.java}")


class JavaHudi:
    """A Java Hudi Spark session in its own process (driver.py), for a whole pytest session.
    `timezone`: the JVM's time zone (user.timezone, TZ, Spark's session time zone), UTC unless
    given; `conf`: more Spark settings of its session; `jvm_options`: the JVM's (the serial collector unless given). The driver and its JVM run in a process group of their own, which kill() ends at
    once, as a crash would."""

    def __init__(self, bundle: Bundle, workdir: Path, timezone: str = "UTC", conf: dict[str, str] | None = None,
                 jvm_options: str = SERIAL_GC):
        self._args = (bundle, workdir, timezone, conf, jvm_options)
        self._lost = False  # its JVM went away: the next command starts a new driver (send)
        self.bundle = bundle
        self.timezone = timezone
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "driver.log"
        self._count = itertools.count()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_HOME", "PYTHONPATH"))}
        # (PYSPARK_SUBMIT_ARGS, the tests' options for pipe's drivers, is dropped: Java Hudi does its
        # work in the JVM (Avro, Parquet, merging) and keeps the full JIT; tests/conftest.py)
        # the serial collector, as every JVM of the tests (tests/conftest.py); a benchmark racing
        # Java with its defaults gives its own `jvm_options`
        env["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, (env.get("SPARK_SUBMIT_OPTS"), jvm_options)))
        env["PYSPARK_PYTHON"] = str(bundle.python)
        env["JAVA_HUDI_TZ"] = env["TZ"] = timezone
        env["JAVA_HUDI_CONF"] = json.dumps(conf or {})  # more Spark settings (a Hive metastore: tests/hive_metastore.py)
        self._stderr = open(self.log, "w")
        self.proc = subprocess.Popen([str(bundle.python), str(DRIVER), str(bundle.jar)], cwd=self.workdir, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
                                     start_new_session=True)
        ready = self._answer()
        if not ready.get("ready"):
            raise RuntimeError(f"Java Hudi {bundle.hudi} did not start: {ready}\n{self.log_tail()}")
        self.version = self.call({"op": "version"})

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Java Hudi {self.bundle.hudi} process ended (exit {self.proc.poll()}):\n{self.log_tail()}")
        return json.loads(line)

    def send(self, cmd: dict) -> "Pending":
        """Sends one command and returns at once; the answer is the Pending's wait(). A driver
        whose JVM went away (py4j's Py4JError or "Connection refused") is replaced first, so that
        one lost JVM fails one test, not every later test of the session."""
        if self._lost:
            self.kill()
            self.log.replace(self.log.with_name(f"driver-lost-{os.getpid()}-{next(self._count)}.log"))  # the crash's evidence
            self.__init__(*self._args)
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return Pending(self, cmd.get("op", "?"))

    def call(self, cmd: dict) -> dict:
        """Sends one command; returns the answer, or raises JavaError with Java's message."""
        return self.send(cmd).wait()

    def kill(self) -> None:
        """SIGKILL to the driver and its JVM (the whole process group), as a crashed host would
        leave them: no shutdown hook, no rollback, no heartbeat stop."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()

    def _scratch(self, stem: str) -> Path:
        return self.workdir / f"{stem}-{next(self._count)}"

    # --- commands ------------------------------------------------------------------------------

    def read(self, path, query: str = "snapshot", as_of: str | None = None, begin: str | None = None,
             end: str | None = None, **options) -> pa.Table:
        """A Java Hudi read of the table at `path` (snapshot, read_optimized, incremental
        (begin, end], or time travel as of an instant), as an Arrow table."""
        out = self._scratch("read")
        self.call({"op": "read", "path": str(path), "query": query, "as_of": as_of, "begin": begin, "end": end,
                   "options": {k: str(v) for k, v in options.items()}, "out": str(out)})
        return pq.read_table(out)

    def write(self, path, rows: pa.Table, options: dict, mode: str = "append") -> None:
        """Writes `rows` into the table at `path` with Java Hudi's DataFrame writer and `options`
        (hoodie.* keys; Java's defaults for everything not given)."""
        self.write_async(path, rows, options, mode).wait()

    def write_async(self, path, rows: pa.Table, options: dict, mode: str = "append") -> "Pending":
        """Starts the write of write() and returns without waiting for Java's answer."""
        src = self._scratch("input").with_suffix(".parquet")
        pq.write_table(rows, src)
        return self.send({"op": "write", "path": str(path), "input": str(src),
                          "options": {k: str(v) for k, v in options.items()}, "mode": mode})

    def sql(self, text: str) -> list[list]:
        return self.call({"op": "sql", "sql": text})["rows"]

    def catalog_partitions(self, database: str, table: str, keys: list[str]) -> list[tuple[tuple[str, ...], str]]:
        """(values, location) of each partition the session's catalog (its metastore) holds."""
        answer = self.call({"op": "catalog_partitions", "database": database, "table": table, "keys": keys})
        return sorted((tuple(p["spec"][k] for k in keys), p["location"]) for p in answer["partitions"])

    def close(self) -> None:
        if self._stderr.closed:  # killed
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class Pending:
    """A command sent to Java Hudi whose answer is not read yet (one at a time per process)."""

    def __init__(self, java: JavaHudi, op: str):
        self.java, self.op = java, op

    def wait(self) -> dict:
        answer = self.java._answer()
        if not answer.get("ok"):
            error = str(answer.get("error"))
            # py4j lost its JVM (not a Java exception, which is a Py4JJavaError)
            if error.startswith(("Py4JError", "Py4JNetworkError", "ConnectionRefusedError")):
                self.java._lost = True
            raise JavaError(self.op, answer)
        return answer


# --- comparable rows ---------------------------------------------------------------------------

def canon(value):
    """One spelling for a value whichever reader produced it: timestamps as UTC, maps as sorted
    pairs, structs as sorted items."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return ("ts", value.isoformat())
    if isinstance(value, decimal.Decimal):
        return ("dec", str(value))
    if isinstance(value, dict):
        return tuple(sorted((k, canon(v)) for k, v in value.items()))
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):  # a map as Arrow gives it
            return ("map", tuple(sorted((canon(k), canon(v)) for k, v in value)))
        return tuple(canon(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


def rows(table: pa.Table, columns) -> list[tuple]:
    """The rows of an Arrow table as sorted tuples of `columns`, canonical values."""
    data = table.select(list(columns)).to_pylist()
    return sorted((tuple(canon(r[c]) for c in columns) for r in data), key=repr)


def hudi_rs(path, as_of: str | None = None, since: str | None = None, until: str | None = None) -> pa.Table:
    """hudi-rs's read of the table (snapshot, time travel or incremental)."""
    import hudi

    table = hudi.HudiTableBuilder.from_base_uri(str(path)).build()
    if since is not None:
        opts = hudi.HudiReadOptions().with_query_type(hudi.HudiQueryType.Incremental).with_start_timestamp(since)
        if until:
            opts = opts.with_end_timestamp(until)
        batches = table.read(opts)
    elif as_of is not None:
        batches = table.read(hudi.HudiReadOptions().with_as_of_timestamp(as_of))
    else:
        batches = table.read()
    if not batches:
        return None
    return pa.Table.from_batches(batches)


def pipe_read(table, **read) -> pa.Table:
    """pipe's reader (in-process, pyarrow) of a runtime.table.Table."""
    schema, batches = table.read_batches(**read)
    return pa.Table.from_batches(list(batches), schema=schema)
