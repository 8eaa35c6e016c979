"""One SparkSession per process, built from the target's settings, with quiet local defaults.

Before Spark starts, pipe finds a Java it can run and checks its version (runtime/spark/java.py).
Anything that keeps Spark from starting (no Java, an old one, a Java process that dies at start,
a bad master URL) is raised as a `SparkStartError` that says what happened and what to do, never
as a Py4J or PySpark traceback: what the driver JVM printed is held back while it starts, and
its last lines go into the error.

Local mode (runtime/spark/settings.py): shuffle partitions sized to the cores, the UI off, Spark's
logs down to warnings (runtime/spark/log4j2.properties, which also drops the start-up chatter), the driver bound to the
loopback address, and Python workers that are this very interpreter (PYSPARK_PYTHON =
sys.executable, unless the target sets spark.pyspark.python). `get_spark` called again in the
same process returns the same session.

Any other master (standalone, YARN, Kubernetes; this process is the driver, client mode): the
same quiet logs and no console progress bars, pipe's code shipped to the executors and their
Python checked before anything is written (runtime/spark/cluster.py)."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import sys
import threading
from typing import Any, Iterator, Mapping

from runtime.spark import class_archive, cluster
from runtime.spark.java import (
    Java, SparkStartError, check_java_version, find_java, hint_for, home_for_spark, java_message, supported_java_majors,
)
from runtime.spark.settings import spark_properties_file, spark_settings, submit_args

log = logging.getLogger(__name__)

# Lines the driver JVM prints at every start that say nothing about the pipeline.
_JAVA_NOISE = (
    "WARNING: Using incubator modules:",
    "Using Spark's default log4j profile:",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel(newLevel).",
)

_lock = threading.RLock()


# --------------------------------------------------------------------------------------------
# The driver JVM's stderr


class _JavaOutput:
    """Reads what the driver JVM prints on stderr. While Spark starts, the lines are held back (a
    failed start is reported once, in SparkStartError, with the last of them); once it is up, they
    are passed through to this process's stderr. Start-up noise (_JAVA_NOISE) is dropped."""

    def __init__(self, stream):
        self._stream = stream
        self._lock = threading.Lock()
        self._held: collections.deque[bytes] = collections.deque(maxlen=1000)
        self._tail: collections.deque[str] = collections.deque(maxlen=200)
        self._live = False
        self._thread = threading.Thread(target=self._pump, name="pipe-java-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    if text.startswith(_JAVA_NOISE):
                        continue
                    self._tail.append(text)
                    if self._live:
                        _to_stderr(raw)
                    else:
                        self._held.append(raw)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self._stream.close()

    def go_live(self) -> None:
        with self._lock:
            for raw in self._held:
                _to_stderr(raw)
            self._held.clear()
            self._live = True

    def last_lines(self, n: int = 60, wait: float = 0.0) -> list[str]:
        if wait:
            self._thread.join(wait)
        with self._lock:
            lines = [ln for ln in self._tail if ln.strip()]
        return lines[-n:]


def _to_stderr(raw: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        while raw:
            raw = raw[os.write(2, raw):]


_java_output: _JavaOutput | None = None


def _gateway_exited(exc: BaseException) -> bool:
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    return (condition is not None and condition() == "JAVA_GATEWAY_EXITED") or "Java gateway process exited" in str(exc)


_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")


def _exited_error(java: Java | None, lines: list[str]) -> SparkStartError:
    which = f" ({java.describe()})" if java else ""
    hint = hint_for(lines)
    lines = [ln for ln in lines if not _STACK_FRAME.match(ln)][-12:]  # the exceptions, not their stacks
    if lines:
        said = "\n".join(f"    {ln.rstrip()}" for ln in lines)
        message = f"the Java process that runs Spark exited before Spark started{which}. It printed:\n{said}"
    else:
        message = f"the Java process that runs Spark exited before Spark started{which}, and printed nothing"
    if hint is None and java is not None and java.major not in supported_java_majors():
        names = " or ".join(str(m) for m in supported_java_majors())
        hint = f"this Spark supports Java {names}; install one and point JAVA_HOME at it"
    return SparkStartError(message, hint)


# --------------------------------------------------------------------------------------------
# Starting Spark


def _launch_gateway(settings: Mapping[str, str], java: Java | None) -> None:
    """Starts the driver JVM as PySpark would, but with its stderr going through _JavaOutput, so
    that a failed start can say what Java printed."""
    global _java_output
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    read_fd, write_fd = os.pipe()
    output = _JavaOutput(os.fdopen(read_fd, "rb", buffering=0))
    try:
        # the settings (s3a keys among them) in a file of this user's, not as --conf on the
        # command line of spark-submit and the JVM, where `ps` shows them to every local user
        with spark_properties_file(settings) as properties, _environ({"PYSPARK_SUBMIT_ARGS": submit_args(properties)}):
            gateway = launch_gateway(SparkConf(loadDefaults=False), popen_kwargs={"stderr": write_fd})
    except SystemExit as exc:  # pyspark's find_spark_home exits when SPARK_HOME is unusable
        raise SparkStartError(
            f"Spark's own files were not found (SPARK_HOME={os.environ.get('SPARK_HOME', 'not set')})",
            "unset SPARK_HOME (pyspark brings its own Spark) or point it at a Spark 4 installation",
        ) from exc
    except OSError as exc:
        raise SparkStartError(f"could not run Spark's launcher (spark-submit): {exc}",
                              "reinstall pyspark, or unset SPARK_HOME if it points at another Spark") from exc
    except Exception as exc:
        if _gateway_exited(exc):
            os.close(write_fd)
            write_fd = -1
            raise _exited_error(java, output.last_lines(wait=5)) from exc
        raise
    finally:
        if write_fd >= 0:
            os.close(write_fd)
    _java_output = output
    SparkContext._ensure_initialized(gateway=gateway)


@contextlib.contextmanager
def _environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """os.environ with `changes` (None: unset) while Spark's processes are started, then as before."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _live_session():
    from pyspark.sql import SparkSession

    session = getattr(SparkSession, "_instantiatedSession", None)
    if session is not None and getattr(getattr(session, "_sc", None), "_jsc", None) is not None:
        return session
    return None


def _jvm_running() -> bool:
    from pyspark.core.context import SparkContext

    return getattr(SparkContext, "_gateway", None) is not None


def _apply_runtime_conf(spark, conf: Mapping[str, Any] | None) -> None:
    """On the running session, the given settings that can change at runtime (SQL settings)."""
    for k, v in (conf or {}).items():
        with contextlib.suppress(Exception):
            if spark.conf.get(k, None) != str(v) and spark.conf.isModifiable(k):
                spark.conf.set(k, str(v))


def _get_or_create(builder, java: Java | None):
    try:
        return builder.getOrCreate()
    except Exception as exc:
        if _gateway_exited(exc):
            lines = _java_output.last_lines(wait=5) if _java_output is not None else []
            raise _exited_error(java, lines) from exc
        from py4j.protocol import Py4JError, Py4JJavaError
        from pyspark.errors import PySparkException

        if isinstance(exc, Py4JJavaError):
            message = java_message(exc)
            raise SparkStartError(f"creating the Spark session failed: {message}", hint_for([message])) from exc
        if isinstance(exc, (Py4JError, PySparkException)):
            raise SparkStartError(f"creating the Spark session failed: {exc}") from exc
        raise


def get_spark(master: str = "local[*]", conf: Mapping[str, Any] | None = None, app_name: str = "pipe", *,
              reads_s3: bool = False, reads_kafka: bool = False, remote: str = "", own_server=None, packages: tuple[str, ...] = ()):
    """The SparkSession of this process: started on the first call (see the module's docstring),
    the same one on later calls (which apply the runtime-settable entries of `conf` to it).
    On a master that is not local, pipe's code is shipped to the executors and their Python is
    checked (runtime/spark/cluster.py; `reads_s3`: the tasks also read or write S3 with boto3;
    `reads_kafka`: they read Kafka with confluent-kafka). `packages`: Maven coordinates of jars
    the run's sources need (a JDBC driver), added to `spark.jars.packages` when Spark starts here.
    `remote` (sc://host:port; by default `spark.remote` of `conf`, else SPARK_REMOTE): a Spark
    Connect session with that server instead (runtime/spark/connect.py; `own_server`: the state of
    pipe's own server, runtime/spark/server.py).
    Raises SparkStartError when Spark cannot start, cluster.ExecutorPythonError when the
    executors' Python cannot run pipe's tasks."""
    from runtime.spark import connect

    remote = remote or connect.remote_of(conf, os.environ)
    if remote.startswith("sc://"):
        try:
            return connect.get_session(remote, conf, reads_s3=reads_s3, reads_kafka=reads_kafka, own=own_server)
        except connect.ConnectError as exc:
            raise SparkStartError(str(exc), exc.hint) from exc
    with _lock:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        existing = _live_session()
        if existing is not None:
            _apply_runtime_conf(existing, conf)
            return existing

        settings = spark_settings(master, conf, app_name)
        wanted = [p for p in packages if p not in (settings.get("spark.jars.packages") or "").split(",")]
        if wanted:  # Spark fetches them from Maven Central (or the repositories the settings name), as --packages does
            settings["spark.jars.packages"] = ",".join(p for p in [settings.get("spark.jars.packages"), *wanted] if p)
        remote = settings.get("spark.remote") or os.environ.get("SPARK_REMOTE") or ""
        api_mode = settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", "")).lower()
        classic = not remote and api_mode != "connect" and "SPARK_CONNECT_MODE_ENABLED" not in os.environ
        # A local JVM is started unless Spark Connect talks to a remote server or one already runs.
        needs_java = not remote.startswith("sc://") and "PYSPARK_GATEWAY_PORT" not in os.environ and not _jvm_running()

        java: Java | None = None
        env: dict[str, str | None] = {}
        if needs_java:
            java = find_java()
            check_java_version(java)
            env["JAVA_HOME"] = home_for_spark(java)  # None: unset, Spark's launcher then runs `java` on PATH
            if not os.environ.get("SPARK_LOCAL_IP"):
                if master.startswith("local") and "spark.driver.host" not in settings and "spark.driver.bindAddress" not in settings:
                    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # local mode needs no network; also no hostname warning
                elif settings.get("spark.driver.host") and not settings.get("spark.driver.bindAddress"):
                    # the address the target names for the driver, not a guess from the hostname (and its warning)
                    env["SPARK_LOCAL_IP"] = settings["spark.driver.host"]

        if settings.get("spark.pyspark.python"):
            # PySpark takes the executors' Python from PYSPARK_PYTHON when the context starts;
            # spark.pyspark.python is Spark's setting for it and wins, as with spark-submit.
            env["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]

        if classic and cluster.is_local(master) and settings.get("spark.pyspark.python") in (None, "", sys.executable) and \
                os.environ.get("PYSPARK_PYTHON") == sys.executable:
            # the workers run this very Python: each is forked with pipe's task packages already
            # imported (runtime/worker_daemon.py), instead of importing them itself
            settings.setdefault("spark.python.daemon.module", "runtime.worker_daemon")
        archive = class_archive.plan(java, settings) if needs_java and classic else None
        if archive is not None:  # the driver's classes mapped from an archive (class_archive.py)
            settings = class_archive.with_option(settings, archive)
        builder = SparkSession.builder.master(master).appName(app_name)
        for k, v in settings.items():
            if k not in ("spark.master", "spark.app.name"):
                builder = builder.config(k, v)
        with _environ(env):
            if needs_java and classic:
                _launch_gateway(settings, java)
                if archive is not None:
                    from pyspark.core.context import SparkContext

                    class_archive.finish_at_exit(archive, getattr(SparkContext._gateway, "proc", None))
            spark = _get_or_create(builder, java)
        if _java_output is not None:
            _java_output.go_live()
        if classic:
            spark.sparkContext.setLogLevel("WARN")
            if not cluster.is_local(master):
                try:
                    cluster.ship(spark, needs_boto3=reads_s3, needs_kafka=reads_kafka)
                except BaseException:
                    spark.stop()  # frees the cluster's cores at once; the run stops here
                    raise
        return spark
