"""The options of the JVMs the tests start; why each is there: tests/conftest.py.

pipe's own Spark drivers (the shared session, every `pipe` subprocess, crash children) also map
a class-data-sharing archive of the classes a Spark driver loads (JDK 17's dynamic AppCDS): a
driver then starts on 10 CPU-seconds instead of 17 (measured on this 2-core machine: a local[1]
session, a count and a Parquet write, 9 s wall instead of 15). The archive is made once, by a
driver that does what pipe's do (tests/cds_workload.py), into .jvm-cache/ (git ignores it); it is
named by what it depends on (the java binary, pyspark's jars), and the JVM silently ignores an
archive whose class path or JDK build does not match, so a stale or foreign one costs nothing
but its speed-up. A folder with files on the class path disables sharing: the test options hence
reach Spark through PYSPARK_SUBMIT_ARGS, not a SPARK_CONF_DIR."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SERIAL_GC = "-XX:+UseSerialGC"  # every JVM of the tests
FIRST_TIER_JIT = "-XX:TieredStopAtLevel=1"  # pipe's own, the cluster's daemons, the Hive metastore; not Java Hudi's
SHORT_LIVED = f"{FIRST_TIER_JIT} {SERIAL_GC}"

CACHE = Path(__file__).resolve().parent.parent / ".jvm-cache"


def _archive_path() -> Path | None:
    """Where the archive for this java and this pyspark lives; None without a usable java."""
    import pyspark

    from runtime.spark.java import SparkStartError, find_java

    try:
        java = find_java()
    except SparkStartError:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256()
    key.update(os.path.realpath(java.executable).encode())
    key.update(str(os.stat(os.path.realpath(java.executable)).st_mtime_ns).encode())
    for jar in sorted(jars.glob("*.jar")):
        key.update(jar.name.encode())
    return CACHE / f"spark-driver-{pyspark.__version__}-{key.hexdigest()[:16]}.jsa"


def spark_class_archive() -> Path | None:
    """The class-data-sharing archive of pipe's Spark driver, made on first use under a file lock
    (another pytest worker may be making it); None when it cannot be made (the tests then start
    their JVMs without it)."""
    path = _archive_path()
    if path is None or path.is_file():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")}
        env["PYSPARK_SUBMIT_ARGS"] = (f'--conf "spark.driver.defaultJavaOptions={SHORT_LIVED} '
                                      f'-XX:ArchiveClassesAtExit={partial}" pyspark-shell')
        work = CACHE / f".work-{os.getpid()}"
        try:
            proc = subprocess.run([sys.executable, "-m", "tests.cds_workload", str(work)], env=env, capture_output=True,
                                  text=True, timeout=600, cwd=CACHE.parent)
            if proc.returncode != 0 or not partial.is_file():
                sys.stderr.write(f"tests/jvm_options.py: no class-data-sharing archive (exit {proc.returncode}): "
                                 f"{proc.stderr[-1500:]}\n")
                partial.unlink(missing_ok=True)
                return None
            partial.rename(path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return path


def pyspark_submit_args() -> str:
    """PYSPARK_SUBMIT_ARGS for the tests' pipe drivers and executors."""
    archive = spark_class_archive()
    driver = f"{SHORT_LIVED} -XX:SharedArchiveFile={archive}" if archive else SHORT_LIVED
    return (f'--conf "spark.driver.defaultJavaOptions={driver}" '
            f'--conf "spark.executor.defaultJavaOptions={SHORT_LIVED}" pyspark-shell')
