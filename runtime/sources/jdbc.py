"""`kind: jdbc`: a database table, or a query, read with Spark's JDBC data source: the rows whose
`incremental_column` passed the high-water mark stored in the consuming table's last commit.

A run first asks the database, through Spark, one row of metadata: how many rows are new, the
largest value of the incremental column among them (the new high-water mark, fixed before any
row is read) and, with `partition_column`, its bounds. Then the executors read

    SELECT * FROM <dbtable or (query)> WHERE col >= <stored mark - lookback> AND col <= <new mark>

split into `num_partitions` ranges of `partition_column`, each a query of its own. The commit
stores the new mark; a run killed before its commit reads the same range again. `lookback`
re-reads rows a little below the mark: a transaction that commits late with an older value of
the column is still read (its key is written again; a keyed `upsert` table holds it once). The
lower bound is inclusive: rows sharing the mark's value are read again by the next run, never
skipped. A run finds something new only when a row is past the mark; rows within the lookback
come with it. Without `incremental_column` every run reads the whole table (a snapshot), as does
`--full-refresh`.

The driver (a Spark driver: Spark's JDBC source runs in its JVM) sees the metadata row only;
the rows go from the database to the executors and on to the table. The JDBC driver of the
database is a jar: for the URLs below pipe adds it to `spark.jars.packages` when it starts Spark
itself (Spark fetches it from Maven Central, as `--packages` does); elsewhere (a Spark Connect
server, a session started before) the setting is named in the error."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any, Mapping

from runtime.sources import Pending, SourceError

# url scheme -> (driver class, Maven coordinates of the JDBC driver)
DRIVERS = {
    "postgresql": ("org.postgresql.Driver", "org.postgresql:postgresql:42.7.4"),
    "mysql": ("com.mysql.cj.jdbc.Driver", "com.mysql:mysql-connector-j:9.1.0"),
    "mariadb": ("org.mariadb.jdbc.Driver", "org.mariadb.jdbc:mariadb-java-client:3.5.1"),
    "sqlserver": ("com.microsoft.sqlserver.jdbc.SQLServerDriver", "com.microsoft.sqlserver:mssql-jdbc:12.8.1.jre11"),
    "oracle": ("oracle.jdbc.OracleDriver", "com.oracle.database.jdbc:ojdbc11:23.6.0.24.10"),
}
_NUMBER_TYPES = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal")


def scheme(url: str) -> str:
    """`postgresql` of `jdbc:postgresql://...`."""
    return url.split(":", 2)[1].lower() if url.lower().startswith("jdbc:") and url.count(":") >= 2 else ""


def package_for(config: Mapping[str, Any]) -> str | None:
    """The Maven coordinates of the JDBC driver the source needs (its `driver_package`, or the
    one of its URL's database), or None."""
    return config.get("driver_package") or DRIVERS.get(scheme(str(config.get("url") or "")), (None, None))[1]


def _options(config: Mapping[str, Any]) -> dict[str, str]:
    """Spark's JDBC options: url, credentials, driver and the source's `properties`. Holds
    secrets: never logged or shown."""
    out = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (config.get("properties") or {}).items()}
    out["url"] = str(config["url"])
    for key in ("user", "password"):
        if config.get(key) is not None:
            out[key] = str(config[key])
    driver = config.get("driver") or DRIVERS.get(scheme(out["url"]), (None, None))[0]
    if driver:
        out["driver"] = driver
    return out


def shown_url(url: str) -> str:
    """The URL without its parameters or any credentials in it, for messages."""
    import re

    base = re.split(r"[?;]", url, maxsplit=1)[0]
    base = re.sub(r"//[^/@]*@", "//", base)
    return re.sub(r"(:thin:)[^@]*@", r"\1", base, flags=re.I)


def _relation(config: Mapping[str, Any]) -> str:
    return f"({config['query']}) pipe_q" if config.get("query") else str(config["dbtable"])


def _quote(value: str, dialect: str = "") -> str:
    if dialect in ("mysql", "mariadb"):  # backslashes escape there (unless NO_BACKSLASH_ESCAPES)
        value = value.replace("\\", "\\\\")
    return "'" + value.replace("'", "''") + "'"


def _literal(dialect: str, kind: str, value: str) -> str:
    """A mark's value as a SQL literal the database compares with the column: a number as it
    is; a timestamp as `2024-06-01 10:00:00.123456`, with `+00:00` when it is an instant
    (`timestamp`, not `timestamp_ntz`), in the form the database takes."""
    if kind == "number":
        return str(decimal.Decimal(value))  # a number, never anything else
    if kind in ("timestamp", "timestamp_ntz"):
        if dialect == "oracle":
            return f"TIMESTAMP '{value.replace('+00:00', ' +00:00')}'"
        if dialect == "sqlserver":
            return f"CAST('{value}' AS {'datetimeoffset' if value.endswith('+00:00') else 'datetime2'})"
        return _quote(value)
    if kind == "date" and dialect == "oracle":
        return f"DATE '{value}'"
    return _quote(value, dialect)


