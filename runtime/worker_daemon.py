"""The Python worker daemon of pipe's own Spark Connect server (runtime/spark/server.py): PySpark's
own daemon, with the packages pipe's tasks import already imported before it forks a worker.

Spark forks each Python worker from its daemon, and stops a worker idle for a minute; a new
worker then imports pyarrow, pandas and pipe's task modules again (about a second of CPU each
time). Imported once here, a forked worker has them at no cost. Only the server pipe starts uses
it (`spark.python.daemon.module`): its workers run this very Python, where pipe is installed."""

import importlib

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
