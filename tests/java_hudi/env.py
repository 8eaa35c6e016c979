"""The set-up of the Java Hudi differential tests: Hudi's Spark bundles from Maven Central and a
Python environment with the pyspark they are built for, under <repo>/.java-hudi (git ignores it).

Idempotent and quick when everything is there; a file lock keeps two pytest processes from
building it at once. The tests call `ensure()`; by hand: `python -m tests.java_hudi.env`.

Hudi 1.1.x is run on Spark 3.5 (its hudi-spark3.5-bundle_2.12), not Spark 4.0: the
hudi-spark4.0-bundle_2.13 artifact is not served by the Maven mirror our machines and CI reach.
The reading code of a Hudi version is the same on either Spark; docs/tables.md says so too.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("JAVA_HUDI_HOME", REPO / ".java-hudi"))
JARS = HOME / "jars"
PYSPARK = "3.5.9"
VENV = HOME / "venv-spark3.5"


@dataclass(frozen=True)
class Bundle:
    """One Hudi Spark bundle and the venv whose pyspark it is built for."""

    hudi: str
    artifact: str = "hudi-spark3.5-bundle_2.12"

    @property
    def coordinates(self) -> str:
        return f"org.apache.hudi:{self.artifact}:{self.hudi}"

    @property
    def jar(self) -> Path:
        return JARS / f"{self.artifact}-{self.hudi}.jar"

    @property
    def python(self) -> Path:
        return VENV / "bin" / "python"


HUDI_015 = Bundle("0.15.0")  # writes table version 6 natively
HUDI_11 = Bundle("1.1.1")  # reads version 6; its writers upgrade a table to version 9 by default
BUNDLES = (HUDI_015, HUDI_11)


class SetupError(RuntimeError):
    pass


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"{what} failed ({' '.join(args)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _fetch_jar(bundle: Bundle) -> None:
    if bundle.jar.is_file() and bundle.jar.stat().st_size > 0:
        return
    mvn = shutil.which("mvn")
    if not mvn:
        raise SetupError("the Java Hudi tests need Maven (`mvn`) to fetch Hudi's Spark bundles")
    JARS.mkdir(parents=True, exist_ok=True)
    _run([mvn, "-q", "-B", "dependency:copy", f"-Dartifact={bundle.coordinates}", f"-DoutputDirectory={JARS}"],
         f"fetching {bundle.coordinates}")
    if not bundle.jar.is_file():
        raise SetupError(f"mvn did not leave {bundle.jar}")


def _venv_ready() -> bool:
    marker = VENV / f".pyspark-{PYSPARK}"
    return marker.is_file() and (VENV / "bin" / "python").is_file()


def _make_venv() -> None:
    if _venv_ready():
        return
    if VENV.exists():
        shutil.rmtree(VENV)  # a half-made one from an interrupted set-up
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    _run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"pyspark=={PYSPARK}"],
         f"pip install pyspark=={PYSPARK}")
    (VENV / f".pyspark-{PYSPARK}").write_text("")


def ensure(bundles: tuple[Bundle, ...] = BUNDLES) -> tuple[Bundle, ...]:
    """Fetches what is missing, under a lock; returns the bundles, ready to run."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SetupError("the Java Hudi tests need Java 17 (`java` on PATH or JAVA_HOME)")
    HOME.mkdir(parents=True, exist_ok=True)
    if _venv_ready() and all(b.jar.is_file() for b in bundles):
        return bundles
    with open(HOME / ".setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be setting up: wait for it
        for bundle in bundles:
            _fetch_jar(bundle)
        _make_venv()
    return bundles


def main() -> None:
    start = time.monotonic()
    for bundle in ensure():
        print(f"{bundle.coordinates}: {bundle.jar} (python {bundle.python}, pyspark {PYSPARK})")
    print(f"ready in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
