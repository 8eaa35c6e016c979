"""Running on a cluster: pipe ships its own code to the executors, and checks that their Python
can run pipe's tasks before anything is written.

On any master that is not `local`, the executors' Python workers import pipe's task code (the
write, merge and read tasks of runtime/table/, the record readers of runtime/sources/) and the
packages those import. pipe's own code travels with the session: a zip of its packages
(SHIPPED_PACKAGES), built once per content into a cache folder and added with
SparkContext.addPyFile, so nothing of pipe needs to be installed on the nodes. The third-party
packages cannot travel that way (pyarrow, pandas and numpy are compiled); a probe job, run once
right after the session starts, asks every executor for its Python and their versions, and stops
the run with one message naming what is missing and the one setting that fixes it."""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from runtime.host import cache_dir
from runtime.spark import info

# The packages of pipe that executor tasks import (runtime.table.*, runtime.sources.* and the
# compiler's error types they use). The command line (pipe/) never runs on an executor.
SHIPPED_PACKAGES = ("runtime", "compiler")


@dataclass(frozen=True)
class Requirement:
    """A package pipe's executor tasks import: its import name, its name on PyPI and the versions
    pipe works with (as in pyproject.toml)."""

    module: str
    dist: str
    minimum: str | None = None
    below: str | None = None  # first version that is not supported

    def spec(self) -> str:
        return self.dist + "".join(s for s in (f">={self.minimum}" if self.minimum else "", f",<{self.below}" if self.below else ""))

    def accepts(self, version: str) -> bool:
        v = _version_tuple(version)
        return (self.minimum is None or v >= _version_tuple(self.minimum)) and (self.below is None or v < _version_tuple(self.below))


# What the tasks import on every cluster. pyspark itself is there by definition (it runs the worker).
TASK_REQUIREMENTS = (
    Requirement("pyarrow", "pyarrow", "15"),
    Requirement("pandas", "pandas", "2.0", "3"),
    Requirement("numpy", "numpy"),
    Requirement("fastavro", "fastavro", "1.9"),  # log blocks of merge-on-read tables, the metadata table
)
# Where tasks reach S3 themselves: a lake on S3 (its files are written with boto3, s3a or not), or
# an s3_incremental source read with boto3 (when Spark has no s3a).
BOTO3 = Requirement("boto3", "boto3", "1.34")
# Where tasks read Kafka: a `kind: kafka` source (Kafka's C client, runtime/sources/kafka.py).
KAFKA = Requirement("confluent_kafka", "confluent-kafka", "2.6")

# Modules the probe imports from the shipped zip: if one fails, the zip did not reach the executor.
_TASK_MODULES = ("runtime.table.writer", "runtime.table.merge", "runtime.sources.records")


