"""A schema registry speaking Confluent's API, for the tests of Avro change events: Apicurio
Registry (a Quarkus application) from Maven Central (tests/registry/pom.xml: its own distribution,
a runner jar beside lib/), fetched once into <repo>/.kafka/apicurio-registry-<version>/ (git
ignores .kafka/), started on a free loopback port with in-memory storage (H2 inside the JVM:
nothing on disk, everything gone when it stops).

Its Confluent-compatible API is `url` (http://127.0.0.1:PORT/apis/ccompat/v7): `GET
/schemas/ids/{id}`, `POST /subjects/{subject}/versions`, `GET /subjects`... There an id is
Apicurio's contentId (one id per distinct schema text, as Confluent's ids), and a subject is an
artifact of the default group. `api_url` (…/apis/registry/v2) is Apicurio's own API, which its
Kafka Connect converter speaks (tests/kafka/connect.py: `add_connector(..., avro_registry=...)`
writes Avro in Confluent's wire format through it).

One per test session and worker (the `schema_registry` fixture of tests/conftest.py); it takes
about 10-20 s to start on 2 busy cores. By hand:

    python -m tests.registry.env       # fetches it if needed, starts one, prints its URLs

`jars()` is idempotent and quick when the registry is there; a file lock keeps two pytest
processes from fetching at once."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from tests.jvm_options import FIRST_TIER_JIT, SERIAL_GC
from tests.kafka import env as kafka_env
from tests.kafka.env import SetupError, _free_port, _java

VERSION = "2.6.13.Final"  # also the converter's, tests/kafka/connect-pom.xml
POM = Path(__file__).resolve().parent / "pom.xml"
RUNNER = f"apicurio-registry-app-{VERSION}-runner.jar"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def folder() -> Path:
    return kafka_env.HOME / f"apicurio-registry-{VERSION}"


def _fetch(where: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise SetupError("the schema registry tests need Maven (`mvn` on PATH) to fetch Apicurio Registry from Maven Central")
    part = where.with_name(where.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    download = part.with_name(part.name + "-zip")
    shutil.rmtree(download, ignore_errors=True)
    args = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dapicurio.version={VERSION}",
            f"-DoutputDirectory={download}", "-DincludeScope=runtime"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"fetching Apicurio Registry {VERSION} failed ({' '.join(args)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    archive = download / f"apicurio-registry-app-{VERSION}-all.zip"
    if not archive.is_file():
        raise SetupError(f"mvn did not leave {archive.name} in {download}")
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(part)
    shutil.rmtree(download, ignore_errors=True)  # the zip stays in Maven's local repository
    if not (part / RUNNER).is_file():
        raise SetupError(f"{archive.name} has no {RUNNER}")
    (part / ".complete").write_text("")
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)


def jars() -> Path:
    """The registry's folder (the runner jar and lib/), fetched on first use (under a lock)."""
    where = folder()
    if not (where / ".complete").is_file():
        kafka_env.HOME.mkdir(parents=True, exist_ok=True)
        with open(kafka_env.HOME / ".registry-setup.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (where / ".complete").is_file():
                _fetch(where)
    return where


class RegistryError(RuntimeError):
    pass


class SchemaRegistry:
    """A running Apicurio Registry, in memory. `url`: Confluent's API (…/apis/ccompat/v7);
    `api_url`: Apicurio's own (…/apis/registry/v2, for its converter); `stop()` ends it."""

    def __init__(self, workdir: Path, timeout_s: float = 180):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = jars()
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/apis/ccompat/v7"
        self.api_url = f"{self.base}/apis/registry/v2"
        self.log = self.workdir / "registry.log"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self.start(timeout_s)

    def start(self, timeout_s: float = 180) -> None:
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.http.access-log.enabled": "false",  # a line per request otherwise
            "quarkus.console.color": "false",  # a log file, not a terminal
        }
        args = [_java(), "-Xmx384m", FIRST_TIER_JIT, SERIAL_GC, *(f"-D{k}={v}" for k, v in settings.items()),
                "-jar", str(self.home / RUNNER)]
        started = time.monotonic()
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = started + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise SetupError(f"Apicurio Registry did not start (exit {self.proc.returncode}):\n{self._log_tail()}")
            try:
                self.get("/subjects", timeout=2)
                break
            except (OSError, RegistryError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise SetupError(f"Apicurio Registry did not answer on {self.url} within {timeout_s:.0f} s:\n{self._log_tail()}") from None
                time.sleep(0.3)
        self.startup_s = time.monotonic() - started

    def stop(self, timeout_s: float = 30) -> None:
        kafka_env.stop_process(self.proc, timeout_s)

    def _log_tail(self) -> str:
        return kafka_env.log_tail(self.log)

    # --- Confluent's API ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body=None, timeout: float = 30):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')[:2000]}") from None
        return json.loads(text) if text else None

    def get(self, path: str, timeout: float = 30):
        """GET `path` of Confluent's API (`/subjects`, `/schemas/ids/1`...), parsed."""
        return self._request("GET", path, timeout=timeout)

    def schema(self, schema_id: int) -> dict:
        """The Avro schema of id `schema_id` (GET /schemas/ids/{id}), parsed from its JSON text."""
        return json.loads(self.get(f"/schemas/ids/{schema_id}")["schema"])

    def register(self, subject: str, schema: dict) -> int:
        """Registers an Avro schema under `subject` (POST /subjects/{subject}/versions); its id."""
        from urllib.parse import quote

        return self._request("POST", f"/subjects/{quote(subject, safe='')}/versions", {"schema": json.dumps(schema)})["id"]


def main() -> int:
    where = jars()
    registry = SchemaRegistry(Path(tempfile.mkdtemp(prefix="pipe-registry-")))
    print(f"Apicurio Registry {VERSION} ({where}) started in {registry.startup_s:.1f} s:\n"
          f"  Confluent's API at {registry.url} (curl {registry.url}/subjects)\n"
          f"  Apicurio's at {registry.api_url}\n"
          f"log in {registry.log}; Ctrl-C stops it", flush=True)
    try:
        registry.proc.wait()
    except KeyboardInterrupt:
        registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
