"""Pre-warmed Python processes for the crash tests, to keep the suite's wall time down.

A crash test runs a writer in a child process that dies hard (`os._exit(77)`, PIPE_FAULT) at a
named point of the write path. Started cold, such a child spends most of its 13-16 s starting
Spark and on its first write (class loading, JIT), which is the same for every crash test.

`warm_python.run([sys.executable, "-c", SCRIPT, *args], env=..., ...)` (a session fixture,
tests/conftest.py) takes the place of `subprocess.run`: it hands the job to a child process that
has already imported pipe's runtime, started its local Spark (`runtime.spark.session.get_spark
("local[1]")`, as the crash scripts do; their own `get_spark`, and `pipe run`'s, then return that
session and set its runtime settings; a `pipe run` whose target asks local[2] gets one core, which
no crash test depends on) and written a throwaway table. The job runs in that process
as `python -c`/`python -m` would run it (a fresh `__main__`, `sys.argv`, cwd, the job's
environment; stdout and stderr, the JVM's included, into files of its own) and the process ends
with the job: the crash is still a real, separate process dying hard, and the test reads its
exit code and output as before. The variables that differ from the child's start (PIPE_FAULT)
reach Spark's Python workers only with `task_env=True` (a fault in a task).

One child is warmed at a time, in the background: tests/conftest.py starts it when a test that
uses `warm_python` is a few tests ahead, and the next one when a job has ended. A job whose
environment differs from the child's in more than JOB_VARIABLES, or that is no `python -c/-m`,
runs in a cold `subprocess.run`, as does a job when no child is warming; the terminal summary
says how many ran warm and why any ran cold.

Measured on 2 cores: a warm job takes 3-5 s where a cold child takes 13-16 s, and the warm-up
costs about as much CPU as the cold start it replaces (plus the job's few seconds): the suite
gains where the tests before a crash test leave a core idle, not where crash tests follow each
other (test_table_faults)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# Variables a job may set that its child did not start with.
JOB_VARIABLES = ("PIPE_FAULT", "PYTEST_CURRENT_TEST", "COLUMNS", "LINES")

_BOOT = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import warm_child; del sys.path[0]; warm_child.serve()"


# --------------------------------------------------------------------------------------------
# The child


def _warm_up(spark) -> None:
    """One upsert into a throwaway partitioned copy-on-write table: Spark's and pipe's classes
    of the write path are loaded and compiled, Python's workers are up. (A second write or a
    merge-on-read one saves the job less than it costs: measured, 1 s for 3 s.)"""
    from runtime.table import Table, TableConfig

    folder = tempfile.mkdtemp(prefix="pipe-warm-")
    try:
        config = TableConfig(name="warm", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
        table = Table.create(spark, os.path.join(folder, "warm"), config)
        table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b")], "id long, region string, ts long, v string"), "upsert")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve() -> None:
    """The child: warm up, say READY (with where `runtime` was imported from) on the control fd
    given as argv[1], then run the one job read from stdin, as the process's __main__."""
    import builtins
    import runpy
    import types

    control = int(sys.argv[1])
    import runtime
    from runtime.spark.session import get_spark

    spark = get_spark("local[1]", {"spark.sql.shuffle.partitions": "2"})
    _warm_up(spark)
    start_env = dict(os.environ)  # with what get_spark set (PYSPARK_PYTHON), as a job's env has it
    with os.fdopen(control, "w") as out:
        out.write(json.dumps({"runtime": runtime.__file__, "env": start_env}) + "\n")
    job = json.loads(sys.stdin.readline() or "null")
    if job is None:  # the pool closed without a job
        return

    sys.stdout.flush()
    sys.stderr.flush()
    for fd, name in ((1, job["stdout"]), (2, job["stderr"])):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)

    os.environ.clear()
    os.environ.update(job["env"])
    changed = {k: v for k, v in job["env"].items() if start_env.get(k) != v}
    if job["task_env"]:  # Spark's Python workers see them too (a fault in a task); they start anew for it
        spark.sparkContext.environment.update(changed)
    os.chdir(job["cwd"])
    del spark

    if job["module"]:
        sys.argv = [job["module"], *job["argv"]]
        sys.path[0] = os.getcwd()
        runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *job["argv"]]
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        exec(compile(job["code"], "<string>", "exec"), main.__dict__)


# --------------------------------------------------------------------------------------------
# The pool (in the tests' process)


