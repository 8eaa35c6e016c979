"""The jars that give the tests' Spark an S3 file system (s3a): hadoop-aws of the installed
pyspark's Hadoop version and the AWS SDK modules S3A uses (tests/s3a/pom.xml: about 14 MB, not
the SDK's 655 MB `bundle`), fetched from Maven Central under <repo>/.s3a (git ignores it).

Idempotent and quick when the jars are there; a file lock keeps two pytest processes from
fetching at once. Tests (and the cluster tests) call `jars()` and give Spark the list as
`spark.jars` in a target's settings; by hand: `python -m tests.s3a.env`.

Jars Spark has already (netty, slf4j, Apache httpclient, commons-codec and -logging) are left
out, so that Spark's own versions are the only ones on the classpath."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("PIPE_S3A_HOME", REPO / ".s3a"))
POM = Path(__file__).resolve().parent / "pom.xml"
SPARK_HAS = "io.netty,org.slf4j,org.apache.httpcomponents,commons-codec,commons-logging"


class SetupError(RuntimeError):
    pass


def hadoop_version() -> str:
    """The Hadoop version of the installed pyspark (from its hadoop-client-api jar)."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not found:
        raise SetupError("the installed pyspark has no hadoop-client-api jar: which Hadoop it runs is unknown")
    return found[-1].name[len("hadoop-client-api-"):-len(".jar")]


def folder() -> Path:
    return HOME / f"hadoop-{hadoop_version()}"


def _ready(where: Path) -> bool:
    return (where / ".complete").is_file()


def _fetch(where: Path, version: str) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise SetupError("the s3a tests need Maven (`mvn` on PATH) to fetch hadoop-aws and the AWS SDK from Maven Central")
    part = where.with_name(where.name + ".part")
    shutil.rmtree(part, ignore_errors=True)  # a half-fetched one from an interrupted set-up
    args = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dhadoop.version={version}",
            f"-DoutputDirectory={part}", "-DincludeScope=runtime", f"-DexcludeGroupIds={SPARK_HAS}"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"fetching hadoop-aws {version} and the AWS SDK failed ({' '.join(args)}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    if not (part / f"hadoop-aws-{version}.jar").is_file():
        raise SetupError(f"mvn did not leave hadoop-aws-{version}.jar in {part}")
    (part / ".complete").write_text("")
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)


def jars() -> list[Path]:
    """The jars for `spark.jars`, fetched on first use (under a lock)."""
    where = folder()
    if not _ready(where):
        HOME.mkdir(parents=True, exist_ok=True)
        with open(HOME / ".setup.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be fetching: wait for it
            if not _ready(where):
                _fetch(where, hadoop_version())
    return sorted(where.glob("*.jar"))


def spark_jars() -> str:
    """`jars()` as the value of `spark.jars`."""
    return ",".join(str(j) for j in jars())


def main() -> None:
    start = time.monotonic()
    found = jars()
    size = sum(j.stat().st_size for j in found)
    print(f"{len(found)} jars, {size / 1e6:.1f} MB, in {folder()} (ready in {time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    sys.exit(main())