class ExecutorPythonError(RuntimeError):
    """The executors' Python cannot run pipe's tasks. The message says what is missing where;
    `hint` says how to fix it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def is_local(master: str) -> bool:
    """A master whose executors are threads of this process (their Python is this Python)."""
    return master.strip().startswith("local")


class UnreachablePathError(RuntimeError):
    """A folder the executors must read or write lies on the driver's own disk."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def local_folder(uri: str) -> Path | None:
    """The folder on this machine a lake or input path names (`/x`, `file:///x`), or None for a
    remote one (`s3://`, `hdfs://`, ...)."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):] or "/")
    if "://" in uri:
        return None
    return Path(uri)


def check_reachable(master: str, shared_paths: tuple[str, ...], root: Path, folders: list[tuple[str, Path]]) -> None:
    """On a master whose executors run on other machines, every local folder the tasks read or
    write (`folders`: (what, folder) pairs, e.g. the lake and the `files` sources) must lie under
    one of the target's `shared_paths`, mounted at the same path on every node. Raises
    UnreachablePathError naming the first that does not."""
    if is_local(master):
        return
    root = Path(os.path.abspath(root))
    shared = [Path(os.path.abspath(root / p)) for p in shared_paths]
    for what, folder in folders:
        folder = Path(os.path.abspath(root / folder))
        if any(folder == s or s in folder.parents for s in shared):
            continue
        raise UnreachablePathError(
            f"{what} {folder} is a folder on this machine, but master {master} runs the executors on other machines, "
            "which cannot reach it",
            "put the lake on S3 (`lake: s3://bucket/prefix`) and the input in an `s3_incremental` source, or, if the "
            f"folder is on a file system mounted at the same path on every node (NFS, EFS, a cluster's shared disk), "
            f"name it in the target: `shared_paths: [{root if root in folder.parents else folder}]`")


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


# --------------------------------------------------------------------------------------------
# The code archive


def _package_files() -> list[tuple[str, Path]]:
    """(name inside the zip, file) for every file of SHIPPED_PACKAGES, sorted."""
    files = []
    for name in SHIPPED_PACKAGES:
        root = Path(importlib.import_module(name).__file__).resolve().parent
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    return sorted(files)


def code_archive(folder: Path | None = None) -> Path:
    """The zip of pipe's shipped packages, named after pipe's version and a hash of their content:
    built on the first call for this content, then reused (also by later runs)."""
    from pipe import __version__

    files = _package_files()
    digest = hashlib.sha256()
    for arcname, path in files:
        digest.update(arcname.encode() + b"\0" + path.read_bytes() + b"\0")
    folder = (folder or cache_dir()) / "pyfiles"
    target = folder / f"pipe-{__version__}-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pipe-", suffix=".zip.tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, path in files:
                info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))  # the same bytes for the same content
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)  # another process building the same zip writes the same bytes
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


# --------------------------------------------------------------------------------------------
# The probe

# Run on the executors. It is compiled from this text (not defined in this module) so that Spark
# ships the function itself rather than a reference to runtime.spark.cluster: the probe must run even
# where pipe's code did not arrive, and say so.
_PROBE_SOURCE = '''
def probe(_partition):
    import importlib, importlib.metadata, socket, sys
    versions = {}
    for module, dist in MODULES:
        try:
            importlib.import_module(module)
            try:
                versions[dist] = importlib.metadata.version(dist)
            except Exception:
                versions[dist] = getattr(sys.modules[module], "__version__", "?")
        except Exception as exc:
            versions[dist] = "missing: " + (str(exc).splitlines() or [type(exc).__name__])[0]
    code = ""
    for module in TASK_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:
            code = module + ": " + type(exc).__name__ + ": " + (str(exc).splitlines() or [""])[0]
            break
    yield (socket.gethostname(), sys.executable, ".".join(map(str, sys.version_info[:3])), versions, code)


def probe_json(_row):
    import json
    return json.dumps(next(probe(iter(()))))
'''


@dataclass(frozen=True)
class ExecutorPython:
    """What one executor's Python worker reported."""

    host: str
    python: str  # sys.executable on the executor
    version: str  # "3.11.7"
    packages: dict  # dist -> version, or "missing: ..." when it cannot be imported
    code_error: str  # "" when pipe's task modules import from the shipped zip

    def where(self) -> str:
        return f"{self.python} (Python {self.version} on {self.host})"


def _probe_function(requirements: tuple[Requirement, ...], name: str = "probe"):
    namespace = {"__name__": "pipe_executor_probe", "MODULES": tuple((r.module, r.dist) for r in requirements),
                 "TASK_MODULES": _TASK_MODULES}
    exec(compile(_PROBE_SOURCE, "<pipe executor probe>", "exec"), namespace)  # noqa: S102 - our own text
    return namespace[name]


def probe(spark, requirements: tuple[Requirement, ...]) -> list[ExecutorPython]:
    """Asks the executors' Python workers (one task per core the cluster offers, at least two)
    for their Python and the versions of `requirements`; one report per distinct Python."""
    sc = spark.sparkContext
    slices = max(2, sc.defaultParallelism)
    fn = _probe_function(requirements)
    sc.setJobDescription("pipe: check the executors' Python")
    try:
        rows = sc.parallelize(range(slices), slices).mapPartitions(fn).collect()
    finally:
        sc.setJobDescription(None)
    return _distinct(rows)


def probe_connect(spark, requirements: tuple[Requirement, ...]) -> list[ExecutorPython]:
    """`probe` over Spark Connect, which has no RDDs: the same function as a Python UDF (pickled
    rows, not Arrow: the probe must run where pyarrow is missing, and say so)."""
    import json

    from pyspark.sql.functions import udf


    slices = max(2, info.default_parallelism(spark))
    fn = udf(_probe_function(requirements, "probe_json"), "string", useArrow=False)
    rows = spark.range(0, slices, 1, slices).select(fn("id").alias("report")).collect()
    return _distinct([json.loads(r["report"]) for r in rows])


def _distinct(rows) -> list[ExecutorPython]:
    seen: dict[tuple, ExecutorPython] = {}
    for host, python, version, packages, code_error in rows:
        key = (host, python, version, tuple(sorted(packages.items())), code_error)
        seen.setdefault(key, ExecutorPython(host, python, version, dict(packages), code_error))
    return list(seen.values())


