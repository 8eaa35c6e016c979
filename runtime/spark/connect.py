"""pipe's session as a Spark Connect client: of a server the target names (`spark.remote:
sc://host:port` in its Spark settings, or SPARK_REMOTE), or of the project's own local server
(`pipe server start`, runtime/spark/server.py).

Over Connect pipe has no JVM and no SparkContext in its process: runtime/spark/api.py gives the
steps what they need in Connect's terms. The session's settings are the runtime-settable ones of
the target (SQL settings); settings the server fixes when it starts (memory, master, jars) are
the server's. pipe's own code reaches the server's Python workers as an artifact of the session
(`addArtifacts`, the zip runtime/spark/cluster.py builds), and their Python is checked once, as on a
cluster, unless the server is pipe's own (its workers run this very Python)."""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import threading
from typing import Any, Mapping

from runtime.spark import cluster
from runtime.errors import RunError

# Runtime settings every Connect session of pipe gets (the target's own win): the SQL settings of
# the classic defaults (runtime/spark/settings.py).
CONNECT_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

_lock = threading.Lock()
_session = None  # this process's Connect session
_url = ""


# PySpark's client retries an unavailable server for more than ten minutes (15 retries, backoff up
# to a minute): a server that went away hung a run that long. pipe's sessions retry for about
# RETRY_BUDGET_S (8 retries, backoff up to 5 s), and not at all once the server is gone (its JVM
# exited, or its port refuses connections).
RETRY_BUDGET_S = 30
_START_HINT = "start it (`pipe server start` for a local one), or check spark.remote in the target and SPARK_REMOTE"


class ConnectError(RunError):
    """The Connect server cannot be reached or lacks what pipe needs; `hint` says what to do."""


def remote_of(conf: Mapping[str, Any] | None, environ: Mapping[str, str]) -> str:
    """The Connect server a target names: `spark.remote` in its Spark settings, else SPARK_REMOTE;
    "" for none."""
    return str((conf or {}).get("spark.remote") or environ.get("SPARK_REMOTE") or "")


def get_session(url: str, conf: Mapping[str, Any] | None = None, *, reads_s3: bool = False, reads_kafka: bool = False, own=None):
    """A Connect session with the server at `url` (sc://host:port): the same one on later calls.
    `own`: the server is pipe's own local one (its runtime/spark/server.py ServerState): its Python
    workers are this Python and import pipe as this process does, and the sessions are its fixed
    ones, whose workers stay warm between commands. Raises ConnectError when the server cannot be
    reached, cluster.ExecutorPythonError when its Python workers cannot run pipe's tasks."""
    global _session, _url, _settings, _pool
    with _lock:
        if _session is not None and _url == url and not _session.is_stopped:
            return _session
        # PySpark's functions build Connect columns in a process so marked (as its own builder does)
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        _settings = {**CONNECT_DEFAULTS, **{k: str(v) for k, v in (conf or {}).items()
                                            if k not in ("spark.remote", "spark.master", "spark.app.name")}}
        if own is not None:
            _pool = _Pool(own)
            spark = _pool.claim("main")
        else:
            spark = _open(url)
            try:
                cluster.ship_connect(spark, needs_boto3=reads_s3, needs_kafka=reads_kafka)
            except BaseException:
                _release(spark)
                raise
        _session, _url = spark, url
        return spark


def _reachable(url: str, timeout_s: float = 10.0) -> None:
    """Raises ConnectError unless the server's port takes a connection: PySpark's client retries
    an unreachable server for many minutes before it gives up."""
    where = url[len("sc://"):].split("/", 1)[0]
    host, _, port = where.rpartition(":") if where.rpartition(":")[2].isdigit() else (where, "", "15002")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConnectError(f"cannot reach the Spark Connect server at sc://{where}: {exc.strerror or exc}",
                           _START_HINT) from exc


def _open(url: str):
    """A session with its settings applied; its first call reaches the server, or fails here."""
    from pyspark.sql.connect.session import SparkSession

    _reachable(url)
    try:
        spark = SparkSession.builder.remote(url).create()
        _opened.append(spark)
        _bound_retries(spark)
        first, *rest = _settings.items()  # the first call: reaches the server, or fails here
        spark.conf.set(*first)
    except Exception as exc:  # noqa: BLE001 - gRPC and Connect errors: one line
        raise ConnectError(f"cannot reach the Spark Connect server at {url.split('/;')[0]}: {_first_line(exc)}",
                           _START_HINT) from exc
    for k, v in rest:
        try:
            spark.conf.set(k, v)
        except Exception:  # noqa: BLE001 - a static setting: the server's own value stands
            pass
    return spark


