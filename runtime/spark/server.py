"""`pipe server`: a warm local Spark Connect server for one project and target.

A `pipe run` on embedded Spark starts a JVM, warms it up and starts Python workers, for seconds
of work on a handful of rows. `pipe server start` starts that JVM once, as a Spark Connect server
(the installed pyspark's own SparkConnectServer, with the target's Spark settings), and later
`pipe run`, `pipe show` and `pipe test` of the same project and target talk to it.

What keeps it safe and private:
- It listens on 127.0.0.1 only, on a port chosen free at start, and serves only clients that
  give its token: a random one per server, handed to Spark through the environment (never a
  command line), kept in the state file. The state file, the server's log and its Spark
  settings (a properties file while it starts, never `--conf` on a command line) are readable by
  this user only, in pipe's cache folder, which is this user's alone (runtime/host.py); so are
  the fixed sessions' ids.
- It is remembered per project folder and target, in a state file under pipe's cache folder
  (runtime/host.py cache_dir), with a fingerprint of the Spark settings it was started with:
  a command uses it only when the project folder, the target and the settings all match, so two
  projects, or a target whose settings changed, never share a server by accident.
- A supervisor process (this module run as `python -m runtime.spark.server`) owns the JVM: it stops it
  on `pipe server stop` (SIGTERM), when it has been idle for the idle timeout (no command has
  used it, and none that uses it is running), and forgets it if the JVM dies.

Python workers: Spark starts one set of Python worker processes per Connect session, and a new
session would import pandas and pyarrow again in each (seconds). pipe's commands therefore use a
fixed set of sessions on its own server (ids derived from the server's, one per concurrent
step), which keep their workers warm from one command to the next (runtime/spark/connect.py)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from runtime.errors import RunError
from runtime.host import UnsafeFolder, alive, cache_dir, private_dir, private_file
from runtime.spark import class_archive
from runtime.spark.cluster import SHIPPED_PACKAGES
from runtime.spark.java import find_java, home_for_spark
from runtime.spark.settings import spark_properties_file, spark_settings

IDLE_TIMEOUT_S = 3600  # an idle server stops after an hour (`pipe server start --idle-timeout`)
START_TIMEOUT_S = 180
_START_ATTEMPTS = 3  # a server that could not bind its port is started again on another one
_CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # Spark Connect's pre-shared token, server and client


class ServerError(RunError):
    """A server could not start; `hint` says what to do."""


@dataclass(frozen=True)
class ServerState:
    """What the state file remembers of a running server."""

    project: str  # the project folder, resolved
    target: str
    fingerprint: str  # of the Spark settings it was started with
    url: str  # sc://localhost:PORT (what pipe shows; the token is not in it)
    port: int
    supervisor_pid: int
    server_pid: int
    session_base: str  # a UUID: the fixed sessions' ids derive from it
    started_at: float
    idle_timeout_s: int
    log: str  # the server's log file
    master: str
    token: str  # clients give it (Spark Connect's pre-shared token); this user's only, as the file

    def session_id(self, name: str) -> str:
        """The id of the fixed session `name` ("main", "step-0", ...) on this server."""
        return str(uuid.uuid5(uuid.UUID(self.session_base), name))

    def session_url(self, name: str) -> str:
        """The connection string of the fixed session `name`, with the token: never shown. The
        host is `localhost`, for which PySpark sends a token over a local channel without TLS."""
        return f"{self.url}/;session_id={self.session_id(name)};token={self.token}"


def fingerprint(settings: Mapping[str, str]) -> str:
    """Of the Spark settings a server starts with, of the Python its workers run, and of pipe's
    code, which its Python workers imported when it started (an upgrade of pipe, or an edit of
    its code, needs a new server)."""
    text = json.dumps({"settings": dict(sorted(settings.items())), "python": this_python(), "code": code_stamp()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def code_stamp() -> str:
    """The names, sizes and modification times of the Python files of the packages the server's
    workers import (runtime/spark/cluster.py ships the same to clusters): a few milliseconds, no
    file read."""

    base = Path(__file__).resolve().parents[2]  # the folder holding runtime/ and compiler/
    digest = hashlib.sha256()
    for name in SHIPPED_PACKAGES:
        for path in sorted((base / name).rglob("*.py")):
            st = path.stat()
            digest.update(f"{path.relative_to(base)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def started_with(state: ServerState, master: str, conf: Mapping[str, Any] | None, project_name: str) -> bool:
    """Whether the server of `state` runs with the settings a target has now."""
    return state.fingerprint == fingerprint(server_settings(master, conf, project_name))


def state_dir() -> Path:
    """Where servers are remembered: a folder of this user's only (runtime/host.py private_dir).
    Raises ServerError when pipe's cache folder is not private."""
    try:
        return private_dir(cache_dir() / "servers")
    except UnsafeFolder as exc:
        raise ServerError(str(exc), exc.hint) from exc