def _shift(kind: str, value: str, delta: float) -> str:
    """The mark's value moved by `delta` (seconds for a timestamp or date, units for a
    number), exactly."""
    if kind == "number":
        return str(decimal.Decimal(value) + decimal.Decimal(repr(delta)))
    if kind in ("timestamp", "timestamp_ntz"):
        at = dt.datetime.fromisoformat(value) + dt.timedelta(seconds=delta)
        return at.strftime("%Y-%m-%d %H:%M:%S.%f") + ("+00:00" if at.tzinfo is not None else "")
    if kind == "date":
        days = int(delta // 86400) if delta < 0 else -int(-delta // 86400)
        return (dt.date.fromisoformat(value) + dt.timedelta(days=days)).isoformat()
    return value


def _bounds(dialect: str, col: str, mark: Mapping[str, str]) -> tuple[str, str]:
    """(a row past `mark`, a row at or below it) as SQL predicates on `col`. A timestamp mark
    holds microseconds: a value finer than that (SQL Server's datetime2, Oracle's TIMESTAMP(9))
    up to the next microsecond counts as at the mark."""
    kind, value = mark["type"], mark["max"]
    if kind in ("timestamp", "timestamp_ntz"):
        step = _literal(dialect, kind, _shift(kind, value, 1e-6))
        return f"{col} >= {step}", f"{col} < {step}"
    return f"{col} > {_literal(dialect, kind, value)}", f"{col} <= {_literal(dialect, kind, value)}"


def parse_checkpoint(text: str | None, source: str) -> dict[str, str] | None:
    if not text:
        return None
    try:
        mark = json.loads(text)
        if isinstance(mark, dict) and {"column", "type", "max"} <= set(mark):
            return {k: str(mark[k]) for k in ("column", "type", "max")}
    except ValueError:
        pass
    raise SourceError(f"source {source}: the stored checkpoint {text[:80]!r} is not a JDBC high-water mark",
                      "another writer changed the table's last commit: `pipe restore <table> <instant>` to a commit pipe wrote, "
                      "or rebuild the table with `pipe run --select <table> --full-refresh`")


class JdbcPending(Pending):
    def __init__(self, name: str, config: Mapping[str, Any], where: str | None, count: int,
                 mark: dict[str, str] | None, bounds: tuple[str | None, str | None] | None, whole: bool):
        super().__init__(name, json.dumps(mark, sort_keys=True) if (count and mark) else ("snapshot" if count and whole else None), count)
        self.config = config
        self.where = where
        self.mark = mark
        self.bounds = bounds
        self.whole = whole

    def describe(self) -> str:
        if not self.count:
            return "no new rows"
        what = "rows (the whole table)" if self.whole else "new rows"
        text = f"{self.count} {what}"
        if self.mark:
            text += f", {self.mark['column']} up to {self.mark['max']}"
        return text

    def dataframe(self, spark):
        return read(spark, self)


def _reader(spark, config: Mapping[str, Any]):
    return spark.read.format("jdbc").options(**_options(config))


def _jdbc_error(name: str, config: Mapping[str, Any], doing: str, exc: BaseException) -> SourceError:
    from runtime.sources.files import _first_line

    text, whole = _first_line(exc), str(exc)
    package = package_for(config)
    if "No suitable driver" in whole or "ClassNotFoundException" in whole:
        text = next((line.strip() for line in whole.splitlines() if "No suitable driver" in line or "ClassNotFoundException" in line), text)
        return SourceError(f"source {name}: Spark has no JDBC driver for {scheme(str(config['url'])) or config['url'].split(':', 2)[:2]} "
                           f"({text})",
                           (f"add `spark.jars.packages: {package}` to the target's Spark settings (pipe adds it itself only when it "
                            "starts Spark), or the driver's jar with `spark.jars`") if package else
                           "give the driver's Maven coordinates in the source's `driver_package` and its class in `driver`")
    cause = next((line.strip() for line in whole.splitlines() if line.strip().startswith(("org.postgresql.util.PSQLException", "java.sql.",
                                                                                            "com.mysql", "org.mariadb", "com.microsoft.sqlserver",
                                                                                            "java.net."))), text)
    return SourceError(f"source {name}: cannot {doing} ({cause})",
                       "check `url`, `dbtable` or `query`, the credentials and that the database is reachable from the driver and the "
                       "executors; nothing of this source was written and its checkpoint did not move")


def _kind(spark_type: str) -> str:
    if spark_type == "timestamp_ntz":
        return "timestamp_ntz"  # a time without a zone (timestamp, DATETIME): compared as written
    if spark_type.startswith("timestamp"):
        return "timestamp"
    if spark_type == "date":
        return "date"
    return "number" if spark_type.split("(")[0] in _NUMBER_TYPES else "string"


def _as_text(column: str, spark_type: str):
    """`column` as text that SQL and Spark's JDBC bounds take: a timestamp with its microseconds
    (an instant in UTC: the session's time zone is UTC; a time without a zone as written), a
    number exactly."""
    from pyspark.sql import functions as F

    if _kind(spark_type).startswith("timestamp"):
        return F.date_format(F.col(column), "yyyy-MM-dd HH:mm:ss.SSSSSS").alias(column)
    return F.col(column).cast("string").alias(column)


def pending(spark, name: str, config: Mapping[str, Any], checkpoint: str | None, full: bool) -> JdbcPending:
    """What is new: one row of metadata from the database (count, the new mark, the split
    bounds), computed by the database."""
    col = config.get("incremental_column")
    part = config.get("partition_column")
    dialect = scheme(str(config["url"]))
    mark = None if full or not col else parse_checkpoint(checkpoint, name)
    where = fresh = None
    if col and mark is not None:
        if mark["column"] != col:
            mark = None  # the column changed: read everything once
        else:
            lookback = float(config.get("lookback") or 0)
            where = f"{col} >= {_literal(dialect, mark['type'], _shift(mark['type'], mark['max'], -lookback))}"
            fresh = _bounds(dialect, col, mark)[0]
    whole = not col or mark is None
    filtered = f"SELECT * FROM {_relation(config)}" + (f" WHERE {where}" if where else "")
    # rows past the stored mark: without any, nothing is new (rows within `lookback` below it are
    # read again with the next run that has some)
    picks = ["COUNT(*) AS n", (f"SUM(CASE WHEN {fresh} THEN 1 ELSE 0 END)" if fresh else "COUNT(*)") + " AS fresh"] + \
        ([f"MAX({col}) AS hi"] if col else []) + ([f"MIN({part}) AS plo", f"MAX({part}) AS phi"] if part else [])
    try:
        # a time without a zone is read as written (TIMESTAMP_NTZ), not in the JVM's zone, so the
        # mark is the database's own value
        meta = (_reader(spark, config).option("preferTimestampNTZ", "true")
                .option("query", f"SELECT {', '.join(picks)} FROM ({filtered}) pipe_new").load())
        types = {c.lower(): t for c, t in meta.dtypes}
        row = meta.select(*[_as_text(c, t) for c, t in meta.dtypes]).first()
    except Exception as exc:  # noqa: BLE001 - the database's or the driver's error
        raise _jdbc_error(name, config, "ask the database for the new rows", exc) from exc
    values = {k.lower(): v for k, v in row.asDict().items()}
    count = int(values["n"] or 0) if int(float(values["fresh"] or 0)) else 0
    new_mark = None
    if col and count and values.get("hi") is not None:
        kind = _kind(types["hi"])
        new_mark = {"column": col, "type": kind, "max": values["hi"] + ("+00:00" if kind == "timestamp" else "")}
        upper = _bounds(dialect, col, new_mark)[1]
        where = f"{where} AND {upper}" if where else upper
    bounds = (values["plo"], values["phi"]) if part and count else None
    return JdbcPending(name, config, where, count, new_mark, bounds, whole)


def read(spark, p: JdbcPending):
    """The new rows, read by the executors: one query, or `num_partitions` queries over ranges
    of `partition_column`."""
    config = p.config
    relation = f"(SELECT * FROM {_relation(config)}{' WHERE ' + p.where if p.where else ''}) pipe_rows"
    reader = _reader(spark, config).option("dbtable", relation)
    parts = int(config.get("num_partitions") or 1)
    if config.get("partition_column") and p.bounds and parts > 1 and p.bounds[0] is not None:
        low, high = p.bounds
        reader = (reader.option("partitionColumn", config["partition_column"]).option("lowerBound", low.split(".")[0] if ":" not in low else low)
                  .option("upperBound", high.split(".")[0] if ":" not in high else high).option("numPartitions", str(parts)))
    try:
        df = reader.load()
    except Exception as exc:  # noqa: BLE001
        raise _jdbc_error(p.name, config, "read the new rows", exc) from exc
    p.rows = p.count
    return df
