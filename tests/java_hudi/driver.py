"""Java Hudi behind a pipe: one SparkSession with one Hudi Spark bundle, driven by JSON commands.

Run by the Spark 3.5 venv's python (never by pipe's own, which has pyspark 4), as
`python driver.py BUNDLE_JAR`. It reads one JSON command per line on stdin and answers one JSON
line per command on its own copy of stdout (the JVM's and Spark's output go to stderr). A failed
command answers {"ok": false, "error": ...} with the Java exception's text and cause chain; the
process goes on. Commands:

  {"op": "read", "path": P, "query": "snapshot"|"read_optimized"|"incremental",
   "as_of": T, "begin": B, "end": E, "options": {...}, "out": DIR}
      -> {"ok": true, "count": N}; the rows are written to the Parquet folder DIR
  {"op": "write", "path": P, "input": FILE, "format": "parquet"|"json", "options": {...},
   "mode": "append"|"overwrite"}              -> {"ok": true}
  {"op": "sql", "sql": S}                      -> {"ok": true, "rows": [[...], ...]}
  {"op": "version"}                            -> {"ok": true, "spark": V, "hudi": V}
  {"op": "quit"}

The JVM's time zone (user.timezone, and Spark's session time zone) is JAVA_HUDI_TZ, UTC by
default; Hudi's LOCAL timeline time zone makes instant times in it. The client sets TZ alike.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _java_text(exc: BaseException) -> str:
    """The Java exception and its causes, one per line, when `exc` came from the JVM."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return ""
    lines = []
    while java is not None and len(lines) < 12:
        lines.append(java.toString())
        java = java.getCause()
    return "\n".join(lines)


def _session(jar: str):
    from pyspark.sql import SparkSession

    zone = os.environ.get("JAVA_HUDI_TZ", "UTC")
    opts = f"-Duser.timezone={zone} -XX:+IgnoreUnrecognizedVMOptions"
    builder = (SparkSession.builder.master("local[2]").appName("java-hudi")
               .config("spark.jars", jar)
               # and on the JVM's own class path: Avro (Spark's, in the application class loader)
               # then finds Hudi's generated classes, which reading a delete block of a
               # metadata table's record index needs (with spark.jars alone Java fails on its own
               # tables: "GenericData$Record cannot be cast to HoodieDeleteRecord")
               .config("spark.driver.extraClassPath", jar)
               .config("spark.driver.memory", os.environ.get("JAVA_HUDI_MEMORY", "1g"))
               .config("spark.driver.extraJavaOptions", opts)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", zone)
               .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
               .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
               .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.hudi.catalog.HoodieCatalog")
               .config("spark.kryo.registrator", "org.apache.spark.HoodieSparkKryoRegistrar"))
    for key, value in json.loads(os.environ.get("JAVA_HUDI_CONF") or "{}").items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _read(spark, cmd: dict) -> dict:
    options = dict(cmd.get("options") or {})
    query = cmd.get("query", "snapshot")
    options["hoodie.datasource.query.type"] = query
    if cmd.get("as_of"):
        options["as.of.instant"] = cmd["as_of"]
    if query == "incremental":
        options["hoodie.datasource.read.begin.instanttime"] = cmd.get("begin") or "000"
        if cmd.get("end"):
            options["hoodie.datasource.read.end.instanttime"] = cmd["end"]
    df = spark.read.format("hudi").options(**options).load(cmd["path"])
    df = df.coalesce(1)
    df.write.mode("overwrite").parquet(cmd["out"])
    return {"count": spark.read.parquet(cmd["out"]).count()}


def _write(spark, cmd: dict) -> dict:
    fmt = cmd.get("format", "parquet")
    df = spark.read.format(fmt).load(cmd["input"])
    df.write.format("hudi").options(**(cmd.get("options") or {})).mode(cmd.get("mode", "append")).save(cmd["path"])
    return {}


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return _plain(value.asDict())
    return str(value)


def _sql(spark, cmd: dict) -> dict:
    df = spark.sql(cmd["sql"])
    return {"columns": df.columns, "rows": [_plain(list(r)) for r in df.collect()]}


def _catalog_partitions(spark, cmd: dict) -> dict:
    """The partitions a table has in the session's catalog (the metastore itself: Hudi's
    `show partitions` lists storage), with their locations."""
    catalog = spark._jsparkSession.sharedState().externalCatalog()
    parts = catalog.listPartitions(cmd["database"], cmd["table"], spark._jvm.scala.Option.empty())
    out = []
    for i in range(parts.size()):
        p = parts.apply(i)
        spec = p.spec()
        out.append({"spec": {k: spec.apply(k) for k in cmd["keys"]}, "location": p.location().toString()})
    return {"partitions": out}


def main() -> None:
    jar = sys.argv[1]
    # the protocol gets its own copy of stdout; everything else (py4j, the JVM) writes to stderr
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spark = _session(jar)
    handlers = {"read": _read, "write": _write, "sql": _sql, "catalog_partitions": _catalog_partitions}
    out.write(json.dumps({"ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                break
            if op == "version":
                jvm = spark.sparkContext._jvm  # spark.jars classes live in the context class loader
                pkg = jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass("org.apache.hudi.DefaultSource").getPackage()
                answer = {"spark": spark.version, "hudi": pkg.getImplementationVersion()}
            elif op in handlers:
                answer = handlers[op](spark, cmd)
            else:
                raise ValueError(f"unknown op {op!r}")
            out.write(json.dumps({"ok": True, **answer}) + "\n")
        except Exception as exc:  # noqa: BLE001 - every failure is an answer; the driver goes on
            out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:4000]}", "java": _java_text(exc),
                                  "traceback": traceback.format_exc()[-3000:]}) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
