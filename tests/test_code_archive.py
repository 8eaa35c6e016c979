"""What pipe ships to a cluster's executors (runtime/spark/cluster.py), without a cluster: the zip of its
code, built once per content, and the requirements the probe checks, which must be pipe's own."""

from __future__ import annotations

import re
import tomllib
import zipfile

from runtime.spark import cluster
from runtime.spark.cluster import ExecutorPython, problems
from tests.conftest import REPO


def test_the_code_archive_holds_runtime_and_compiler_and_is_built_once_per_content(tmp_path):
    first = cluster.code_archive(tmp_path)
    assert first.parent == tmp_path / "pyfiles" and re.fullmatch(r"pipe-[\d.]+-[0-9a-f]{16}\.zip", first.name)
    names = set(zipfile.ZipFile(first).namelist())
    assert {"runtime/__init__.py", "runtime/table/writer.py", "runtime/sources/records.py", "compiler/errors.py"} <= names
    assert not any("__pycache__" in n or n.startswith("pipe/") for n in names)
    built = first.stat().st_mtime_ns
    assert cluster.code_archive(tmp_path) == first and first.stat().st_mtime_ns == built  # reused, not rebuilt
    assert list((tmp_path / "pyfiles").iterdir()) == [first]  # no temporary file left behind


def test_the_probe_checks_the_versions_pyproject_asks_for():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {re.match(r"[\w-]+", d).group(0): d for d in deps}
    for req in cluster.TASK_REQUIREMENTS + (cluster.BOTO3,):
        if req.dist == "numpy":  # comes with pyarrow and pandas; pipe's tasks import it directly
            continue
        assert declared[req.dist].replace(" ", "") == req.spec(), req


def _report(python="/opt/env/bin/python", version="3.11.7", **packages):
    base = {"pyarrow": "26.0.1", "pandas": "2.3.3", "numpy": "2.4.6", "fastavro": "1.13.1"}
    return ExecutorPython("node-1", python, version, {**base, **packages}, "")


def test_an_executor_python_is_judged_by_its_packages_and_minor_version():
    reqs = cluster.requirements_for(needs_boto3=True)
    assert problems([_report(boto3="1.40.0")], reqs, (3, 11)) == []
    assert problems([_report(fastavro="missing: No module named 'fastavro'", boto3="1.40.0")], reqs, (3, 11)) == [
        "/opt/env/bin/python (Python 3.11.7 on node-1) lacks fastavro (pipe's tasks need fastavro>=1.9)"]
    assert problems([_report(pandas="3.0.1", boto3="1.40.0")], reqs, (3, 11)) == [
        "/opt/env/bin/python (Python 3.11.7 on node-1) has pandas 3.0.1 (pipe needs pandas>=2.0,<3)"]
    assert problems([_report(version="3.12.1", boto3="1.40.0")], reqs, (3, 11)) == [
        "/opt/env/bin/python (Python 3.12.1 on node-1) is not Python 3.11, the driver's: the tasks pipe sends are "
        "pickled for the driver's Python"]
    # boto3 only where tasks read S3 themselves
    assert problems([_report()], cluster.requirements_for(needs_boto3=False), (3, 11)) == []
    assert "lacks boto3" in problems([_report()], reqs, (3, 11))[0]
