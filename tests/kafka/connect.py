"""Kafka Connect with Debezium's PostgreSQL connector, for the CDC tests: a standalone Connect worker
(one JVM, `org.apache.kafka.connect.cli.ConnectStandalone`) writing real change events of a real
PostgreSQL (tests/postgres/env.py) into the tests' Kafka broker (tests/kafka/env.py).

Its jars come from Maven Central (tests/kafka/connect-pom.xml), fetched once under a file lock into
<repo>/.kafka/connect-<kafka>-debezium-<debezium>-apicurio-<apicurio>/: `worker/` is the JVM's
classpath (Connect's runtime and JsonConverter at the broker's Kafka version, Jackson, log4j2),
`plugins/` its plugin.path (Debezium's connector and its own dependencies, loaded in isolation as
in a real installation, with Apicurio Registry's Avro converter beside them: see
`add_connector(avro_registry=...)`).

One worker per test session and worker (the `debezium` fixture of tests/conftest.py). By hand:

    python -m tests.kafka.connect      # a broker, PostgreSQL and a Connect worker; prints their addresses

Messages are JSON with schemas (JsonConverter, schemas.enable=true): key and value are each
{"schema": {...}, "payload": {...}}; a value's payload is Debezium's envelope
{"before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"}; a delete is followed
by a tombstone (same key, null value). A connector added with `avro_registry=` writes Avro in
Confluent's wire format instead (avro_converter_settings)."""

from __future__ import annotations

import fcntl
import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from tests.jvm_options import FIRST_TIER_JIT, SERIAL_GC
from tests.kafka import env as kafka_env
from tests.kafka.env import SetupError, _free_port, _java
from tests.registry import env as registry_env

KAFKA_VERSION = kafka_env.VERSION  # the worker's Kafka is the broker's
DEBEZIUM_VERSION = "3.6.1.Final"
APICURIO_VERSION = registry_env.VERSION  # the converter's is the registry's
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
POM = Path(__file__).resolve().parent / "connect-pom.xml"
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
MARKER_PREFIX = "pipe_tests_caught_up"  # wait_caught_up's logical decoding messages (never a Kafka message)
HEARTBEAT_MS = 200


def folder() -> Path:
    return kafka_env.HOME / f"connect-{KAFKA_VERSION}-debezium-{DEBEZIUM_VERSION}-apicurio-{APICURIO_VERSION}"


def _mvn(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"fetching {what} failed ({' '.join(args)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _fetch(where: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise SetupError("the CDC tests need Maven (`mvn` on PATH) to fetch Kafka Connect and Debezium from Maven Central")
    part = where.with_name(where.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    common = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dkafka.version={KAFKA_VERSION}",
              f"-Ddebezium.version={DEBEZIUM_VERSION}", f"-Dapicurio.version={APICURIO_VERSION}", "-DincludeScope=runtime"]
    _mvn(common + ["-Pworker", f"-DoutputDirectory={part / 'worker'}"], f"Kafka Connect {KAFKA_VERSION}")
    plugin = part / "plugins" / "debezium-connector-postgres"
    _mvn(common + ["-Pdebezium", f"-DoutputDirectory={plugin}"], f"Debezium {DEBEZIUM_VERSION}")
    _mvn(common + ["-Papicurio", f"-DoutputDirectory={plugin}"], f"Apicurio Registry's converter {APICURIO_VERSION}")
    _converter_manifest(plugin)
    for jar in (part / "worker" / f"connect-runtime-{KAFKA_VERSION}.jar", plugin / f"debezium-connector-postgres-{DEBEZIUM_VERSION}.jar",
                plugin / f"apicurio-registry-utils-converter-{APICURIO_VERSION}.jar"):
        if not jar.is_file():
            raise SetupError(f"mvn did not leave {jar.name} in {jar.parent}")
    (part / ".complete").write_text("")
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)


