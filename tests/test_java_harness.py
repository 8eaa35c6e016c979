"""The Java Hudi harness (tests/java_hudi/client.py): one long-lived driver per bundle and test
worker. A driver whose JVM goes away (a crash, a kill) fails the command it was given, and the
next command starts a new driver: one lost JVM fails one test, not every later test of the worker."""

from __future__ import annotations

import os
import signal
import subprocess

import pyarrow as pa
import pytest

from tests.java_hudi.client import JavaError, JavaHudi, rows
from tests.java_hudi.env import HUDI_11, ensure

pytestmark = pytest.mark.java_hudi


def _jvm_of(java: JavaHudi) -> int:
    """The pid of the driver's JVM (its child)."""
    out = subprocess.run(["pgrep", "-P", str(java.proc.pid)], capture_output=True, text=True).stdout.split()
    jvms = [int(p) for p in out if "java" in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")]
    assert len(jvms) == 1, out
    return jvms[0]


def test_a_driver_whose_jvm_died_fails_one_command_and_the_next_runs_on_a_new_one(tmp_path):
    ensure((HUDI_11,))
    java = JavaHudi(HUDI_11, tmp_path / "java")
    try:
        batch = pa.table({"id": [1, 2], "name": ["Zoë", "O'Brien"], "ts": [1_700_000_000_000, 1_700_000_000_001]})
        options = {"hoodie.table.name": "t", "hoodie.datasource.write.recordkey.field": "id",
                   "hoodie.datasource.write.precombine.field": "ts", "hoodie.datasource.write.operation": "upsert"}
        os.kill(_jvm_of(java), signal.SIGKILL)
        with pytest.raises(JavaError, match="Py4JError|Connection refused"):
            java.write(tmp_path / "t", batch, options)
        java.write(tmp_path / "t", batch, options)  # a new driver
        assert rows(java.read(tmp_path / "t"), ["id", "name"]) == [(1, "Zoë"), (2, "O'Brien")]
        assert list((tmp_path / "java").glob("driver-lost-*.log")), "the lost driver's log is kept"
    finally:
        java.close()
