"""What the two halves of handing a command over agree on: the `pipe` command (pipe/launch.py,
the client) and pipe's fork server (pipe/forkserver.py): where the fork server's socket is,
which code it serves (its stamp), the messages on the socket, the signals passed on, and the
command a child runs (COMMAND, named rather than imported: the fork server imports it by name
when it preloads and in each child, so that neither half imports the `pipe` command's modules).

It imports only the standard library and runtime/host.py, which imports nothing more."""

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

# The function a child of the fork server runs with the command's arguments (`pipe`'s own main).
COMMAND = "pipe.cli:main"
# The packages whose code the fork server has imported (a change of any file: a new fork server).
PACKAGES = ("pipe", "compiler", "runtime")
FORWARDED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGWINCH", "SIGUSR1", "SIGUSR2")
                          if hasattr(signal, name))
HEADER = struct.Struct("!I")  # the length of the request that follows
REPLY = struct.Struct("!ci")  # b"P" and the child's pid, then b"X" and its wait status (code, or -signal)


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


def read_exact(sock: socket.socket, n: int) -> bytes:
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