def _converter_manifest(plugin: Path) -> None:
    """A jar holding only a ServiceLoader manifest that names Apicurio's AvroConverter, beside its
    jar (which has none), so that the worker's plugin.discovery=service_load finds it, as Kafka's
    `connect-plugin-path sync-manifests` would make it. Without it (seen with Connect 4.1.0) a
    connector naming it as its key.converter/value.converter is RUNNING but never gets a task, and
    PUT /connectors/<name>/config hangs with nothing in the log; with plugin.discovery=hybrid_warn
    (a scan of every class: seconds at each start) it works too. Only the Avro converter: the jar's
    ExtJsonConverter needs the JSON Schema serde, left out (tests/kafka/connect-pom.xml)."""
    with zipfile.ZipFile(plugin / "pipe-apicurio-converter-manifest.jar", "w") as jar:
        jar.writestr("META-INF/services/org.apache.kafka.connect.storage.Converter", AVRO_CONVERTER + "\n")


def jars() -> Path:
    """The folder holding worker/ and plugins/, fetched on first use (under a lock of its own, so
    that it is fetched beside the broker's jars)."""
    where = folder()
    if not (where / ".complete").is_file():
        kafka_env.HOME.mkdir(parents=True, exist_ok=True)
        with open(kafka_env.HOME / ".connect-setup.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (where / ".complete").is_file():
                _fetch(where)
    return where


_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{HH:mm:ss.SSS} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
# each client's and converter's configuration, class scanning, Jetty: pages of INFO per connector
logger.clients.name = org.apache.kafka.clients
logger.clients.level = warn
logger.common.name = org.apache.kafka.common
logger.common.level = warn
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
logger.jetty.name = org.eclipse.jetty
logger.jetty.level = warn
logger.glassfish.name = org.glassfish
logger.glassfish.level = warn
logger.isolation.name = org.apache.kafka.connect.runtime.isolation
logger.isolation.level = warn
# "Committing offsets for N acknowledged messages" twice a second (heartbeats, offset.flush.interval.ms)
logger.sourcetask.name = org.apache.kafka.connect.runtime.WorkerSourceTask
logger.sourcetask.level = warn
"""


class ConnectError(RuntimeError):
    pass


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def avro_converter_settings(registry_api_url: str) -> dict[str, str]:
    """A connector's own key.converter and value.converter (overriding the worker's JsonConverter)
    writing Avro in Confluent's wire format through Apicurio Registry at `registry_api_url`
    (Apicurio's API, SchemaRegistry.api_url of tests/registry/env.py): each message is the magic
    byte 0, the schema's id as 4 bytes big-endian, then the Avro binary encoding of the record; the
    id is one that the registry's Confluent API serves (GET <SchemaRegistry.url>/schemas/ids/<id>)
    with the writer's schema, registered under subject <topic>-key or <topic>-value.

    - headers.enabled=false: the id in the message's bytes; by default the converter writes bare
      Avro and puts the id in Kafka headers (apicurio.value.globalId: 8 bytes)
    - id-handler=Legacy4ByteIdHandler: the id in 4 bytes after the magic byte (the default
      DefaultIdHandler writes 8); `apicurio.registry.as-confluent=true` chooses the same handler
      but logs "Duplicate id-handler configuration" for each serializer, as the default is set too
    - use-id=contentId: the id is the schema text's contentId, the id of Confluent's API there
      (the default, globalId, numbers versions of artifacts and is no id over there)
    - auto-register: a new schema (the first message of a table, a column added) is registered
      before its message is written (TopicIdStrategy: artifact <topic>-value in the default group)"""
    settings = {}
    for side in ("key", "value"):
        prefix = f"{side}.converter"
        settings.update({
            prefix: AVRO_CONVERTER,
            f"{prefix}.apicurio.registry.url": registry_api_url,
            f"{prefix}.apicurio.registry.auto-register": "true",
            f"{prefix}.apicurio.registry.headers.enabled": "false",
            f"{prefix}.apicurio.registry.id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler",
            f"{prefix}.apicurio.registry.use-id": "contentId",
        })
    return settings


class DebeziumConnect:
    """A running Kafka Connect worker (standalone) with Debezium's Postgres connector installed,
    writing to `broker` (a KafkaBroker) from `postgres` (a PostgresServer). `url` is its REST API."""

    def __init__(self, workdir: Path, broker, postgres, timeout_s: float = 120):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.broker, self.postgres = broker, postgres
        self.home = jars()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.workdir / "worker.properties"
        self.offsets = self.workdir / "connect.offsets"
        self.log = self.workdir / "connect.log"
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        self.config.write_text("\n".join([
            f"bootstrap.servers={broker.bootstrap}",
            "key.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable=true",
            "value.converter.schemas.enable=true",
            f"offset.storage.file.filename={self.offsets}",
            "offset.flush.interval.ms=500",  # Debezium confirms an LSN to the slot when Connect flushes offsets
            f"listeners=http://127.0.0.1:{self.port}",
            "rest.advertised.host.name=127.0.0.1",
            f"rest.advertised.port={self.port}",
            f"plugin.path={self.home / 'plugins'}",
            "plugin.discovery=service_load",  # the jars' ServiceLoader manifests, no scan of every class (seconds)
            "",
        ]))
        self.connectors: dict[str, dict] = {}  # name -> database, slot, publication, topic_prefix
        self.proc: subprocess.Popen | None = None
        self.start(timeout_s)

    def start(self, timeout_s: float = 120) -> None:
        args = [_java(), "-Xmx512m", FIRST_TIER_JIT, SERIAL_GC, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", f"{self.home / 'worker'}/*", "org.apache.kafka.connect.cli.ConnectStandalone", str(self.config)]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise SetupError(f"Kafka Connect did not start (exit {self.proc.returncode}):\n{self._log_tail()}")
            try:
                plugins = self._rest("GET", "/connector-plugins", timeout=2)
                break
            except (OSError, ConnectError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise SetupError(f"Kafka Connect did not answer on {self.url} within {timeout_s:.0f} s:\n{self._log_tail()}") from None
                time.sleep(0.3)
        if not any(p.get("class") == CONNECTOR_CLASS for p in plugins):
            self.stop()
            raise SetupError(f"Kafka Connect started without Debezium's connector ({self.home / 'plugins'}): {plugins}\n{self._log_tail()}")

    def stop(self, timeout_s: float = 30) -> None:
        """Ends the worker (SIGTERM: Connect stops its connectors and flushes offsets), then kills it."""
        kafka_env.stop_process(self.proc, timeout_s)

    def _log_tail(self) -> str:
        return kafka_env.log_tail(self.log)

    def _rest(self, method: str, path: str, body=None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise ConnectError(f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')[:2000]}") from None
        return json.loads(text) if text else None

    # --- connectors ---------------------------------------------------------------------------------

    def add_connector(self, name: str, database: str, topic_prefix: str, tables=None, timeout_s: float = 60,
                      avro_registry: str | None = None, **extra) -> dict:
        """Registers Debezium's Postgres connector `name` reading `database` into topics
        `<topic_prefix>.<schema>.<table>`, and returns its configuration once its task runs and its
        replication slot exists (from then on wait_caught_up() is exact).

        `tables` ("public.orders", ...): a publication of those tables only (table.include.list,
        publication.autocreate.mode=filtered); None: a publication FOR ALL TABLES, which also
        covers tables created later (every table then needs a primary key or a REPLICA IDENTITY
        for its UPDATEs and DELETEs). pgoutput, snapshot.mode=initial (the rows there are
        first, op "r", then the changes), a slot and publication named after the connector with a
        random suffix. `extra`: more or other Debezium settings, dotted names through a dict:
        `**{"decimal.handling.mode": "string"}`. `avro_registry`: Apicurio Registry's API URL
        (SchemaRegistry.api_url, the `schema_registry` fixture): keys and values in Avro, Confluent's
        wire format, instead of JSON (avro_converter_settings; `extra` can still override them).

        With the defaults, columns arrive in the JSON as:
        - numeric(p,s): decimal.handling.mode=precise, a Connect Decimal: the payload is the
          unscaled value's big-endian two's-complement bytes in base64 ("AwE=" is 769, 7.69 at
          scale 2); the schema is {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
          "parameters": {"scale": "2", "connect.decimal.precision": "12"}}. numeric without a
          precision is io.debezium.data.VariableScaleDecimal, a struct {"scale", "value"}.
        - timestamptz: a string in UTC, io.debezium.time.ZonedTimestamp, with six fractional
          digits for a plain timestamptz even when they are zeros ("2024-03-01T10:30:00.123456Z",
          "2024-12-31T23:59:59.000000Z");
          timestamp (no zone): int64 microseconds, io.debezium.time.MicroTimestamp.
        - bigint: int64; integer: int32; text: string (UTF-8, quotes as they are).
        - UPDATE/DELETE "before": with REPLICA IDENTITY DEFAULT, null for an update and, for a
          delete, the key columns with every other column null, or its type's zero value when it
          is NOT NULL ("AA==" for a numeric, "" for text): not the old row. REPLICA IDENTITY FULL
          gives the old row.
        - source.lsn: snapshot rows (op "r") all carry the slot's start LSN, which the first change
          committed after it can share; changes then increase.

        wait_caught_up() needs `heartbeat.interval.ms` > 0 (set here; its topic is
        __debezium-heartbeat.<topic_prefix>)."""
        if name in self.connectors:
            raise ValueError(f"connector {name!r} is already registered")
        ident = re.sub(r"[^a-z0-9_]", "_", name.lower())[:40] + "_" + secrets.token_hex(4)
        slot, publication = f"pipe_{ident}", f"pipe_{ident}"
        pg = self.postgres
        config = {
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "database.hostname": pg.host,
            "database.port": str(pg.port),
            "database.user": pg.user,
            "database.password": pg.password,
            "database.dbname": database,
            "topic.prefix": topic_prefix,
            "plugin.name": "pgoutput",
            "slot.name": slot,
            "publication.name": publication,
            "publication.autocreate.mode": "filtered" if tables else "all_tables",
            "snapshot.mode": "initial",
            # a heartbeat record after each commit and while idle carries the LSN of the last
            # commit read: its offset flush is what moves the slot's confirmed_flush_lsn there
            "heartbeat.interval.ms": str(HEARTBEAT_MS),
            "poll.interval.ms": "100",  # the pause of an idle stream (default 500 ms)
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1",
        }
        if tables:
            config["table.include.list"] = ",".join(re.escape(t) for t in tables)
        if "message.prefix.include.list" not in extra:
            config["message.prefix.exclude.list"] = MARKER_PREFIX
        if avro_registry:
            config.update(avro_converter_settings(avro_registry))
        config.update({k: str(v) for k, v in extra.items()})
        self._rest("PUT", f"/connectors/{_quote(name)}/config", config)
        self.connectors[name] = {"database": database, "slot": config["slot.name"], "publication": config["publication.name"],
                                 "topic_prefix": topic_prefix}
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_if_failed(name)
            status = self.status(name)
            running = status["connector"]["state"] == "RUNNING" and [t["state"] for t in status["tasks"]] == ["RUNNING"]
            if running and self._slot(name) is not None:
                return config
            if time.monotonic() > deadline:
                raise ConnectError(f"connector {name} not running with its slot after {timeout_s:.0f} s: {status}\n{self._log_tail()}")
            time.sleep(0.1)

    def status(self, name: str) -> dict:
        """GET /connectors/<name>/status: {"connector": {"state": ...}, "tasks": [{"state": ..., "trace"?}]}"""
        try:
            return self._rest("GET", f"/connectors/{_quote(name)}/status", timeout=10)
        except ConnectError as exc:
            if "HTTP 404" in str(exc):  # registered, no status yet
                return {"connector": {"state": "UNASSIGNED"}, "tasks": []}
            raise

    def _raise_if_failed(self, name: str) -> None:
        status = self.status(name)
        failed = [s for s in [status["connector"], *status["tasks"]] if s.get("state") == "FAILED"]
        if failed:
            raise ConnectError(f"connector {name} failed:\n" + "\n".join(s.get("trace", "")[:4000] for s in failed))

    def _slot(self, name: str):
        """(active, confirmed_flush_lsn as text) of the connector's slot, or None."""
        rows = self.postgres.query("SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                   (self.connectors[name]["slot"],))
        return rows[0] if rows else None

    def wait_caught_up(self, timeout_s: float = 60) -> None:
        """Returns once every change committed before the call, in the databases of every connector,
        is in Kafka (written and acknowledged by the broker).

        How: a transactional logical decoding message (pg_logical_emit_message, excluded from
        Kafka by message.prefix.exclude.list) is committed in each connector's database; its
        commit follows every earlier commit in the WAL. Debezium reads it after them, its next
        heartbeat record carries that commit's LSN, and Connect flushes a record's offset only once
        the broker acknowledged it and every earlier record of the connector; Debezium then
        confirms that LSN to the slot. So the slot's confirmed_flush_lsn reaching the marker's LSN
        means everything before it is in Kafka. Typically 0.3-1 s (heartbeat 200 ms, offset flush
        500 ms). A connector or task that FAILED raises at once with its stack trace."""
        deadline = time.monotonic() + timeout_s
        markers: dict[str, str] = {}
        for name, connector in self.connectors.items():
            database = connector["database"]
            if database not in markers:
                markers[database] = self.postgres.query("SELECT pg_logical_emit_message(true, %s, %s)::text",
                                                        (MARKER_PREFIX, "caught up?"), database=database)[0][0]
        waiting = dict(self.connectors)
        while waiting:
            for name in list(waiting):
                marker, slot = markers[waiting[name]["database"]], waiting[name]["slot"]
                rows = self.postgres.query("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                                           (marker, slot))
                if rows and rows[0][0]:
                    del waiting[name]
            if not waiting:
                return
            for name in waiting:
                self._raise_if_failed(name)
            if time.monotonic() > deadline:
                detail = {name: (self.status(name), self._slot(name), markers[c["database"]]) for name, c in waiting.items()}
                raise TimeoutError(f"Debezium not caught up after {timeout_s:.0f} s: (status, (slot active, confirmed_flush_lsn), "
                                   f"marker LSN) {detail}\n{self._log_tail()}")
            time.sleep(0.05)

    def remove_connector(self, name: str, timeout_s: float = 30) -> None:
        """Stops and deletes the connector, resets its offsets (the name can be used again, from a
        snapshot), and drops its replication slot and publication (a slot left behind keeps WAL)."""
        connector = self.connectors.pop(name)
        try:
            self._rest("PUT", f"/connectors/{_quote(name)}/stop")
            deadline = time.monotonic() + timeout_s
            while self.status(name)["connector"]["state"] != "STOPPED" and time.monotonic() < deadline:
                time.sleep(0.1)
            self._rest("DELETE", f"/connectors/{_quote(name)}/offsets")
        finally:
            self._rest("DELETE", f"/connectors/{_quote(name)}")
        deadline = time.monotonic() + timeout_s
        while True:  # the walsender ends once the task has closed its replication connection
            rows = self.postgres.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (connector["slot"],))
            if not rows:
                break
            if rows[0][0] is None:
                self.postgres.execute("SELECT pg_drop_replication_slot(%s)", (connector["slot"],))
                break
            if time.monotonic() > deadline:
                self.postgres.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
            time.sleep(0.1)
        from psycopg import sql

        self.postgres.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(connector["publication"])),
                              database=connector["database"])