def state_path(project: Path, target: str) -> Path:
    """The state file of the server of `project` and `target`."""
    key = hashlib.sha256(f"{Path(project).resolve()}\0{target}".encode()).hexdigest()[:16]
    return state_dir() / f"{key}.json"


def read_state(project: Path, target: str) -> ServerState | None:
    """The running server of `project` and `target`, or None (a stale state file is removed)."""
    path = state_path(project, target)
    try:
        state = ServerState(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if not (alive(state.supervisor_pid) and alive(state.server_pid)):
        path.unlink(missing_ok=True)
        return None
    return state


def touch(state: ServerState) -> None:
    """A command used the server now: its idle time starts again."""
    mark = lease_dir(state)
    mark.mkdir(mode=0o700, parents=True, exist_ok=True)
    (mark / "last_used").touch(mode=0o600)


def lease(state: ServerState) -> Path:
    """Marks this process as using the server until it exits (the idle timeout waits for it)."""
    path = lease_dir(state) / f"lease-{os.getpid()}"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.touch(mode=0o600)
    return path


def lease_dir(state: ServerState) -> Path:
    return state_dir() / f"{state.session_base}.d"


def idle_for(state: ServerState) -> float:
    """Seconds since a command last used the server; 0 while one runs."""
    folder = lease_dir(state)
    for lease_file in folder.glob("lease-*"):
        pid = int(lease_file.name.split("-", 1)[1])
        if alive(pid):
            return 0.0
        lease_file.unlink(missing_ok=True)
    try:
        last = (folder / "last_used").stat().st_mtime
    except OSError:
        last = state.started_at
    return max(0.0, time.time() - max(last, state.started_at))


# --------------------------------------------------------------------------------------------
# Starting and stopping


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listening_by(pid: int, port: int) -> bool:
    """Whether process `pid` itself listens on `port`. The port was free when pipe chose it, but
    another process may have taken it before the server bound it: then the server fails to
    start, and what answers on the port is not pipe's server, which must never get its token.
    Read from /proc (Linux); elsewhere, whether anything listens."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not all(t.exists() for t in tables[:1]):
        return _listening(port)
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def server_settings(master: str, conf: Mapping[str, Any] | None, project_name: str) -> dict[str, str]:
    """The settings of the server's Spark: those of an embedded session (runtime/spark/settings.py)."""

    settings = spark_settings(master, {k: v for k, v in (conf or {}).items() if k != "spark.remote"}, f"pipe server {project_name}")
    settings.setdefault("spark.pyspark.python", this_python())
    return settings


def this_python() -> str:
    """This Python, named the same whichever of its names (python, python3) started it."""
    candidate = Path(sys.prefix) / "bin" / "python"
    try:
        if candidate.exists() and candidate.samefile(sys.executable):
            return str(candidate)
    except OSError:
        pass
    return sys.executable


def start(project: Path, project_name: str, target: str, master: str, conf: Mapping[str, Any] | None, *,
          idle_timeout_s: int = IDLE_TIMEOUT_S) -> tuple[ServerState, bool]:
    """Starts the server of `project` and `target` (or finds it running with these settings):
    (its state, whether it was started now). Raises ServerError when it cannot start, or when
    one runs with other settings."""
    project = Path(project).resolve()
    settings = server_settings(master, conf, project_name)
    print_ = fingerprint(settings)
    running = read_state(project, target)
    if running is not None:
        if running.fingerprint == print_:
            return running, False
        raise ServerError(f"a pipe server for target {target} of this project runs with other Spark settings or another version of "
                          f"pipe's code ({running.url})",
                          "stop it with `pipe server stop`, then start it again")
    path = state_path(project, target)
    log = path.with_suffix(".log")
    # the request (the resolved Spark settings, secrets among them) goes through a pipe, not a file
    request = {"project": str(project), "target": target, "fingerprint": print_, "settings": settings,
               "idle_timeout_s": idle_timeout_s, "log": str(log), "state": str(path)}
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", _TOKEN_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")) if p)
    with open(private_file(log), "ab") as out:
        supervisor = subprocess.Popen([sys.executable, "-m", "runtime.spark.server"], stdin=subprocess.PIPE,
                                      stdout=out, stderr=out, env=env, start_new_session=True, cwd=str(project))
    with supervisor.stdin:
        supervisor.stdin.write(json.dumps(request).encode())
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state(project, target)
        if state is not None and state.supervisor_pid == supervisor.pid:
            return state, True
        if supervisor.poll() is not None:
            raise ServerError(f"the Spark Connect server did not start: {_last_error(log)}",
                              f"see its log, {log}")
        time.sleep(0.2)
    _terminate(supervisor.pid)
    raise ServerError(f"the Spark Connect server did not start within {START_TIMEOUT_S} s", f"see its log, {log}")


