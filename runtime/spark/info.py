"""What a Spark session is and offers, for a classic session and a Spark Connect one alike: the
bottom of runtime/spark, which the modules that start and ship to Spark ask (runtime/spark/api.py
gives them to everything above)."""

from __future__ import annotations

# The default parallelism of Connect sessions, by server session id (asked once).
_parallelism: dict[str, int] = {}


def is_connect(spark) -> bool:
    """Whether `spark` is a Spark Connect session (a client of a server)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark) -> int:
    """The cores Spark offers to a job: the number of tasks pipe splits a small job into."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    key = spark.client._session_id
    if key not in _parallelism:
        value = spark.conf.get("spark.default.parallelism", None)
        if not value:
            # spark.range without a partition count makes one partition per core the server's
            # SparkContext offers (its defaultParallelism); one small job, once per session
            value = spark.range(0, 1 << 16).selectExpr("spark_partition_id() AS p").agg({"p": "max"}).first()[0] + 1
        _parallelism[key] = max(1, int(value))
    return _parallelism[key]


def conf_value(spark, key: str) -> str | None:
    """A setting of the session itself (a SQL setting set at run time too), None when unset."""
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a server that keeps the setting to itself
        return None


def setting(spark, key: str) -> str | None:
    """A Spark setting of the session (or of its Spark context), None when unset."""
    if not is_connect(spark):
        # the context's own SparkConf (PySpark points it at the JVM's): one or two py4j calls,
        # where getConf() copies every setting over py4j, 140 calls on a plain session
        return spark.sparkContext._conf.get(key, None)
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a server that keeps the setting to itself
        return None


def master(spark) -> str:
    """The master of the Spark that runs the jobs (over Connect: the server's)."""
    if not is_connect(spark):
        return spark.sparkContext.master
    return setting(spark, "spark.master") or ""
