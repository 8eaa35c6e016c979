"""An Apache Kafka broker for the tests: Kafka's own jars from Maven Central (tests/kafka/pom.xml,
fetched once into <repo>/.kafka, which git ignores), started in KRaft mode (one process that is
broker and controller) on free loopback ports, with its data in a temporary folder.

One per test session and worker (the `kafka` fixture of tests/conftest.py). By hand:

    python -m tests.kafka.env          # fetches the jars if needed, starts a broker, prints its address

`jars()` is idempotent and quick when the jars are there; a file lock keeps two pytest processes
from fetching at once."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.jvm_options import FIRST_TIER_JIT, SERIAL_GC

REPO = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("PIPE_KAFKA_HOME", REPO / ".kafka"))
POM = Path(__file__).resolve().parent / "pom.xml"
VERSION = "4.1.0"
_QUIET = logging.getLogger("tests.kafka.client")  # librdkafka's logs (connection refused while a broker starts) go here, not to stderr


class SetupError(RuntimeError):
    pass


def folder() -> Path:
    return HOME / f"kafka-{VERSION}"


def _fetch(where: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise SetupError("the Kafka tests need Maven (`mvn` on PATH) to fetch Apache Kafka from Maven Central")
    part = where.with_name(where.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    args = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dkafka.version={VERSION}",
            f"-DoutputDirectory={part}", "-DincludeScope=runtime"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"fetching Apache Kafka {VERSION} failed ({' '.join(args)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    if not (part / f"kafka_2.13-{VERSION}.jar").is_file():
        raise SetupError(f"mvn did not leave kafka_2.13-{VERSION}.jar in {part}")
    (part / ".complete").write_text("")
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)


def jars() -> Path:
    """The folder of Kafka's jars, fetched on first use (under a lock)."""
    where = folder()
    if not (where / ".complete").is_file():
        HOME.mkdir(parents=True, exist_ok=True)
        with open(HOME / ".setup.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (where / ".complete").is_file():
                _fetch(where)
    return where


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 30) -> None:
    """Ends a service the tests started (SIGTERM, then SIGKILL after `timeout_s`); the broker,
    Kafka Connect and the schema registry stop this way."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_tail(path: Path, chars: int = 4000) -> str:
    """The end of a service's log, for a setup error."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


class KafkaBroker:
    """A running single-node Kafka (KRaft). `bootstrap` is its address; `stop()` ends it,
    `restart()` stops and starts it on the same ports and data (a broker restart mid-run)."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lib = jars()
        self.port, self.controller_port = _free_port(), _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.data = self.workdir / "data"
        self.config = self.workdir / "server.properties"
        self.config.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            # (Kafka's defaults for retention checks and segment deletion: the retention test
            # uses delete_records; log.segment.delete.delay.ms=0 made the broker's scheduler
            # threads spin, ~20 ms of CPU a second for each broker of the session, idle)
            "",
        ]))
        self.log = self.workdir / "broker.log"
        self._cp = f"{self.lib}/*"
        fmt = subprocess.run([_java(), SERIAL_GC, "-cp", self._cp, "kafka.tools.StorageTool", "format", "--standalone",
                              "-t", str(uuid.uuid4()).replace("-", "")[:22], "-c", str(self.config)],
                             capture_output=True, text=True)
        if fmt.returncode != 0:
            raise SetupError(f"formatting the broker's storage failed:\n{fmt.stdout[-2000:]}\n{fmt.stderr[-2000:]}")
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, timeout_s: float = 120) -> None:
        args = [_java(), "-Xmx512m", FIRST_TIER_JIT, SERIAL_GC, "-cp", self._cp, "kafka.Kafka", str(self.config)]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        from confluent_kafka.admin import AdminClient

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"the Kafka broker did not start (exit {self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                AdminClient({"bootstrap.servers": self.bootstrap, "logger": _QUIET}).list_topics(timeout=2)
                return
            except Exception:  # noqa: BLE001 - KafkaException while it starts
                time.sleep(0.3)
        self.stop()
        raise SetupError(f"the Kafka broker did not answer on {self.bootstrap} within {timeout_s:.0f} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_process(self.proc)

    def restart(self) -> None:
        self.stop()
        self._admin = None
        self.start()

    # --- what the tests do with it ---------------------------------------------------------------

    def admin(self):
        """An admin client, kept while the broker runs (a future of a client that is gone fails)."""
        from confluent_kafka.admin import AdminClient

        if getattr(self, "_admin", None) is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _QUIET})
        return self._admin

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        from confluent_kafka.admin import NewTopic

        for future in self.admin().create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                           config=config)]).values():
            future.result()

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        for future in self.admin().create_partitions([NewPartitions(name, total)]).values():
            future.result()

    def produce(self, topic: str, messages, partition: int | None = None, timestamp_ms: int | None = None) -> None:
        """`messages`: (key, value) pairs of bytes, str or None; sent and flushed (with the
        message timestamp `timestamp_ms` when given, else the producer's clock)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": "5", "enable.idempotence": "true", "logger": _QUIET})
        for i, (key, value) in enumerate(messages):
            kwargs = {"key": key.encode() if isinstance(key, str) else key,
                      "value": value.encode() if isinstance(value, str) else value}
            if partition is not None:
                kwargs["partition"] = partition
            if timestamp_ms is not None:
                kwargs["timestamp"] = timestamp_ms
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            if i % 10_000 == 0:
                producer.poll(0)
        left = producer.flush(60)
        if left:
            raise RuntimeError(f"{left} message(s) to {topic} were not delivered within 60 s")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Deletes the messages of a partition below offset `before` (as retention would)."""
        from confluent_kafka import TopicPartition

        for future in self.admin().delete_records([TopicPartition(topic, partition, before)]).values():
            future.result()


def main() -> int:
    where = jars()
    broker = KafkaBroker(Path(tempfile.mkdtemp(prefix="pipe-kafka-")))
    print(f"Kafka {VERSION} ({where}) at {broker.bootstrap}, data in {broker.data}; Ctrl-C stops it", flush=True)
    try:
        broker.proc.wait()
    except KeyboardInterrupt:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
