"""One SparkSession per process, built from the target's settings, with quiet local defaults.

Local mode: shuffle partitions sized to the cores, the UI off, Spark's logs down to warnings,
and Python workers that are this very interpreter (PYSPARK_PYTHON = sys.executable)."""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

_LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
}


def get_spark(master: str = "local[*]", conf: Mapping[str, Any] | None = None, app_name: str = "pipe"):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(_LOCAL_DEFAULTS) if master.startswith("local") else {"spark.sql.session.timeZone": "UTC"}
    if master.startswith("local"):
        cores = os.cpu_count() or 2
        settings["spark.sql.shuffle.partitions"] = str(max(2, cores * 2))
        settings["spark.default.parallelism"] = str(max(2, cores))
    settings.update({k: str(v) for k, v in (conf or {}).items()})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
