"""pipe's fork server: the server half of handing commands over (pipe/handover.py is the client).

`pipe server start` starts it (`ensure_started`) once per Python, version of pipe's code and cache
folder. It imports pipe and what a command on a pipe server imports (PySpark's Connect client,
pandas, pyarrow, networkx, ...), then listens on a Unix socket in the cache folder, readable by
this user only. For each command handed to it, it forks a child that takes the client's standard
streams, working folder, environment and umask, runs the command as `pipe` would, and exits; the
fork server tells the client the child's pid, then its exit status. The child leads a process
group of its own, to which the client passes its signals.

A child is a copy of this process as it was after its imports and before any command: no state
of one command reaches the next. No thread, gRPC channel or JVM exists in this process when it
forks (it never opens a session itself).

It exits when no pipe server has run in its cache folder for IDLE_EXIT_S, when pipe's code or the
installed libraries change (commands stop coming: their stamp is another one), and on SIGTERM;
commands still running then finish first."""

from __future__ import annotations

import atexit
import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from pipe import handover
from runtime.host import private_file

# What commands on a pipe server import (a failure leaves the command to import, and report, it).
PRELOAD = (
    "pipe.cli", "pipe.output", "pipe.run_display", "compiler.api", "compiler.sqlcheck", "sqlglot", "networkx",
    "runtime.executor", "runtime.spark.connect", "runtime.spark.session", "runtime.spark.server", "runtime.spark.api", "runtime.run_lock",
    "runtime.run_record", "runtime.defer", "pipe.dev_loop", "compiler.state",
    "runtime.steps.context", "runtime.steps.source", "runtime.steps.write", "runtime.steps.expect", "runtime.steps.test",
    "runtime.steps.sync", "runtime.steps.views", "runtime.steps.seed", "runtime.steps.unit", "runtime.sources.given", "compiler.seeds",
    "compiler.unit_tests", "compiler.python_models", "runtime.sources.files", "runtime.sources.records", "runtime.sources.table",
    "runtime.sources.s3_events", "runtime.sources.s3_incremental", "runtime.table.table", "runtime.table.writer",
    "runtime.table.reader", "runtime.table.services", "runtime.table.compaction", "runtime.table.merge",
    "pyspark.sql.connect.session", "pyspark.sql.connect.functions", "pyspark.sql.functions", "pyspark.sql.types",
    "runtime.table.bloom", "runtime.table.cdc_log", "runtime.table.metadata_table", "runtime.table.record_index", "pyspark.sql.connect.catalog", "pyspark.sql.connect.window", "grpc._channel",
    "grpc._auth", "grpc._plugin_wrapping",  # the token of pipe's own server (runtime/spark/server.py)
    "pandas", "pyarrow", "pyarrow.parquet", "pyarrow.pandas_compat", "pyarrow.vendored.version", "fastavro", "boto3", "rich.live", "rich._emoji_codes",
    "encodings.idna",
)
POLL_S = 1.0
CHECK_EVERY_S = 2.0
IDLE_EXIT_S = 10.0  # no pipe server in the cache folder for this long: the fork server exits
LOG_NAME = "forkserver.log"


def serves(name: str | None = None) -> bool:
    """Whether the fork server of this Python and pipe's code (its socket `name`, if known)
    takes commands."""
    try:
        handover.connect(handover.state_dir(), name or handover.socket_name(handover.stamp()), timeout_s=2).close()
    except OSError:
        return False
    return True


def ensure_started() -> bool:
    """Starts the fork server of this Python and pipe's code unless one runs; whether one was
    started. Returns at once: it imports for a second or two before it serves, and commands run
    in their own process until then."""
    name = handover.socket_name(handover.stamp())
    if serves(name):
        return False
    folder = handover.state_dir()  # this user's only (runtime/host.py private_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    with open(private_file(folder / LOG_NAME), "ab") as log:
        subprocess.Popen([sys.executable, "-m", "pipe.forkserver", str(folder), name], stdin=subprocess.DEVNULL, stdout=log,
                         stderr=log, env=env, cwd=str(folder), start_new_session=True)
    return True


# --------------------------------------------------------------------------------------------
# The server (python -m pipe.forkserver FOLDER NAME)


def serve(folder: Path, name: str) -> int:
    held = open(private_file(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT), "a+b")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another one serves this socket
    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001, S110 - best effort: the command's own import says what is wrong
            pass
    try:  # sqlglot loads its Spark dialect (parser, generator: a few MB of modules) on first use
        from runtime.steps.views import names_used

        names_used(["select a from t"])
    except Exception:  # noqa: BLE001, S110 - best effort, as the imports
        pass
    if handover.socket_name(handover.stamp()) != name:
        _log(f"pipe's code changed while it was imported: not serving {name}")
        return 0
    listener = _listen(folder, name)
    _log(f"serving {name} (pid {os.getpid()})")
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    # a child's exit wakes the loop at once: its client waits for the status
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}
    served, last_check, last_server = 0, 0.0, time.monotonic()
    reason = "stopped"
    try:
        while True:
            for key, _ in selector.select(POLL_S):
                if key.data is None:
                    served += _accept(listener, selector, children, [held, wake_r, wake_w])
                elif key.data == "wake":
                    _drain(wake_r)
                else:  # the client went away before its child ended (there is nothing else to read)
                    selector.unregister(key.fileobj)
                    _signal_group(key.data, signal.SIGINT)
            _reap(children, selector)
            if stopping:
                reason = "stop requested"
                break
            now = time.monotonic()
            if now - last_check >= CHECK_EVERY_S:
                last_check = now
                if handover.socket_name(handover.stamp()) != name:
                    reason = "pipe's code or the installed libraries changed"
                    break
                if handover.server_runs_for(None, folder):
                    last_server = now
                elif now - last_server > IDLE_EXIT_S:
                    reason = "no pipe server runs"
                    break
    finally:
        _unlink(folder, name)
        selector.unregister(listener)
        listener.close()
        while children:  # commands still running finish first
            _reap(children, selector)
            time.sleep(0.2)
        _log(f"stopped ({reason}) after {served} command(s)")
    return 0


