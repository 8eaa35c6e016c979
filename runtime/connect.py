"""pipe's session as a Spark Connect client: of a server the target names (`spark.remote:
sc://host:port` in its Spark settings, or SPARK_REMOTE), or of the project's own local server
(`pipe server start`, runtime/server.py).

Over Connect pipe has no JVM and no SparkContext in its process: runtime/spark_api.py gives the
steps what they need in Connect's terms. The session's settings are the runtime-settable ones of
the target (SQL settings); settings the server fixes when it starts (memory, master, jars) are
the server's. pipe's own code reaches the server's Python workers as an artifact of the session
(`addArtifacts`, the zip runtime/cluster.py builds), and their Python is checked once, as on a
cluster, unless the server is pipe's own (its workers run this very Python)."""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from runtime import cluster

# Runtime settings every Connect session of pipe gets (the target's own win): the SQL settings of
# the classic defaults (runtime/session.py).
CONNECT_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

_lock = threading.Lock()
_session = None  # this process's Connect session
_url = ""


class ConnectError(RuntimeError):
    """The Connect server cannot be reached or refused the session; `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def remote_of(conf: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str:
    """The Connect server a target names: `spark.remote` in its Spark settings, else SPARK_REMOTE;
    "" for none."""
    return str((conf or {}).get("spark.remote") or environ.get("SPARK_REMOTE") or "")


def current():
    """This process's Connect session, or None."""
    return _session


def get_session(url: str, conf: Mapping[str, Any] | None = None, *, reads_s3: bool = False, own_server: bool = False):
    """A Connect session with the server at `url` (sc://host:port): the same one on later calls.
    `own_server`: the server is pipe's own local one, whose Python workers are this Python and
    import pipe as this process does. Raises ConnectError when the server cannot be reached,
    cluster.ExecutorPythonError when its Python workers cannot run pipe's tasks."""
    global _session, _url
    from pyspark.sql.connect.session import SparkSession

    with _lock:
        if _session is not None and _url == url and not _session.is_stopped:
            return _session
        settings = {**CONNECT_DEFAULTS, **{k: str(v) for k, v in (conf or {}).items()
                                           if k not in ("spark.remote", "spark.master", "spark.app.name")}}
        # PySpark's functions build Connect columns in a process so marked (as its own builder does)
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        try:
            spark = SparkSession.builder.remote(url).create()
            spark.conf.set("spark.sql.session.timeZone", "UTC")  # the first call: reaches the server, or fails here
        except Exception as exc:  # noqa: BLE001 - gRPC and Connect errors: one line
            raise ConnectError(f"cannot reach the Spark Connect server at {url}: {_first_line(exc)}",
                               "start it (`pipe server start` for a local one), or check spark.remote in the target "
                               "and SPARK_REMOTE") from exc
        for k, v in settings.items():
            try:
                spark.conf.set(k, v)
            except Exception:  # noqa: BLE001 - a static setting: the server's own value stands
                pass
        if not own_server:
            try:
                cluster.ship_connect(spark, needs_boto3=reads_s3)
            except BaseException:
                _release(spark)
                raise
        _session, _url = spark, url
        return spark


def stop() -> None:
    """Ends this process's Connect session (the server goes on)."""
    global _session
    with _lock:
        if _session is not None:
            _release(_session)
            _session = None


def _release(spark) -> None:
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - best effort: the server expires idle sessions
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]
