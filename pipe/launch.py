"""The `pipe` command's entry point, and the client half of pipe's fork server (pipe/forkserver.py).

Every command used to start a Python that imported pipe, then PySpark's Connect client, pandas and
pyarrow: 1 to 1.5 s before a run on a warm `pipe server` sent its first request. While a pipe
server runs for the project, the commands that use it (run, build, test, show) are handed to the
fork server that `pipe server start` started: a process with all of that imported already. It
forks a child that runs the command with this process's arguments, working folder, environment,
umask and terminal (its standard input, output and error, passed over a Unix socket), and this
process waits for the child, passes signals on to it (Ctrl-C cancels the run as before) and exits
with its exit status.

This module imports only the standard library and runtime/host.py, which imports nothing more:
nothing else of pipe is imported when the command is handed over. Anything else (another command, no pipe server for the project, no fork
server, another Python or another version of pipe's code, PIPE_NO_FORKSERVER set, Windows) runs
the command in this process, as before; so does any failure to hand it over before the child
started."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from runtime.host import alive, cache_dir, private_dir

# The commands that use a project's pipe server.
HANDED_OVER = ("run", "build", "test", "show")
PROJECT_FILE = "pipe_project.yml"  # compiler/project.py PROJECT_FILE
# The packages whose code the fork server has imported (a change of any file: a new fork server).
PACKAGES = ("pipe", "compiler", "runtime")
FORWARDED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGWINCH", "SIGUSR1", "SIGUSR2")
                          if hasattr(signal, name))
_HEADER = struct.Struct("!I")  # the length of the request that follows
_REPLY = struct.Struct("!ci")  # b"P" and the child's pid, then b"X" and its wait status (code, or -signal)


def main() -> None:
    """The `pipe` command (and `python -m pipe`)."""
    code = hand_over(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from pipe.cli import entry

    entry()


# --------------------------------------------------------------------------------------------
# Where things are


def state_dir() -> Path:
    """Where pipe servers are remembered (runtime.spark.server.state_dir): a folder of this user's only.
    Raises runtime.host.UnsafeFolder (an OSError) when it is not."""
    return private_dir(cache_dir() / "servers")


def code_root() -> Path:
    """The folder that holds pipe's packages."""
    return Path(__file__).resolve().parent.parent


def stamp() -> str:
    """Of this Python (and its PYTHONPATH), pipe's code (names, sizes and modification times of its Python files) and
    the installed libraries (the modification times of the site-packages folders, which change
    when a library is installed, upgraded or removed): a fork server serves only commands whose
    stamp is its own. A few milliseconds, no file read."""
    digest = hashlib.sha256(f"{sys.prefix}\0{sys.base_prefix}\0{sys.version}\0{os.environ.get('PYTHONPATH', '')}\0".encode())
    base = code_root()
    for package in PACKAGES:
        for folder, dirs, files in os.walk(base / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(folder, name))
                    digest.update(f"{os.path.relpath(os.path.join(folder, name), base)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            digest.update(f"{entry}\0{os.stat(entry).st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def socket_name(code_stamp: str) -> str:
    """The fork server's socket, in state_dir()."""
    return f"fork-{code_stamp}.sock"


def connect(folder: Path, name: str, timeout_s: float = 5.0) -> socket.socket:
    """A connection to the Unix socket `name` in `folder`. The socket is reached by a name
    relative to its folder: a Unix socket's path is limited to about 100 characters, and a
    cache folder may be deeper than that."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(folder)
        sock.connect(name)
    except BaseException:
        sock.close()
        raise
    finally:
        os.fchdir(here)
        os.close(here)
    return sock


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of the Unix socket `sock` (None where the
    system does not say)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def project_of(args: list[str]) -> Path | None:
    """The project folder a command names (--project-dir) or runs in (the nearest folder with
    pipe_project.yml, as compiler.project.find_project_root finds it)."""
    for i, arg in enumerate(args):
        if arg == "--project-dir" and i + 1 < len(args):
            return Path(args[i + 1]).resolve()
        if arg.startswith("--project-dir="):
            return Path(arg.split("=", 1)[1]).resolve()
    start = Path.cwd().resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_FILE).is_file():
            return folder
    return None


def server_runs_for(project: Path | None, folder: Path) -> bool:
    """Whether a pipe server of `project` (any target; None: of any project) is running: its
    state file in `folder` names the project and its supervisor lives."""
    for path in folder.glob("*.json"):
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if (project is None or state.get("project") == str(project)) and alive(int(state["supervisor_pid"])):
                return True
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False


# --------------------------------------------------------------------------------------------
# Handing a command over


def hand_over(args: list[str]) -> int | None:
    """Runs the command `args` in a child of the fork server: its exit code; None when it is not
    handed over (the caller runs it itself)."""
    if os.environ.get("PIPE_NO_FORKSERVER") or not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        return None
    if next((a for a in args if a in HANDED_OVER), None) is None or "--help" in args or "-h" in args:
        return None
    try:
        project = project_of(args)
        folder = state_dir()
        if project is None or not server_runs_for(project, folder):
            return None
        sock = connect(folder, socket_name(stamp()))
    except OSError:
        return None
    with sock:
        server_uid = peer_uid(sock)
        if server_uid is not None and server_uid != os.getuid():  # the folder is ours: someone replaced the socket
            print(f"pipe: the fork server's socket in {folder} is served by another user (uid {server_uid}); "
                  "the command runs in this process", file=sys.stderr)
            return None
        try:
            pid = _start(sock, args)
        except (OSError, ValueError, struct.error):
            return None  # no child started: the command runs here
        return _wait(sock, pid)


def _start(sock: socket.socket, args: list[str]) -> int:
    """Sends the command, with this process's standard streams; the child's pid."""
    umask = os.umask(0)
    os.umask(umask)
    streams = [{"encoding": getattr(s, "encoding", None), "errors": getattr(s, "errors", None)} for s in (sys.stdin, sys.stdout, sys.stderr)]
    request = json.dumps({"argv": [sys.argv[0], *args], "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask,
                          "streams": streams}).encode()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    socket.send_fds(sock, [_HEADER.pack(len(request))], [0, 1, 2])
    sock.sendall(request)
    kind, pid = _REPLY.unpack(_read(sock, _REPLY.size))
    if kind != b"P" or pid <= 0:
        raise ValueError(f"unexpected reply {kind!r}")
    return pid


def _wait(sock: socket.socket, pid: int) -> int:
    """Waits for the child `pid` to exit, passing this process's signals on to its process group;
    its exit code (128 + the signal's number when a signal ended it)."""

    def forward(signum, frame):  # noqa: ARG001 - signal handler
        try:
            os.killpg(pid, signum)
        except OSError:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    sock.settimeout(None)
    try:
        kind, status = _REPLY.unpack(_read(sock, _REPLY.size))
    except (OSError, ValueError, struct.error):
        print(f"pipe: lost the fork server while the command ran (pid {pid}); its log is {state_dir() / 'forkserver.log'}",
              file=sys.stderr)
        return 1
    return status if status >= 0 else 128 - status


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except InterruptedError:
            continue
        if not chunk:
            raise ValueError("the fork server closed the connection")
        data += chunk
    return data