def problems(reports: list[ExecutorPython], requirements: tuple[Requirement, ...],
             driver_version: tuple[int, int] | None = None) -> list[str]:
    """What keeps the reported executor Pythons from running pipe's tasks, one sentence each."""
    driver = driver_version or sys.version_info[:2]
    out: list[str] = []
    for r in reports:
        if _version_tuple(r.version)[:2] != tuple(driver):
            out.append(f"{r.where()} is not Python {driver[0]}.{driver[1]}, the driver's: the tasks pipe sends are "
                       f"pickled for the driver's Python")
            continue
        missing = [q for q in requirements if r.packages.get(q.dist, "missing").startswith("missing")]
        wrong = [(q, r.packages[q.dist]) for q in requirements if q not in missing and not q.accepts(r.packages[q.dist])]
        if missing:
            out.append(f"{r.where()} lacks {', '.join(q.dist for q in missing)} (pipe's tasks need "
                       f"{', '.join(q.spec() for q in missing)})")
        if wrong:
            out.append(f"{r.where()} has " + ", ".join(f"{q.dist} {v} (pipe needs {q.spec()})" for q, v in wrong))
        if not missing and not wrong and r.code_error:
            out.append(f"{r.where()} cannot import pipe's shipped code ({r.code_error})")
    return out


def fix_hint(requirements: tuple[Requirement, ...]) -> str:
    specs = " ".join(f"'{q.spec()}'" for q in requirements)
    return ("give the executors a Python that has them, with one setting in the target: `pipe pack-env` builds a packed "
            "environment and prints the spark.archives and spark.pyspark.python settings that ship it; or install them "
            f"on every node (`pip install {specs}` for Python {sys.version_info[0]}.{sys.version_info[1]}) and point "
            "spark.pyspark.python at that Python (docs/deploy.md)")


def requirements_for(needs_boto3: bool, needs_kafka: bool = False) -> tuple[Requirement, ...]:
    return TASK_REQUIREMENTS + ((BOTO3,) if needs_boto3 else ()) + ((KAFKA,) if needs_kafka else ())


@dataclass(frozen=True)
class Shipment:
    """What `ship` did: the zip it added, what the executors reported, and how long it took."""

    archive: Path
    python: str  # the executors' Python as the session names it (spark.pyspark.python)
    executors: tuple[ExecutorPython, ...]
    seconds: float

    def describe(self) -> str:
        versions = sorted({r.version for r in self.executors})
        hosts = sorted({r.host for r in self.executors})
        return (f"executors' Python: {self.python} (Python {', '.join(versions)}) on {len(hosts)} host{'s' if len(hosts) != 1 else ''}; "
                f"pipe's code shipped as {self.archive.name} ({self.seconds:.1f}s)")


# The shipment of this process's session (None: local, or not started yet).
shipment: Shipment | None = None


def ship(spark, needs_boto3: bool = False, needs_kafka: bool = False) -> Shipment:
    """Adds pipe's code to the session and checks the executors' Python (see the module's
    docstring). Raises ExecutorPythonError, before anything is written, when they cannot run
    pipe's tasks; returns (and keeps in `shipment`) what was shipped and found otherwise."""
    global shipment
    started = time.perf_counter()
    archive = code_archive()
    spark.sparkContext.addPyFile(str(archive))
    requirements = requirements_for(needs_boto3, needs_kafka)
    try:
        reports = probe(spark, requirements)
    except Exception as exc:  # noqa: BLE001 - the probe's job itself failed: say why in one line
        raise _probe_failed(exc, spark.sparkContext.pythonExec, requirements) from exc
    found = problems(reports, requirements)
    if found:
        raise ExecutorPythonError("the executors' Python cannot run pipe's tasks: " + "; ".join(found),
                                  fix_hint(requirements))
    shipment = Shipment(archive, spark.sparkContext.pythonExec, tuple(reports), time.perf_counter() - started)
    return shipment


def ship_connect(spark, needs_boto3: bool = False, needs_kafka: bool = False) -> Shipment:
    """`ship` over Spark Connect: pipe's code as an artifact of the session (its clones, one per
    step, have it too), and the server's Python workers checked."""
    global shipment

    started = time.perf_counter()
    archive = code_archive()
    spark.addArtifacts(str(archive), pyfile=True)
    requirements = requirements_for(needs_boto3, needs_kafka)
    python = info.setting(spark, "spark.pyspark.python") or "python3"
    try:
        reports = probe_connect(spark, requirements)
    except Exception as exc:  # noqa: BLE001 - the probe's job itself failed: say why in one line
        raise _probe_failed(exc, python, requirements) from exc
    found = problems(reports, requirements)
    if found:
        raise ExecutorPythonError("the Spark Connect server's Python cannot run pipe's tasks: " + "; ".join(found),
                                  fix_hint(requirements))
    shipment = Shipment(archive, python, tuple(reports), time.perf_counter() - started)
    return shipment