class _Child:
    """One child process warming up (or ready) in the background."""

    def __init__(self):
        read_fd, write_fd = os.pipe()
        self.folder = Path(tempfile.mkdtemp(prefix="pipe-warm-child-"))
        log = open(self.folder / "warm-up.log", "wb")  # the warm-up's own output, for a failed warm-up
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(write_fd)], stdin=subprocess.PIPE, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=(write_fd,))
        finally:
            log.close()
            os.close(write_fd)
        self.ready: dict | None = None  # what the child said when it was ready; None: not (yet), or it failed
        self._said = threading.Event()
        threading.Thread(target=self._listen, args=(read_fd,), name="warm-child", daemon=True).start()

    def _listen(self, read_fd: int) -> None:
        with os.fdopen(read_fd) as control:
            line = control.readline()
        if line:
            self.ready = json.loads(line)
        self._said.set()

    def wait_ready(self, timeout: float) -> bool:
        return self._said.wait(timeout) and self.ready is not None

    def misfit(self, env: dict[str, str]) -> str | None:
        """Why a job with this environment may not run here (None: it may): a variable other
        than JOB_VARIABLES differs from the warm child's, except a PYTHONPATH of just this
        repository when the child imports pipe from it anyway."""
        if not self.wait_ready(600):
            return "the warm-up failed (see its log)"
        mine = self.ready["env"]
        differ = {k for k in (set(env) | set(mine)) - set(JOB_VARIABLES) if env.get(k) != mine.get(k)}
        if differ == {"PYTHONPATH"} and env["PYTHONPATH"] == str(REPO):
            differ = set() if Path(self.ready["runtime"]).resolve().is_relative_to(REPO) else differ
        return f"the environment differs in {', '.join(sorted(differ))}" if differ else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdin:
            self.proc.stdin.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class WarmPool:
    """Holds at most one child warming up or ready; `run` hands a job to it (or runs it cold)."""

    def __init__(self):
        self._child: _Child | None = None
        self._lock = threading.Lock()
        self.after_job = lambda: None  # called when a child's job ended (conftest: warm the next one if a user is near)
        self.warm = 0  # jobs run in a warm child
        self.cold: list[str] = []  # why a job that a warm child was ready for ran cold

    def prepare(self) -> None:
        """Starts warming a child unless one is warming or ready."""
        with self._lock:
            if self._child is None:
                self._child = _Child()

    def run(self, args: list[str], *, env: dict[str, str] | None = None, cwd=None, capture_output: bool = False,
            text: bool = False, timeout: float | None = None, task_env: bool = False) -> subprocess.CompletedProcess:
        """As `subprocess.run(args, env=, cwd=, capture_output=, text=, timeout=)`. `task_env`:
        the job's Spark tasks need its environment too (a PIPE_FAULT point in a task), which
        costs a new Python worker daemon in the warm child."""
        env = dict(os.environ if env is None else env)
        job = _job(args)
        child = None
        if job is not None:
            with self._lock:
                child, self._child = self._child, None
        if child is not None:
            why = child.misfit(env)
            if why is not None:
                self.cold.append(why)
                with self._lock:
                    if self._child is None and child.ready is not None:
                        child, self._child = None, child  # kept for a job that fits
                if child is not None:
                    child.close()
                child = None
        if child is None:
            return subprocess.run(args, env=env, cwd=cwd, capture_output=capture_output, text=text, timeout=timeout)
        self.warm += 1
        try:
            return self._hand(child, args, {**job, "task_env": task_env}, env, cwd, capture_output, text, timeout)
        finally:
            child.close()
            self.after_job()  # after the job: the next warm-up does not slow it

    def _hand(self, child, args, job, env, cwd, capture_output, text, timeout) -> subprocess.CompletedProcess:
        out, err = child.folder / "stdout", child.folder / "stderr"
        job = {**job, "env": env, "cwd": str(cwd or os.getcwd()), "stdout": str(out), "stderr": str(err)}
        child.proc.stdin.write((json.dumps(job) + "\n").encode())
        child.proc.stdin.close()
        try:
            code = child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
            raise
        outputs = []
        for path in (out, err):
            data = path.read_bytes() if path.exists() else b""
            outputs.append(data.decode(errors="strict") if text else data)
        if not capture_output:  # subprocess.run would have let them through
            for stream, data in zip((sys.stdout, sys.stderr), outputs):
                stream.write(data if text else data.decode(errors="replace"))
            outputs = [None, None]
        return subprocess.CompletedProcess(args, code, *outputs)

    def close(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close()


def _job(args: list[str]) -> dict | None:
    """{"code"|"module", "argv"} of `python -c CODE ARGS...` / `python -m MODULE ARGS...`, else None."""
    if len(args) >= 3 and args[0] == sys.executable and args[1] in ("-c", "-m"):
        code = args[2] if args[1] == "-c" else None
        return {"code": code, "module": args[2] if args[1] == "-m" else None, "argv": list(args[3:])}
    return None