class _Pool:
    """The fixed sessions of pipe's own server that this process uses: `main`, and one per step
    running at the same time. A session is this process's while it holds the lock of its name
    (another command of the same project may run at the same time and take the next name), and
    keeps its Python workers warm for the next command that takes it."""

    def __init__(self, state):
        self.state = state
        self.free: list = []  # step sessions this process took and no step uses now
        self.taken: dict[int, object] = {}  # id(session) -> its lock file, held until exit
        self.views: dict[int, set[str]] = {}  # id(session) -> the temporary views a step made in it
        self.lock = threading.Lock()

    def claim(self, prefix: str):
        from runtime.spark import server

        folder = server.lease_dir(self.state)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # in servers/, this user's only
        for n in range(256):
            name = prefix if n == 0 else f"{prefix}-{n}"
            held = open(folder / f"{name}.lock", "a+b")  # noqa: SIM115 - held while the session is ours
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                held.close()
                continue
            try:
                spark = _open(self.state.session_url(name))
            except BaseException:
                held.close()
                raise
            spark.release_session_on_close = False  # a fixed session lives on for the next command
            self.taken[id(spark)] = held
            return spark
        raise ConnectError("256 commands of this project use its pipe server at the same time", "wait for some to end")

    def checkout(self):
        """A step session: one this process used before, else the next fixed one free."""
        with self.lock:
            spark = self.free.pop() if self.free else None
        return spark if spark is not None else self.claim("step")

    def give_back(self, spark) -> None:
        """The step is over: its temporary views go (and with them what they kept cached on the
        server), so that the session is as clean for the next step or command that takes it."""
        with self.lock:
            views = self.views.pop(id(spark), set())
        try:
            for name in sorted(views):
                # a SQL command, run every time: the server's plan cache keeps the outcome of a
                # catalog call such as dropTempView per session, so the same drop a second time in
                # this fixed session would not run again (and the view would stay)
                spark.sql(f"DROP VIEW IF EXISTS `{name.replace('`', '``')}`")
            spark.clearTags()
        except Exception:  # noqa: BLE001 - a session that cannot be cleaned is not taken again here
            return
        with self.lock:
            self.free.append(spark)


_settings: dict[str, str] = {}
_pool: _Pool | None = None
_opened: list = []  # the sessions this process opened


@atexit.register
def _close_all() -> None:
    """Closes the sessions' channels before the interpreter exits. Left to the sessions' own
    finalizers, a process with two or more of them hangs at exit (PySpark 4.3's client closing a
    gRPC channel from __del__); fixed sessions stay open on the server for the next command."""
    while _opened:
        spark = _opened.pop()
        try:
            spark.client.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def is_own_server() -> bool:
    """Whether this process's Connect session is of pipe's own local server (`pipe server`), which
    runs on this machine, in the project's folder, with the target's local master."""
    return _pool is not None


def step_session(spark, tag: str):
    """A session of its own for a step (runtime/spark/api.py), tagged `tag`: a fixed one on pipe's
    own server, else a clone of `spark` (its settings and shipped code)."""
    if _pool is not None:
        session = _pool.checkout()
    else:
        session = clone(spark)
    session.addTag(tag)
    return session


def remember_view(session, name: str) -> None:
    """A step made the temporary view `name` in `session`: dropped when the step gives a fixed
    session back (a cloned one goes with its views)."""
    if _pool is not None and id(session) in _pool.taken:
        with _pool.lock:
            _pool.views.setdefault(id(session), set()).add(name)


def end_step_session(session) -> None:
    """A step is over: its fixed session goes back to the pool, a clone is released."""
    if _pool is not None and id(session) in _pool.taken:
        _pool.give_back(session)
        return
    for release in (session.client.release_session, session.client.close):
        try:
            release()
        except Exception:  # noqa: BLE001 - best effort; the server expires idle sessions
            pass


def clone(spark):
    """A new session on the server with the settings and shipped code of `spark`."""
    try:
        return _bound_retries(spark.cloneSession())
    except Exception as exc:  # noqa: BLE001 - an older client or server
        raise ConnectError(f"the Spark Connect server cannot clone a session ({_first_line(exc)}), which pipe needs to run a step",
                           "use a Spark Connect server and pyspark of version 4.1 or newer") from exc


def _bound_retries(spark):
    """`spark` with pipe's retries (RETRY_BUDGET_S) instead of PySpark's default ones."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    class Policy(DefaultPolicy):
        def __init__(self):
            super().__init__(max_retries=8, max_backoff=5000)

        def can_retry(self, e: BaseException) -> bool:
            return super().can_retry(e) and _server_answers()

    spark.client.set_retry_policies([Policy()])
    return spark


def _server_answers(timeout_s: float = 2.0) -> bool:
    """Whether this process's Connect server is still there: its JVM lives (pipe's own server)
    and its port takes a connection."""
    from runtime.host import alive

    own = _pool.state if _pool is not None else None
    if own is not None and not alive(own.server_pid):
        return False
    where = (_url or "")[len("sc://"):].split("/", 1)[0]
    if not where:
        return True
    host, _, port = where.rpartition(":") if where.rpartition(":")[2].isdigit() else (where, "", "15002")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


_LOST_MARKS = ("UNAVAILABLE", "RETRIES_EXCEEDED", "Socket closed", "Connection refused", "failed to connect", "Connection reset")


def lost_server(exc: BaseException) -> tuple[str, str] | None:
    """When `exc` is the loss of this process's Connect server (it went away while a step ran):
    (what happened, what to do); else None."""
    if _session is None:
        return None
    texts, seen = [], exc
    for _ in range(5):  # the chain: pipe's own errors wrap Spark's
        if seen is None:
            break
        texts.append(f"{type(seen).__name__} {seen}")
        seen = seen.__cause__ or seen.__context__
    if not any(mark in text for text in texts for mark in _LOST_MARKS) or _server_answers():
        return None
    where = _url.split("/;")[0]
    if _pool is not None:
        return (f"the pipe server at {where} went away (its Spark is gone)",
                f"nothing of the steps that had not finished was committed: the next run rolls their writes back and reads "
                f"their input again. It runs on embedded Spark, or on a new server after `pipe server start`; the server's "
                f"log is {_pool.state.log}")
    return (f"the Spark Connect server at {where} went away (it no longer answers)",
            "nothing of the steps that had not finished was committed: the next run rolls their writes back and reads their "
            "input again. Start the server again, or check spark.remote in the target and SPARK_REMOTE")


def _release(spark) -> None:
    try:
        spark.stop()  # releases its state on the server
    except Exception:  # noqa: BLE001 - best effort: the server expires idle sessions
        pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]