_MISMATCH = re.compile(r"different version:? \(?([\d., ]+)\)? than that in driver:? ([\d.]+)")


def _probe_failed(exc: BaseException, python: str, requirements: tuple[Requirement, ...]) -> ExecutorPythonError:
    text = str(exc)
    driver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    mismatch = _MISMATCH.search(text)
    if mismatch or "PYTHON_VERSION_MISMATCH" in text:
        theirs = ".".join(re.findall(r"\d+", mismatch.group(1))[:2]) if mismatch else "another version"
        return ExecutorPythonError(f"the executors' Python {python} is Python {theirs}, the driver's is {driver}: "
                                   "pipe's tasks are pickled for the driver's Python minor version", fix_hint(requirements))
    if "Cannot run program" in text or "No such file or directory" in text:
        return ExecutorPythonError(f"the executors cannot start their Python {python} (it does not exist there, or is not "
                                   "executable)", fix_hint(requirements))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("at ", "JVM stacktrace"))]
    return ExecutorPythonError(f"checking the executors' Python {python} failed: {(lines or [type(exc).__name__])[0][:400]}",
                               "see the executors' logs (the Spark UI of the application); run with --debug for the whole error")


# --------------------------------------------------------------------------------------------
# The packed environment (`pipe pack-env`)

PACKED_ENV_NAME = "pipe_env"  # the folder Spark unpacks the archive into, in each executor's working directory
_PACK_FORMAT = "2"  # what an archive holds (2: with its bytecode); a new one is built when this changes


@dataclass(frozen=True)
class PackedEnv:
    """A tar.gz of a Python environment holding pipe's task dependencies, for spark.archives."""

    path: Path
    pins: tuple[str, ...]  # "pyarrow==26.0.1", ...
    python: str  # "3.11"
    base: str  # the interpreter the environment's bin/python points at

    def settings(self, uri: str | None = None) -> dict[str, str]:
        """The two Spark settings that give the executors this environment."""
        return {"spark.archives": f"{uri or self.path}#{PACKED_ENV_NAME}",
                "spark.pyspark.python": f"./{PACKED_ENV_NAME}/bin/python"}


def _pins(requirements: tuple[Requirement, ...]) -> tuple[str, ...]:
    """Each requirement at the version the driver has (tasks and driver then agree), else its spec."""
    import importlib.metadata

    pins = []
    for req in requirements:
        try:
            pins.append(f"{req.dist}=={importlib.metadata.version(req.dist)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(req.spec())
    return tuple(pins)


def pack_env(folder: Path | None = None, *, rebuild: bool = False) -> PackedEnv:
    """Builds (once per Python version and set of pins, unless `rebuild`) a venv with pipe's task
    dependencies at the driver's versions - not pyspark, which Spark puts on the executors' path
    itself, nor pipe, which `ship` sends - and packs it as a tar.gz for spark.archives.

    The venv's bin/python points at this machine's interpreter (sys._base_executable), like a
    venv-pack archive: the nodes need a Python of the same version at that path (the same image);
    the packages are wheels for this machine's platform."""
    import platform
    import subprocess
    import tarfile
    import venv

    requirements = TASK_REQUIREMENTS + (BOTO3, KAFKA)
    pins = _pins(requirements)
    base = getattr(sys, "_base_executable", sys.executable)
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    key = hashlib.sha256("\n".join((*pins, base, minor, platform.machine(), sys.platform, _PACK_FORMAT)).encode()).hexdigest()[:16]
    folder = (folder or cache_dir()) / "envs"
    target = folder / f"pipe-env-py{minor}-{key}.tar.gz"
    packed = PackedEnv(target, pins, minor, base)
    if target.is_file() and not rebuild:
        return packed
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pipe-env-", dir=folder) as tmp:
        root = Path(tmp) / PACKED_ENV_NAME
        venv.EnvBuilder(with_pip=True, symlinks=True).create(root)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        done = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--no-input", *pins], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
            raise ExecutorPythonError(f"installing {' '.join(pins)} into the packed environment failed: " + " / ".join(said),
                                      "pip needs the package index (or PIP_FIND_LINKS) that installed pipe's dependencies here")
        # the bytecode pip compiled stays: where executors cannot or may not write it (YARN's
        # localized archives, PYTHONDONTWRITEBYTECODE), each Python worker would compile pandas,
        # pyarrow and botocore again as it imports them, about 1.3 s of CPU every start
        partial = Path(tmp) / "env.tar.gz"
        with tarfile.open(partial, "w:gz", compresslevel=3) as tar:
            for path in sorted(root.iterdir()):
                tar.add(path, arcname=path.name)  # the archive's root is the environment's root
        os.replace(partial, target)
    return packed