def _listen(folder: Path, name: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(folder)
        if os.path.exists(name):  # a dead server's (this process holds the lock now)
            os.unlink(name)
        old = os.umask(0o177)
        try:
            listener.bind(name)  # created readable and writable by this user only
        finally:
            os.umask(old)
    finally:
        os.fchdir(here)
        os.close(here)
    listener.listen(16)
    listener.setblocking(False)
    return listener


def _unlink(folder: Path, name: str) -> None:
    try:
        (folder / name).unlink()
    except OSError:
        pass


def _accept(listener: socket.socket, selector, children: dict[int, socket.socket], own: list) -> int:
    """Takes one command: forks its child. 1 when a child started. `own`: what else of this
    process's the child closes."""
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError):
        return 0
    fds: list[int] = []
    try:
        conn.setblocking(True)
        conn.settimeout(5)
        if not _same_user(conn):
            conn.close()
            return 0
        header, fds, _, _ = socket.recv_fds(conn, handover.HEADER.size, 3)
        if not header and not fds:  # a probe (`serves`): connected, then closed
            conn.close()
            return 0
        if len(header) != handover.HEADER.size or len(fds) != 3:
            raise ValueError("a request without its header or its three streams")
        (length,) = handover.HEADER.unpack(header)
        request = json.loads(handover.read_exact(conn, length))
    except (OSError, ValueError) as exc:
        _log(f"refused a request: {exc}")
        for fd in fds:
            os.close(fd)
        conn.close()
        return 0
    pid = os.fork()
    if pid == 0:
        _child(request, fds, [listener, conn, *children.values(), *own], selector)  # never returns
    try:
        os.setpgid(pid, pid)  # the child does so too: whichever runs first
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(handover.REPLY.pack(b"P", pid))
    except OSError:
        _signal_group(pid, signal.SIGINT)
    conn.setblocking(False)
    selector.register(conn, selectors.EVENT_READ, pid)
    children[pid] = conn
    _log(f"pid {pid}: pipe {' '.join(request['argv'][1:])} (in {request['cwd']})")
    return 1


def _same_user(conn: socket.socket) -> bool:
    """Whether the client runs as this user (the socket's permissions say so already)."""
    uid = handover.peer_uid(conn)
    return uid is None or uid == os.getuid()


def _reap(children: dict[int, socket.socket], selector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        _log(f"pid {pid}: exit {code}")
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.setblocking(True)
            conn.settimeout(2)
            conn.sendall(handover.REPLY.pack(b"X", code))
        except OSError:
            pass
        conn.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pipe fork server: {message}", flush=True)


# --------------------------------------------------------------------------------------------
# A command's child


def _child(request: dict, fds: list[int], inherited: list, selector) -> None:
    """Becomes the command of `request`, with the client's streams `fds`; exits with its code."""
    code = 1
    try:
        os.setpgid(0, 0)
        selector.close()
        signal.set_wakeup_fd(-1)
        for held in inherited:  # the listener, the clients' connections, the lock file, the wake-up pair
            held.close()
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for sig in (*handover.FORWARDED_SIGNALS, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        if hasattr(time, "tzset"):
            time.tzset()
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        streams = request.get("streams") or [{}, {}, {}]
        sys.stdin = sys.__stdin__ = _stream(0, "r", streams[0])
        sys.stdout = sys.__stdout__ = _stream(1, "w", streams[1])
        sys.stderr = sys.__stderr__ = _stream(2, "w", streams[2])
        sys.argv = list(request["argv"])
        preloaded = set(sys.modules)
        module, _, function = handover.COMMAND.partition(":")
        main = getattr(importlib.import_module(module), function)
        try:
            code = main(sys.argv[1:])
        finally:
            if os.environ.get("PIPE_FORKSERVER_IMPORTS"):  # a file: what the command imported that was not preloaded
                Path(os.environ["PIPE_FORKSERVER_IMPORTS"]).write_text("\n".join(sorted(set(sys.modules) - preloaded)), encoding="utf-8")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - a bug here: said, as pipe says its own
        traceback.print_exc()
        code = 1
    finally:
        try:
            _flush()
            atexit._run_exitfuncs()
            _flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _stream(fd: int, mode: str, spec: dict):
    """A standard stream on `fd` as Python makes it: line-buffered on a terminal (stderr always)."""
    encoding, errors = spec.get("encoding") or "utf-8", spec.get("errors") or "strict"
    if mode == "r":
        return open(fd, "r", encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    line = fd == 2 or os.isatty(fd)
    return open(fd, "w", buffering=1 if line else -1, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed terminal
            pass


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), sys.argv[2]))
