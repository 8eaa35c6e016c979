"""A real Spark standalone cluster for the tests: one Master and two Workers (1 core, 1 GiB each)
started from the installed pyspark's `bin/spark-class` on 127.0.0.1 with free ports. The nodes'
Python is a venv that holds only `pyspark[sql]`: pipe ships its own code (runtime/spark/cluster.py)
and the tests ship the other packages of its tasks (fastavro, boto3) with `pipe pack-env`.

The executors' Python environments live under <repo>/.cluster (git ignores it), built once and
reused; a file lock keeps two pytest processes from building them at once. By hand:
`python -m tests.cluster.env` builds them and starts a cluster until Ctrl-C.

The Master and Workers get an environment without PYTHONPATH, PYSPARK_PYTHON or SPARK_HOME
from the test process, so nothing of the driver's Python leaks into the executors."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from dataclasses import dataclass, field
from pathlib import Path

from tests.jvm_options import SHORT_LIVED

REPO = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("PIPE_CLUSTER_HOME", REPO / ".cluster"))

# What the executors' Python gets: pyspark as on the driver, and the packages of pipe's tasks.
TASK_PACKAGES = ("pyarrow", "pandas<3", "numpy", "fastavro")


class SetupError(RuntimeError):
    pass


def _pyspark_version() -> str:
    from pyspark.version import __version__

    return __version__


@dataclass(frozen=True)
class ExecutorEnv:
    """A venv for the executors' Python workers: pyspark[sql] plus `packages`."""

    name: str
    packages: tuple[str, ...]

    @property
    def root(self) -> Path:
        return HOME / self.name

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def _marker(self) -> Path:
        return self.root / f".ready-pyspark-{_pyspark_version()}-{'-'.join(sorted(self.packages))}".replace("<", "lt")

    def ready(self) -> bool:
        return self._marker.is_file() and self.python.is_file()

    def build(self) -> None:
        if self.ready():
            return
        if self.root.exists():
            shutil.rmtree(self.root)  # a half-made one from an interrupted set-up
        # the driver's own Python (not a venv's): the executors need the same minor version
        venv.EnvBuilder(with_pip=True, clear=True).create(self.root)
        args = [str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                f"pyspark[sql]=={_pyspark_version()}", *self.packages]
        done = subprocess.run(args, capture_output=True, text=True, env=_clean_env())
        if done.returncode != 0:
            raise SetupError(f"building {self.root} failed ({' '.join(args)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        self._marker.write_text("")


# What a cluster's nodes have before pipe comes: pyspark[sql] (which brings pyarrow, pandas and
# numpy) and nothing else; pipe's tests ship the rest with `pipe pack-env`.
PYSPARK_ONLY = ExecutorEnv("venv-executor-pyspark", ())
# Every task package installed on the nodes (the install-on-nodes way; the bench uses it).
FULL = ExecutorEnv("venv-executor", TASK_PACKAGES)


def ensure(*envs: ExecutorEnv) -> None:
    """Builds the executor venvs that are missing, under a lock."""
    envs = envs or (PYSPARK_ONLY,)
    HOME.mkdir(parents=True, exist_ok=True)
    if all(e.ready() for e in envs):
        return
    with open(HOME / ".setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be setting up: wait for it
        for e in envs:
            e.build()


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "VIRTUAL_ENV",
                        "PYTHONHOME", "SPARK_CONF_DIR")}
    venv_bin = os.environ.get("VIRTUAL_ENV")
    if venv_bin:  # the test venv's bin/ off PATH: nothing of it may be found by the daemons
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(venv_bin))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running standalone cluster: its master URL and the processes behind it."""

    master_url: str
    ui_url: str
    workdir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for f in sorted(self.workdir.glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)


def _die_with_parent() -> None:
    """Linux: the daemon gets SIGTERM when the test process ends, even without its teardown
    (spark-class execs java, which keeps the setting)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def start(workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 120) -> Cluster:
    """Starts a Master and `workers` Workers on 127.0.0.1; returns when every Worker has registered."""
    from runtime.spark.java import find_java, home_for_spark

    java = find_java()
    home = _spark_home()
    env = _clean_env()
    env.update({"SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_LOG_DIR": str(workdir), "SPARK_NO_DAEMONIZE": "1",
                # the Master and Workers mostly wait: the first JIT tier and the serial collector
                "SPARK_DAEMON_JAVA_OPTS": SHORT_LIVED})
    java_home = home_for_spark(java)
    if java_home:
        env["JAVA_HOME"] = java_home
    workdir.mkdir(parents=True, exist_ok=True)
    spark_class = str(home / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", workdir)

    def launch(name: str, args: list[str]) -> None:
        log = open(workdir / f"{name}.log", "wb")
        cluster.processes.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True, cwd=workdir,
                                                  preexec_fn=_die_with_parent))
        log.close()

    try:
        launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                          "--webui-port", str(ui_port)])
        for i in range(workers):
            wdir = workdir / f"worker-{i}"
            wdir.mkdir(exist_ok=True)
            launch(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(free_port()),
                                   "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory,
                                   "--work-dir", str(wdir), cluster.master_url])
        deadline = time.monotonic() + timeout
        while True:
            dead = [p for p in cluster.processes if p.poll() is not None]
            if dead:
                raise SetupError(f"a Spark daemon exited while the cluster started:\n{cluster.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                if cluster.alive_workers() >= workers:
                    return cluster
            if time.monotonic() > deadline:
                raise SetupError(f"the cluster did not come up in {timeout:.0f} s:\n{cluster.log_tail()}")
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise


def main() -> None:
    t0 = time.monotonic()
    ensure()
    print(f"executor venvs ready in {time.monotonic() - t0:.1f} s: {PYSPARK_ONLY.python}")
    cluster = start(HOME / "manual")
    print(f"cluster {cluster.master_url} (UI {cluster.ui_url}) up after {time.monotonic() - t0:.1f} s; Ctrl-C stops it")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
