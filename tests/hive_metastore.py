"""A standalone Hive metastore service for the tests, as a cluster runs one: Hive's own
HiveMetaStore (the jars pyspark ships) serving thrift on a free loopback port, with an embedded
Derby database in a temporary folder. Spark sessions and pipe reach it as they reach a
cluster's metastore, through `hive.metastore.uris`. One per test session (a fixture in
tests/conftest.py); `python -m tests.hive_metastore` starts one by hand."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.jvm_options import FIRST_TIER_JIT, SERIAL_GC


class HiveMetastore:
    def __init__(self, workdir: Path):
        import pyspark

        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"thrift://127.0.0.1:{self.port}"
        jars = Path(pyspark.__file__).parent / "jars"
        settings = {
            "hive.async.log.enabled": "false",  # Hive's async logging needs a jar pyspark leaves out
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={self.workdir / 'metastore_db'};create=true",
            "datanucleus.schema.autoCreateAll": "true",
            "hive.metastore.schema.verification": "false",
            "hive.metastore.warehouse.dir": (self.workdir / "warehouse").as_uri(),
        }
        args = ["java", "-Xmx512m", FIRST_TIER_JIT, SERIAL_GC, f"-Dderby.stream.error.file={self.workdir / 'derby.log'}",
                "-cp", f"{jars}/*", "org.apache.hadoop.hive.metastore.HiveMetaStore", "-p", str(self.port)]
        for k, v in settings.items():
            args += ["--hiveconf", f"{k}={v}"]
        self.log = self.workdir / "metastore.log"
        java_home = os.environ.get("JAVA_HOME")
        if java_home:
            args[0] = str(Path(java_home) / "bin" / "java")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Hive metastore did not start (exit {self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the Hive metastore did not listen on {self.port} within 120 s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    import tempfile

    store = HiveMetastore(Path(tempfile.mkdtemp(prefix="pipe-metastore-")))
    print(f"Hive metastore at {store.uri} (Derby in {store.workdir}); Ctrl-C stops it")
    try:
        store.proc.wait()
    except KeyboardInterrupt:
        store.stop()