def stop(project: Path, target: str, timeout_s: float = 30) -> ServerState | None:
    """Stops the server of `project` and `target`; the state it had, or None if none ran."""
    state = read_state(Path(project).resolve(), target)
    if state is None:
        return None
    _terminate(state.supervisor_pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (alive(state.supervisor_pid) or alive(state.server_pid)):
        time.sleep(0.1)
    if alive(state.server_pid):
        _terminate(state.server_pid, signal.SIGKILL)
    state_path(Path(project), target).unlink(missing_ok=True)
    return state


def _terminate(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _last_error(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "it printed nothing"
    wanted = [ln for ln in lines if ("Exception" in ln or "Error" in ln or "error" in ln) and not ln.startswith("at ")]
    return (wanted or lines or ["it printed nothing"])[-1][:400]


# --------------------------------------------------------------------------------------------
# The supervisor (python -m runtime.spark.server REQUEST)


def _server_settings(settings: Mapping[str, str], port: int) -> dict[str, str]:
    """The server's Spark settings: the target's, and those pipe's server needs."""
    fixed = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
             # the fixed sessions must not expire while the server waits for the next command
             "spark.connect.session.manager.defaultSessionTimeout": "7d",
             # workers forked with pipe's task packages already imported (runtime/worker_daemon.py)
             "spark.python.daemon.module": "runtime.worker_daemon"}
    return {**settings, **fixed}


def _server_command(settings: Mapping[str, str], properties: str) -> list[str]:
    """spark-submit of the Connect server, its settings read from the file `properties`."""
    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    return [str(spark_home / "bin" / "spark-submit"), "--class", _CONNECT_CLASS, "--name", settings.get("spark.app.name", "pipe server"),
            "--properties-file", properties, "--load-spark-defaults"]


def _supervise() -> int:

    request = json.loads(sys.stdin.buffer.read())
    settings, path = request["settings"], Path(request["state"])
    token = secrets.token_urlsafe(32)
    java = find_java()
    env = dict(os.environ)
    home = home_for_spark(java)
    if home:
        env["JAVA_HOME"] = home
    import pyspark

    env["SPARK_HOME"] = str(Path(pyspark.__file__).resolve().parent)
    env["PYSPARK_PYTHON"] = settings.get("spark.pyspark.python", sys.executable)
    if settings.get("spark.master", "").startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env[_TOKEN_ENV] = token  # the server's token: in its environment, which only this user can read
    stopping = False

    def on_term(signum, frame):  # noqa: ARG001 - signal handler
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # the classes of Spark's driver mapped from the archive a classic session made (class_archive.py)
    archive = class_archive.plan(java, settings, make=False)
    deadline = time.monotonic() + START_TIMEOUT_S
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = _free_port()
        launched = _server_settings(settings, port)
        if archive is not None:
            launched = class_archive.with_option(launched, archive)
        with spark_properties_file(launched) as properties:  # removed once the server has read it
            server = subprocess.Popen(_server_command(settings, properties), stdin=subprocess.DEVNULL, env=env)
            while not _listening_by(server.pid, port):
                if server.poll() is not None or stopping or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        if server.poll() is None and not stopping and time.monotonic() <= deadline:
            break  # it serves
        _terminate(server.pid)
        if stopping or time.monotonic() > deadline or attempt == _START_ATTEMPTS:
            print(f"pipe server: the Spark Connect server did not start (exit {server.poll()})", flush=True)
            return 1
        # most often another process took the port between its choice and the server's bind
        print(f"pipe server: the Spark Connect server exited ({server.poll()}) before it served port {port}; trying another port",
              flush=True)
    state = ServerState(project=request["project"], target=request["target"], fingerprint=request["fingerprint"],
                        url=f"sc://localhost:{port}", port=port, supervisor_pid=os.getpid(), server_pid=server.pid,
                        session_base=str(uuid.uuid4()), started_at=time.time(), idle_timeout_s=int(request["idle_timeout_s"]),
                        log=request["log"], master=settings.get("spark.master", ""), token=token)
    tmp = path.with_suffix(".tmp")
    with open(private_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(state), indent=2))
    os.replace(tmp, path)
    print(f"pipe server: Spark Connect server ready at {state.url} (pid {server.pid})", flush=True)
    reason = "stopped"
    try:
        while True:
            if stopping:
                reason = "stop requested"
                break
            if server.poll() is not None:
                reason = f"the Spark Connect server exited ({server.returncode})"
                break
            if state.idle_timeout_s > 0 and idle_for(state) > state.idle_timeout_s:
                reason = f"idle for {state.idle_timeout_s} s"
                break
            time.sleep(1)
    finally:
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("supervisor_pid") == os.getpid():
                path.unlink(missing_ok=True)
        except (OSError, ValueError):
            pass
        if server.poll() is None:
            _terminate(server.pid)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _terminate(server.pid, signal.SIGKILL)
        for leftover in lease_dir(state).glob("*"):
            leftover.unlink(missing_ok=True)
        try:
            lease_dir(state).rmdir()
        except OSError:
            pass
        print(f"pipe server: stopped ({reason})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_supervise())