def main() -> int:
    """A broker, PostgreSQL and a Connect worker with Debezium, by hand; a connector with
    `--database NAME --prefix PREFIX` (the database is created when missing)."""
    import argparse

    from tests.kafka.env import KafkaBroker
    from tests.postgres.env import PostgresServer

    parser = argparse.ArgumentParser(prog="python -m tests.kafka.connect", description=main.__doc__)
    parser.add_argument("--database", help="also register a connector reading this database (all its tables)")
    parser.add_argument("--prefix", default="cdc", help="the connector's topic prefix (default: cdc)")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pipe-cdc-"))
    broker = KafkaBroker(root / "kafka")
    postgres = PostgresServer(root / "postgres")
    connect = None
    try:
        connect = DebeziumConnect(root / "connect", broker, postgres)
        if options.database:
            if not postgres.query("SELECT 1 FROM pg_database WHERE datname = %s", (options.database,)):
                postgres.create_database(options.database)
            connect.add_connector(options.database, options.database, options.prefix)
        print(f"Kafka {KAFKA_VERSION} at {broker.bootstrap}\n"
              f"PostgreSQL at {postgres.host}:{postgres.port}: psql '{postgres.dsn(options.database or 'postgres')}'\n"
              f"Kafka Connect {KAFKA_VERSION} + Debezium {DEBEZIUM_VERSION} at {connect.url} (curl {connect.url}/connectors)"
              + (f", connector {options.database!r}: topics {options.prefix}.<schema>.<table>" if options.database else "")
              + f"\nlogs and data in {root}; Ctrl-C stops them", flush=True)
        connect.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if connect is not None:
            connect.stop()
        postgres.remove()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
