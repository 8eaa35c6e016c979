"""pipe's fork server (pipe/forkserver.py) and the `pipe` command's hand-over to it (pipe/launch.py).

The fork server here serves a project whose pipe server is stood in for by a state file naming
this test process as its supervisor: the commands used (`pipe run --dry-run`, a continuous run
of the source step alone, a refused selection) start no Spark, so no JVM is needed to see what the
hand-over must keep: the client's folder, environment, streams, exit code and signals. The real
server's path is in tests/test_connect.py. The fork server runs a private copy of pipe's code
(PYTHONPATH), so that a test can change that code without touching the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, write_project

SOURCES = "sources:\n  s:\n    kind: files\n    path: \"{{ env_var('DATA_DIR') }}\"\n    format: json\n    schema: \"id BIGINT\"\n"


class Forked:
    def __init__(self, base: Path):
        self.code = base / "code"
        for package in ("pipe", "compiler", "runtime"):
            shutil.copytree(REPO / package, self.code / package, ignore=shutil.ignore_patterns("__pycache__"))
        self.cache = base / "cache"
        self.servers = self.cache / "servers"
        self.servers.mkdir(parents=True)
        self.root = write_project(base / "p", {"sources/s.yml": SOURCES, "tables/t.yml": "tables:\n  t:\n    key: [id]\n",
                                               "tables/t.sql": "select id from {{ source('s') }}\n"})
        for folder, n in (("one", 1), ("three", 3)):
            for i in range(n):
                (self.root / folder).mkdir(exist_ok=True)
                (self.root / folder / f"{i}.json").write_text('{"id": 1}\n')
        (self.root / "empty").mkdir()
        # a pipe server of the project, stood in for: its supervisor is this (living) process
        self.state = self.servers / "stand-in.json"
        self.state.write_text(json.dumps({"project": str(self.root.resolve()), "supervisor_pid": os.getpid()}))
        self.log = self.servers / "forkserver.log"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PIPE_NO_FORKSERVER")}
        env.update({"PIPE_CACHE_DIR": str(self.cache), "PYTHONPATH": str(self.code), "COLUMNS": "200", **extra})
        return env

    def start(self) -> int:
        """Starts the fork server; its pid, once it serves."""
        before = self.log.read_text() if self.log.exists() else ""
        subprocess.run([sys.executable, "-c", "from pipe import forkserver; forkserver.ensure_started()"], env=self.env(), check=True,
                       cwd=self.root)
        deadline = time.time() + 60
        while time.time() < deadline:
            found = re.findall(r"serving fork-\w+\.sock \(pid (\d+)\)", self.log.read_text()[len(before):] if self.log.exists() else "")
            if found:
                return int(found[-1])
            time.sleep(0.1)
        raise AssertionError(f"the fork server did not start: {self.log.read_text() if self.log.exists() else 'no log'}")

    def pipe(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipe", *args], cwd=cwd or self.root, capture_output=True, text=True,
                              env=self.env(**env), timeout=120)

    def handed(self) -> list[tuple[int, str]]:
        """(pid, command line) of every command the fork server took."""
        return [(int(pid), line) for pid, line in re.findall(r"pid (\d+): (pipe .*) \(in ", self.log.read_text())]

    def exits(self) -> dict[int, int]:
        return {int(pid): int(code) for pid, code in re.findall(r"pid (\d+): exit (-?\d+)", self.log.read_text())}


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    f = Forked(tmp_path_factory.mktemp("forkserver"))
    f.pid = f.start()
    yield f
    for pid in set(map(int, re.findall(r"\(pid (\d+)\)", f.log.read_text()))):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _wait_for(predicate, timeout_s: float = 30, what: str = "") -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_command_runs_in_a_child_of_the_fork_server_with_the_callers_folder_environment_and_streams(forked):
    one = forked.pipe("run", "--dry-run", DATA_DIR="one")
    three = forked.pipe("run", "--dry-run", DATA_DIR="three")
    # the environment variable and the relative folder are the caller's, not the fork server's
    assert one.returncode == 0 and "first build: s: 1 new file (10 B)" in one.stdout, one.stdout + one.stderr
    assert three.returncode == 0 and "first build: s: 3 new files (30 B)" in three.stdout, three.stdout + three.stderr
    # from a folder inside the project, as git finds its repository (a relative path is the project's)
    inside = forked.pipe("run", "--dry-run", cwd=forked.root / "three", DATA_DIR="one")
    assert inside.returncode == 0 and "s: 1 new file" in inside.stdout, inside.stdout + inside.stderr
    handed = forked.handed()
    assert [line for _, line in handed] == ["pipe run --dry-run"] * 3
    assert all(forked.exits()[pid] == 0 for pid, _ in handed)
    assert not any(pid == forked.pid for pid, _ in handed)


def test_a_refused_command_says_why_on_the_callers_stderr_with_its_exit_code(forked):
    before = len(forked.handed())
    r = forked.pipe("run", "--select", "nosuch", DATA_DIR="one")
    assert r.returncode == 2
    assert "--select 'nosuch' matches no step" in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
    (pid, line), = forked.handed()[before:]
    assert line == "pipe run --select nosuch" and forked.exits()[pid] == 2


def _continuous(forked) -> subprocess.Popen:
    """`pipe run --continuous` of the source step alone (no Spark), a round every 10 minutes."""
    return subprocess.Popen([sys.executable, "-m", "pipe", "run", "--select", "s", "--continuous", "--min-sync-interval-s", "600"],
                            cwd=forked.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=forked.env(DATA_DIR="empty"))


def test_ctrl_c_reaches_the_command_in_the_fork_server(forked):
    before = len(forked.handed())
    proc = _continuous(forked)
    try:
        assert proc.stdout.readline().startswith("round 1 (")
        assert next(line for line in proc.stdout if line.startswith("Done in ")).endswith(": 1 succeeded\n")
        proc.send_signal(signal.SIGINT)  # as the terminal sends Ctrl-C to the command it runs
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopping: the current round finishes first" in err and "stopped after 1 round" in err, err
    assert proc.returncode == 0 and "Traceback" not in out + err
    (pid, line), = forked.handed()[before:]
    assert line == "pipe run --select s --continuous --min-sync-interval-s 600" and forked.exits()[pid] == 0


def test_a_caller_killed_outright_leaves_no_command_running(forked):
    before = len(forked.handed())
    proc = _continuous(forked)
    assert proc.stdout.readline().startswith("round 1 (")
    proc.kill()  # SIGKILL: nothing passes it on; the fork server sees the connection close
    proc.wait()
    _wait_for(lambda: len(forked.handed()) > before, what="the command in the log")
    (pid, _), = forked.handed()[before:]
    _wait_for(lambda: pid in forked.exits(), what="the orphaned command to stop")
    assert not Path(f"/proc/{pid}").exists()


def test_commands_run_in_their_own_process_when_they_cannot_be_handed_over(forked, tmp_path):
    before = len(forked.handed())
    # the user says so
    assert "s: 1 new file" in forked.pipe("run", "--dry-run", DATA_DIR="one", PIPE_NO_FORKSERVER="1").stdout
    # another project, for which no pipe server runs
    other = write_project(tmp_path / "other", {"sources/s.yml": SOURCES, "tables/t.yml": "tables:\n  t:\n    key: [id]\n",
                                               "tables/t.sql": "select id from {{ source('s') }}\n"})
    (other / "d").mkdir()
    assert forked.pipe("run", "--dry-run", cwd=other, DATA_DIR="d").returncode == 0
    # another version of pipe's code than the fork server's (here: another PYTHONPATH)
    r = forked.pipe("run", "--dry-run", DATA_DIR="one", PYTHONPATH=f"{forked.code}{os.pathsep}{tmp_path}")
    assert r.returncode == 0 and "s: 1 new file" in r.stdout
    # commands that do not use a pipe server
    assert forked.pipe("compile").returncode == 0 and forked.pipe("run", "--help").returncode == 0
    assert len(forked.handed()) == before


def test_the_client_finds_servers_where_runtime_remembers_them(monkeypatch, tmp_path):
    from pipe import handover
    from runtime.spark import server

    for env in ({"PIPE_CACHE_DIR": str(tmp_path / "c")}, {"XDG_CACHE_HOME": str(tmp_path / "x")}, {"HOME": str(tmp_path / "h")}):
        for k in ("PIPE_CACHE_DIR", "XDG_CACHE_HOME"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert handover.state_dir() == server.state_dir()


def test_the_cache_folder_socket_lock_and_log_are_the_users_alone(forked):
    forked.pipe("run", "--dry-run", DATA_DIR="one")  # a command handed over: the folders as a command leaves them
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (forked.cache, forked.servers, forked.log, *forked.servers.glob("fork-*"))}
    assert {name: mode for name, mode in modes.items() if name in ("cache", "servers")} == {"cache": 0o700, "servers": 0o700}
    assert [name for name, mode in modes.items() if name not in ("cache", "servers") and mode != 0o600] == [], modes
    assert any(name.endswith(".sock") for name in modes) and any(name.endswith(".lock") for name in modes)


def test_a_cache_folder_of_another_user_is_refused_with_what_to_do(forked, tmp_path):
    other = tmp_path / "theirs"
    (other / "servers").mkdir(parents=True)
    # a pipe server's state file and a socket, as another user would leave them for us to trust
    (other / "servers" / "planted.json").write_text(json.dumps({"project": str(forked.root.resolve()), "supervisor_pid": os.getpid()}))
    os.chown(other, 12345, 12345)
    r = forked.pipe("server", "status", PIPE_CACHE_DIR=str(other))
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr
    said = " ".join((r.stdout + r.stderr).split())
    assert f"pipe's cache folder {other} belongs to another user (uid 12345)" in said and "PIPE_CACHE_DIR" in said, said


def test_a_cache_folder_others_may_write_into_is_made_private_or_refused(forked, tmp_path):
    loose = tmp_path / "loose"
    (loose / "servers").mkdir(parents=True)
    (loose / "pyfiles").mkdir()
    (loose / "pyfiles" / "pipe-0.1-0123456789abcdef.zip").write_bytes(b"PK")
    os.chmod(loose, 0o777)
    # nothing in it of anyone else's: made the user's alone, and used
    r = forked.pipe("server", "status", PIPE_CACHE_DIR=str(loose))
    assert r.returncode == 1 and "No pipe server runs for target" in r.stdout, r.stdout + r.stderr
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700 and stat.S_IMODE((loose / "servers").stat().st_mode) == 0o700
    # another user put code for Spark's workers in it: refused, naming it
    os.chmod(loose, 0o777)
    planted = loose / "pyfiles" / "pipe-0.1-fedcba9876543210.zip"
    planted.write_bytes(b"PK")
    os.chown(planted, 12345, 12345)
    r = forked.pipe("server", "status", PIPE_CACHE_DIR=str(loose))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0 and "Traceback" not in said
    assert f"could be written by other users (mode 777), and {planted} in it belongs to another user (uid 12345)" in said, said
    assert f"remove {loose}" in said


def test_a_cache_folder_named_by_mistake_is_refused_and_left_as_it_was(forked, tmp_path, monkeypatch):
    """PIPE_CACHE_DIR pointed at a home or a shared folder (readable by others, holding what is
    not pipe's) is not made private: its mode stays, nothing is written into it, and the error
    says what to do. A folder the user made private, or an empty one, is used and tagged."""
    from runtime import host

    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    os.chmod(home, 0o755)
    r = forked.pipe("server", "status", PIPE_CACHE_DIR=str(home))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0 and "Traceback" not in said, said
    assert f"pipe's cache folder {home} can be read by other users (mode 755) and holds {home / '.bashrc'}, which is not pipe's" in said
    assert f"chmod 700 {home}" in said and "PIPE_CACHE_DIR" in said, said
    assert stat.S_IMODE(home.stat().st_mode) == 0o755 and sorted(p.name for p in home.iterdir()) == [".bashrc", "projects"]
    # made private by its user: used, and tagged as a cache (backup tools skip it)
    os.chmod(home, 0o700)
    monkeypatch.setenv("PIPE_CACHE_DIR", str(home))
    assert host.cache_dir() == home and (home / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert stat.S_IMODE((home / "CACHEDIR.TAG").stat().st_mode) == 0o600
    # an empty folder made for the purpose is pipe's to make private
    empty = tmp_path / "made-for-pipe"
    empty.mkdir(mode=0o775)
    os.chmod(empty, 0o775)
    monkeypatch.setenv("PIPE_CACHE_DIR", str(empty))
    assert host.cache_dir() == empty and stat.S_IMODE(empty.stat().st_mode) == 0o700


def test_the_client_hands_nothing_to_a_fork_server_socket_of_another_user(monkeypatch, tmp_path, capsys):
    import socket

    from pipe import handover, launch

    project = tmp_path / "p"
    project.mkdir()
    (project / "pipe_project.yml").write_text("name: p\n")
    servers = tmp_path / "cache" / "servers"
    servers.mkdir(parents=True)
    (servers / "stand-in.json").write_text(json.dumps({"project": str(project.resolve()), "supervisor_pid": os.getpid()}))
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PIPE_NO_FORKSERVER", raising=False)
    monkeypatch.chdir(project)
    if os.getuid() != 0:  # another user's process cannot be stood in for: the check itself
        left, right = socket.socketpair(socket.AF_UNIX)
        with left, right:
            assert handover.peer_uid(left) == os.getuid()
        return
    # a stand-in fork server that listens as another user (root may become one), and says what it was sent
    told_r, told_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the stand-in
        try:
            os.close(told_r)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            os.chdir(servers)
            listener.bind(handover.socket_name(handover.stamp()))
            os.setgid(12345)
            os.setuid(12345)
            listener.listen(1)
            os.write(told_w, b"listening\n")
            conn, _ = listener.accept()
            conn.settimeout(20)
            got = b""
            try:
                while chunk := conn.recv(65536):
                    got += chunk
            except OSError:
                pass
            os.write(told_w, f"{len(got)}\n".encode())
        finally:
            os._exit(0)
    os.close(told_w)
    with os.fdopen(told_r) as told:
        assert told.readline() == "listening\n"
        assert launch.hand_over(["run"]) is None  # not handed over: the command runs in this process
        assert told.readline() == "0\n", "the stand-in received nothing"
    os.waitpid(pid, 0)
    assert "is served by another user (uid 12345); the command runs in this process" in capsys.readouterr().err


def test_the_fork_server_leaves_when_pipes_code_changes_and_when_no_server_runs(forked):
    # an edit of pipe's code: the fork server goes, and commands run in their own process
    before = len(forked.handed())
    edited = forked.code / "pipe" / "output.py"
    edited.write_text(edited.read_text() + "\n# edited\n")
    _wait_for(lambda: "stopped (pipe's code or the installed libraries changed)" in forked.log.read_text(), what="the fork server to stop")
    assert not list(forked.servers.glob("fork-*.sock"))
    assert "s: 1 new file" in forked.pipe("run", "--dry-run", DATA_DIR="one").stdout
    assert len(forked.handed()) == before
    # a new one serves the new code; with no pipe server left, it goes too
    pid = forked.start()
    assert "s: 3 new files" in forked.pipe("run", "--dry-run", DATA_DIR="three").stdout and len(forked.handed()) == before + 1
    forked.state.unlink()
    _wait_for(lambda: "stopped (no pipe server runs)" in forked.log.read_text(), timeout_s=40, what="the idle fork server to stop")
    _wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="its process to end")
    assert not list(forked.servers.glob("fork-*.sock"))


def test_the_pipe_command_imports_nothing_of_pipe_before_it_hands_a_command_over():
    code = ("import sys, pipe.launch; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pipe', 'runtime', 'compiler', 'click', 'rich', 'yaml', 'jinja2', 'pyspark', 'pandas', 'pyarrow')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert r.stdout.strip() == "['pipe', 'pipe.handover', 'pipe.launch', 'runtime', 'runtime.host']"
