"""The Python worker daemon of pipe's local Spark (an embedded session on a local master, and
pipe's own Spark Connect server, runtime/spark/server.py): PySpark's own daemon, with the packages
pipe's tasks import already imported before it forks a worker.

Spark forks each Python worker from its daemon, and stops a worker idle for a minute; a new
worker then imports pyarrow, pandas and pipe's task packages again (about a second of CPU each
time). Imported once here, a forked worker has them at no cost. It is used only where the
workers run this very Python, where pipe is installed (`spark.python.daemon.module`).

Spark puts its own copies of PySpark and py4j first on the workers' path: the zip files inside
the installed pyspark package (python/lib/pyspark.zip, py4j-*-src.zip) and a jar. Python
compiles every module it imports from a zip anew (there is no bytecode cache in it), and every
task clears the zips' directory caches (pyspark.worker's setup_spark_files), so a fresh worker
spent about a second compiling PySpark and each task reading the zips' directories again. When
the installed package is the one those files come from (the zips lie inside it, py4j's zip has
the installed py4j's version), they are taken off the path: the same modules load from the
installed package, with its bytecode cache."""

import importlib
import os
import re
import sys


def _installed_pyspark_first(path: list[str]) -> list[str]:
    """`path` without the copies of PySpark and py4j that Spark puts inside the installed pyspark
    package (its zips and jars), when the installed packages are those very ones."""
    from importlib.machinery import PathFinder

    plain = [p for p in path if not p.endswith((".zip", ".jar"))]
    spec = PathFinder.find_spec("pyspark", plain)
    if spec is None or not spec.submodule_search_locations:
        return path
    home = os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep  # the installed package's folder
    py4j = PathFinder.find_spec("py4j", plain)
    py4j_version = None
    if py4j is not None and py4j.origin:
        try:  # (read off its version.py: importlib.metadata costs a tenth of a second)
            with open(os.path.join(os.path.dirname(py4j.origin), "version.py"), encoding="utf-8") as f:
                found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", f.read())
            py4j_version = found.group(1) if found else None
        except OSError:  # py4j's zip stays
            py4j_version = None
    kept = []
    for p in path:
        name = os.path.basename(p)
        inside = os.path.realpath(p).startswith(home)
        if inside and (name == "pyspark.zip" or name.endswith(".jar")):
            continue
        if inside and py4j_version and name == f"py4j-{py4j_version}-src.zip":
            continue
        kept.append(p)
    return kept


if __name__ == "__main__" and "pyspark" not in sys.modules:
    try:
        _kept = _installed_pyspark_first(sys.path)
        for _p in set(sys.path) - set(_kept):  # (finding this module made importers for them)
            sys.path_importer_cache.pop(_p, None)
        sys.path[:] = _kept
    except Exception:  # noqa: BLE001, S110 - best effort: Spark's own path still works
        pass

# pipe's task modules and what they import; a failure leaves the worker to import (and report) it
for _module in ("pyarrow", "pyarrow.parquet", "pandas", "fastavro", "runtime.table.writer", "runtime.table.merge",
                "runtime.table.files", "runtime.sources.records", "runtime.table.reader"):
    try:
        importlib.import_module(_module)
    except Exception:  # noqa: BLE001, S110 - best effort: the task's own import says what is wrong
        pass

if __name__ == "__main__":
    from pyspark import daemon

    daemon.manager()
