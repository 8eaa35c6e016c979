"""Class-data sharing for the Spark driver pipe starts (runtime/spark/class_archive.py): the first
session that finds no archive writes one at its exit, the next ones map it; never from a folder
or file another user could write, never over the user's own choice of archive or sharing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.spark import class_archive
from runtime.spark.java import Java, find_java

REPO = Path(__file__).resolve().parent.parent


def _env(folder: Path, **more) -> dict[str, str]:
    return {"PIPE_JVM_CACHE": "on", **more}


def test_an_archive_is_planned_only_where_it_is_safe_and_wanted(tmp_path, monkeypatch):
    java = find_java()
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "jvm"
    made = class_archive.plan(java, {}, _env(folder))
    assert made is not None and made.dump_to is not None and "-XX:ArchiveClassesAtExit=" in made.option
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    # while that session writes it, another neither writes nor waits
    assert class_archive.plan(java, {}, _env(folder)) is None
    lock = folder / f".{made.path.stem}.dumping"
    old = time.time() - 3600  # a lock left by a process that died long ago is taken over
    os.utime(lock, (old, old))
    again = class_archive.plan(java, {}, _env(folder))
    assert again is not None and again.dump_to is not None
    lock.unlink()  # as its session's exit does
    made.path.write_bytes(b"an archive")
    made.path.chmod(0o600)
    used = class_archive.plan(java, {}, _env(folder))
    assert used is not None and used.dump_to is None and f"-XX:SharedArchiveFile={made.path}" in used.option
    settings = class_archive.with_option({"spark.driver.defaultJavaOptions": "-Dmine=1"}, used)
    assert settings["spark.driver.defaultJavaOptions"].endswith(f"-XX:SharedArchiveFile={made.path} -Dmine=1")
    # another class path (an extra jar) is another archive
    other = class_archive.plan(java, {"spark.driver.extraClassPath": "/opt/x.jar"}, _env(folder))
    assert other is not None and other.path != made.path
    # a file others can write is not mapped (the JVM would run its classes)
    made.path.chmod(0o666)
    assert class_archive.plan(java, {}, _env(folder)).dump_to is not None
    lock.unlink()
    # not wanted: turned off, the user's own archive or sharing choice, a VM that is not HotSpot
    assert class_archive.plan(java, {}, _env(folder, PIPE_JVM_CACHE="off")) is None
    for settings, env in [({"spark.driver.extraJavaOptions": "-Xshare:off"}, {}),
                          ({"spark.driver.defaultJavaOptions": "-XX:SharedArchiveFile=/x.jsa"}, {}),
                          ({}, {"PYSPARK_SUBMIT_ARGS": '--conf "spark.driver.defaultJavaOptions=-XX:SharedArchiveFile=/y.jsa" pyspark-shell'}),
                          ({}, {"JAVA_TOOL_OPTIONS": "-XX:ArchiveClassesAtExit=/z.jsa"})]:
        assert class_archive.plan(java, settings, _env(folder, **env)) is None, (settings, env)
    openj9 = Java(java.executable, None, java.version, java.major, "PATH", True, False)
    assert class_archive.plan(openj9, {}, _env(folder)) is None
    # a partial archive a JVM wrote after its session stopped waiting is removed once old and orphaned
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    orphan, alive = folder / f".{made.path.stem}.{gone}.partial", folder / f".{made.path.stem}.{os.getpid()}.partial"
    for partial in (orphan, alive):
        partial.write_bytes(b"half")
        os.utime(partial, (old, old))
    class_archive.plan(java, {}, _env(folder))
    assert not orphan.exists() and alive.exists()
    alive.unlink()
    # a cache folder pipe cannot make private is not used (runtime/host.py refuses it)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("PIPE_CACHE_DIR", str(not_a_folder))
    assert class_archive.plan(java, {}, _env(folder)) is None


def test_java_version_probe_tells_hotspot():
    assert find_java().hotspot  # the JDKs pipe's tests run on are HotSpot builds


# a fresh process as `pipe run` starts one: Spark with pipe's settings, a write; it prints the
# driver JVM's pid, whether the archive is mapped in it, and the rows written
FRESH = r"""
import json, sys
from runtime.spark.session import get_spark
from runtime.table import Table, TableConfig
spark = get_spark("local[2]", {}, app_name="pipe-archive-test")
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
maps = open(f"/proc/{pid}/maps").read()
rows = spark.createDataFrame([(i, f"Zoë {i}", i % 3) for i in range(200)], "id long, name string, part int")
table = Table.create(spark, sys.argv[1], TableConfig(name="t", record_key_fields=("id",), partition_fields=("part",)))
table.write(rows, "upsert")
print(json.dumps({"mapped": [line.split()[-1] for line in maps.splitlines() if line.endswith(".jsa")],
                  "rows": table.read().count()}))
"""


@pytest.mark.spark
def test_the_first_session_writes_the_archive_and_the_next_one_and_the_server_map_it(tmp_path):
    folder = tmp_path / "cache" / "jvm"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}  # not the tests' own archive
    env.update(PIPE_JVM_CACHE="on", PIPE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))

    def fresh(n: int) -> dict:
        proc = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path / f"lake{n}")], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "cds" not in proc.stdout.lower() and "cds" not in proc.stderr.lower(), proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = fresh(1)
    assert first["rows"] == 200
    archives = sorted(folder.iterdir())
    assert [p.suffix for p in archives] == [".jsa"], archives  # no partial file or lock left behind
    archive = archives[0]
    assert archive.stat().st_size > 10_000_000 and not archive.stat().st_mode & 0o022
    assert str(archive) not in first["mapped"]
    second = fresh(2)
    assert second["rows"] == 200
    assert str(archive) in second["mapped"], second  # the driver JVM maps the archive's classes
    assert sorted(folder.iterdir()) == archives

    # pipe's Spark Connect server maps it too (and never writes one: a signal stops its JVM)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pipe_project.yml").write_text("name: archived\n")

    def pipe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipe", "--project-dir", str(project), *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)

    started = pipe("server", "start", "--no-warmup")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        state = json.loads(next((tmp_path / "cache" / "servers").glob("*.json")).read_text())
        maps = Path(f"/proc/{state['server_pid']}/maps").read_text()
        assert str(archive) in maps, [line for line in maps.splitlines() if ".jsa" in line]
    finally:
        stopped = pipe("server", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert sorted(folder.iterdir()) == archives
