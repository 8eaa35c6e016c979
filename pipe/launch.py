"""The `pipe` command's entry point, and the client half of pipe's fork server (pipe/forkserver.py).

Every command used to start a Python that imported pipe, then PySpark's Connect client, pandas and
pyarrow: 1 to 1.5 s before a run on a warm `pipe server` sent its first request. While a pipe
server runs for the project, the commands that use it (run, build, test, show) are handed to the
fork server that `pipe server start` started: a process with all of that imported already. It
forks a child that runs the command with this process's arguments, working folder, environment,
umask and terminal (its standard input, output and error, passed over a Unix socket), and this
process waits for the child, passes signals on to it (Ctrl-C cancels the run as before) and exits
with its exit status.

This module imports only the standard library and pipe/handover.py (what both halves agree on),
which imports runtime/host.py and nothing more: nothing else of pipe is imported when the
command is handed over. Anything else (another command, no pipe server for the project, no fork
server, another Python or another version of pipe's code, PIPE_NO_FORKSERVER set, Windows) runs
the command in this process, as before; so does any failure to hand it over before the child
started."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from pipe.handover import FORWARDED_SIGNALS, HEADER, REPLY, connect, peer_uid, read_exact, server_runs_for, socket_name, stamp, state_dir

# The commands that use a project's pipe server.
HANDED_OVER = ("run", "build", "test", "show")
PROJECT_FILE = "pipe_project.yml"  # compiler/project.py PROJECT_FILE


def main() -> None:
    """The `pipe` command (and `python -m pipe`)."""
    code = hand_over(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from pipe.cli import entry

    entry()


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
    socket.send_fds(sock, [HEADER.pack(len(request))], [0, 1, 2])
    sock.sendall(request)
    kind, pid = REPLY.unpack(read_exact(sock, REPLY.size))
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
        kind, status = REPLY.unpack(read_exact(sock, REPLY.size))
    except (OSError, ValueError, struct.error):
        print(f"pipe: lost the fork server while the command ran (pid {pid}); its log is {state_dir() / 'forkserver.log'}",
              file=sys.stderr)
        return 1
    return status if status >= 0 else 128 - status
