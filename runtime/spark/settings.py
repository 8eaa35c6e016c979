"""The Spark settings pipe starts a JVM with (an embedded session's driver, pipe's own Spark
Connect server): quiet local defaults, the target's `conf` on top, and the file that hands
them to Spark's launcher without a command line that `ps` would show."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

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
