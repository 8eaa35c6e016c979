"""`kind: s3_incremental`: the objects named by new events in an S3 metadata table.

Hudi's S3EventsHoodieIncrSource, declaratively. The checkpoint (stored in the consuming table's
commit) is the metadata table instant read up to, or `instant#bucket/key` when a per-run byte
limit stopped inside an instant: the events of that instant are taken in (bucket, key) order, and
the next run goes on after that object. Each run:

1. reads the metadata table's events committed after the checkpoint (an incremental read; the
   latest version of each event, so an object written again is read again);
2. keeps `ObjectCreated:*` events matching `key_prefix`, `key_suffix`, `key_glob` and the size
   bounds, ordered by (commit time, bucket, key), and takes them up to `max_bytes_per_run`;
3. reads those objects in Spark: with Spark's own `s3a://` file system when the cluster has one,
   otherwise inside the executors (boto3), so object data never passes through the driver. Only
   the list of objects (bucket, key, size) reaches the driver.

Objects named by an event but gone from the bucket are skipped and counted."""

from __future__ import annotations

import fnmatch
import io
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from runtime.sources import Pending, SourceError, columns_ddl, human_bytes
from runtime.sources.files import CORRUPT, _first_line, read_with_spark
from runtime.sources.table import lost_checkpoint
from runtime.table.timeline import Timeline

OBJECT = "_pipe_object"
MISSING = "_pipe_missing_object"
NEEDED = ("bucket", "object_key", "object_size", "event_name", "event_time")
S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"


class NothingToRead(SourceError):
    """No object matched, and no declared schema gives the (empty) input its columns."""


@dataclass(frozen=True)
class Cursor:
    """Where a consumer is in the metadata table: instant, and within it the last object taken."""

    instant: str
    after: str | None = None  # "bucket/key" of the last object taken from `instant`

    def to_str(self) -> str:
        return self.instant if self.after is None else f"{self.instant}#{self.after}"

    @classmethod
    def parse(cls, text: str | None) -> "Cursor | None":
        if not text:
            return None
        instant, _, after = text.partition("#")
        return cls(instant, after or None)


def _before(instant: str) -> str:
    """A time just before `instant` (instants are fixed-width digit strings)."""
    return str(int(instant) - 1).zfill(len(instant))


@dataclass(frozen=True)
class S3Object:
    instant: str
    bucket: str
    key: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.bucket}/{self.key}"


class S3IncrementalPending(Pending):
    def __init__(self, name: str, config: Mapping[str, Any], upstream, since: str | None, until: str | None, commits: int,
                 cursor: Cursor | None = None, note: str = ""):
        super().__init__(name, until, commits)
        self.config = config
        self.upstream = upstream
        self.since = since  # read events committed after this (None: all of them, as of `until`)
        self.until = until
        self.cursor = cursor  # a partly consumed instant to go on from
        self.note = note
        self.objects: list[S3Object] | None = None
        self.waiting = 0
        self.missing: list[str] = []
        self._cached = None

    def describe(self) -> str:
        if self.is_empty:
            return "no new events"
        if self.objects is None:
            what = "all events" if self.since is None else f"{self.count} new commit{'s' if self.count != 1 else ''}"
            text = f"{what} of table {self.upstream.config.name} up to {self.until}"
        else:
            text = f"{len(self.objects)} object{'s' if len(self.objects) != 1 else ''} ({human_bytes(self.bytes)})"
            if self.waiting:
                text += f", {self.waiting} more waiting for the next run (max_bytes_per_run)"
            if self.missing:
                text += f"; {len(self.missing)} named by events but gone from the bucket (skipped), e.g. s3://{self.missing[0]}"
        return text + (f" ({self.note})" if self.note else "")

    # --- which objects -------------------------------------------------------------------------

    def _events(self, spark):
        from pyspark.sql import functions as F

        from runtime.table.table import Table

        upstream = Table(spark, self.upstream.storage, self.upstream.config)  # read in the step's session
        if self.since is None:
            events = upstream.read(as_of=self.until)
        else:
            events = upstream.read(since=self.since, until=self.until)
        missing = [c for c in NEEDED if c not in events.columns]
        if missing:
            raise SourceError(f"source {self.name}: table {self.upstream.config.name} is not an S3 metadata table (no column {', '.join(missing)})",
                              "metadata_table must name the table that stores an `s3_events` source (select * from {{ source('...') }})")
        c = self.config
        cond = F.col("event_name").startswith("ObjectCreated") & F.col("object_key").isNotNull()
        if c.get("key_prefix"):
            cond &= F.col("object_key").startswith(c["key_prefix"])
        if c.get("key_suffix"):
            cond &= F.col("object_key").endswith(c["key_suffix"])
        if c.get("key_glob"):
            cond &= F.col("object_key").rlike("^" + fnmatch.translate(c["key_glob"]))  # rlike finds; anchor it
        if c.get("min_object_size") is not None:
            cond &= F.col("object_size") >= F.lit(int(c["min_object_size"]))
        if c.get("max_object_size") is not None:
            cond &= F.col("object_size") <= F.lit(int(c["max_object_size"]))
        if self.cursor is not None and self.cursor.after is not None:
            # after (bucket, key) in the order objects are taken; bucket names hold no "/"
            bucket, _, key = self.cursor.after.partition("/")
            later = (F.col("bucket") > F.lit(bucket)) | ((F.col("bucket") == F.lit(bucket)) & (F.col("object_key") > F.lit(key)))
            cond &= (F.col("_hoodie_commit_time") > F.lit(self.cursor.instant)) | later
        # one read per object, however many events (Put, then Copy, ...) name it: the latest one
        latest = F.max_by(F.struct(F.col("_hoodie_commit_time"), F.coalesce(F.col("object_size"), F.lit(0)).alias("size")),
                          F.struct(F.col("_hoodie_commit_time"), F.col("event_time")))
        return (events.where(cond).groupBy("bucket", "object_key").agg(latest.alias("e"))
                .select(F.col("e._hoodie_commit_time").alias("instant"), "bucket", "object_key", F.col("e.size").alias("size")))

    def plan(self, spark, ignore_limits: bool = False) -> list[S3Object]:
        """The objects this run reads (metadata only reaches the driver), and the checkpoint."""
        rows = self._events(spark).orderBy("instant", "bucket", "object_key").collect()
        found = [S3Object(r["instant"], r["bucket"], r["object_key"], int(r["size"])) for r in rows]
        limit = None if ignore_limits else self.config.get("max_bytes_per_run")
        taken: list[S3Object] = []
        total = 0
        for o in found:
            if limit is not None and taken and total + o.size > limit:
                break
            taken.append(o)
            total += o.size
        self.objects, self.bytes, self.waiting = taken, total, len(found) - len(taken)
        if self.waiting:
            last = taken[-1]
            self.checkpoint = Cursor(last.instant, last.name).to_str()
        else:
            self.checkpoint = self.until
        return taken

    # --- reading them --------------------------------------------------------------------------

    def dataframe(self, spark, ignore_limits: bool = False):
        objects = self.plan(spark, ignore_limits) if self.objects is None else self.objects
        declared = self.config.get("schema")
        if not objects:
            if not declared:
                raise NothingToRead(f"source {self.name}: no new object to read, and without a declared `schema` there are no columns to "
                                    "offer the table; its checkpoint moves on when an object arrives",
                                    "declare the objects' columns in the source's `schema`")
            self.rows = 0
            return spark.createDataFrame([], columns_ddl(declared))
        if has_s3a(spark):
            df, self.rows = read_with_spark(spark, [f"s3a://{o.name}" for o in objects], self.config, self.name)
            return df
        df = read_in_executors(spark, objects, self.config, self.name, self)
        return df

    def release(self) -> None:
        if self._cached is not None:
            try:
                self._cached.unpersist()
            except Exception:  # noqa: BLE001 - the session may be gone already
                pass
            self._cached = None


def has_s3a(spark) -> bool:
    """Whether Spark itself can read s3a:// (hadoop-aws on the classpath)."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(S3A_CLASS)
        return True
    except Exception:  # noqa: BLE001 - ClassNotFoundException, or no JVM access (Spark Connect)
        return False


def pending(name: str, config: Mapping[str, Any], upstream, consumer: str, checkpoint_text: str | None) -> S3IncrementalPending:
    timeline: Timeline = upstream.timeline()
    done = timeline.completed()
    if not done:
        return S3IncrementalPending(name, config, upstream, None, None, 0)
    latest = done[-1].time
    cursor = Cursor.parse(checkpoint_text)
    if cursor is None:
        if config.get("read_latest_on_missing_checkpoint"):
            since = done[-2].time if len(done) > 1 else None
            return S3IncrementalPending(name, config, upstream, since, latest, 1, note="no checkpoint: the latest commit only")
        return S3IncrementalPending(name, config, upstream, None, latest, len(done))
    if cursor.instant == latest and cursor.after is None:
        return S3IncrementalPending(name, config, upstream, cursor.instant, None, 0)
    lost = lost_checkpoint(cursor.instant, done, upstream.config.name, upstream.storage)
    if lost:
        raise SourceError(f"source {name}: {lost}, so the objects since the last run of {consumer} cannot be told",
                          f"read every object the table names again with `pipe run --select {consumer} --full-refresh`")
    if cursor.after is not None:  # go on inside the partly consumed instant
        commits = len([i for i in done if i.time >= cursor.instant])
        return S3IncrementalPending(name, config, upstream, _before(cursor.instant), latest, commits, cursor)
    commits = len([i for i in done if i.time > cursor.instant])
    return S3IncrementalPending(name, config, upstream, cursor.instant, latest, commits, cursor)


# --- reading objects inside the executors --------------------------------------------------------


def _client(aws: Mapping[str, Any]):
    import boto3

    kwargs = {k: v for k, v in (("region_name", aws.get("region")), ("endpoint_url", aws.get("endpoint_url"))) if v}
    return boto3.client("s3", **kwargs)


def _get(client, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when it no longer exists."""
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def _options(config: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in (config.get("options") or {}).items():
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _flag(options: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() and v.lower() == "true" for k, v in options.items())


def fetch_text(aws: Mapping[str, Any], whole: bool, header: bool, batches: Iterator) -> Iterator:
    """mapInArrow: (bucket, object_key) rows in, (object, line, is_header, missing) rows out."""
    import pyarrow as pa

    client = _client(aws)
    schema = pa.schema([(OBJECT, pa.string()), ("line", pa.string()), ("is_header", pa.bool_()), (MISSING, pa.string())])
    for batch in batches:
        buckets, keys = batch.column("bucket").to_pylist(), batch.column("object_key").to_pylist()
        for bucket, key in zip(buckets, keys):
            name = f"{bucket}/{key}"
            body = _get(client, bucket, key)
            if body is None:
                yield pa.RecordBatch.from_arrays([pa.array([name]), pa.array([None], pa.string()), pa.array([False]), pa.array([name])], schema=schema)
                continue
            text = body.decode("utf-8", errors="replace")
            if whole:
                lines = [text] if text.strip() else []
            else:
                lines = [l.rstrip("\r") for l in text.split("\n") if l.strip()]  # records end at \n or \r\n, as for Spark
            if not lines:
                continue
            heads = [header and i == 0 for i in range(len(lines))]
            n = len(lines)
            yield pa.RecordBatch.from_arrays([pa.array([name] * n), pa.array(lines), pa.array(heads), pa.nulls(n, pa.string())], schema=schema)


def fetch_parquet(aws: Mapping[str, Any], arrow_schema, batches: Iterator) -> Iterator:
    """mapInArrow: (bucket, object_key) rows in, the objects' rows out (cast to the schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = _client(aws)
    data_fields = [f for f in arrow_schema if f.name not in (OBJECT, MISSING)]
    for batch in batches:
        for bucket, key in zip(batch.column("bucket").to_pylist(), batch.column("object_key").to_pylist()):
            name = f"{bucket}/{key}"
            body = _get(client, bucket, key)
            if body is None:
                cols = [pa.nulls(1, f.type) for f in data_fields] + [pa.array([name]), pa.array([name])]
                yield pa.RecordBatch.from_arrays(cols, schema=arrow_schema)
                continue
            table = pq.read_table(io.BytesIO(body))
            n = table.num_rows
            cols = []
            for f in data_fields:
                if f.name in table.column_names:
                    cols.append(table.column(f.name).cast(f.type).combine_chunks())
                else:
                    cols.append(pa.nulls(n, f.type))
            cols += [pa.array([name] * n), pa.nulls(n, pa.string())]
            out = pa.Table.from_arrays(cols, schema=arrow_schema)
            yield from out.to_batches()


def _parquet_schema_ddl(aws: Mapping[str, Any], obj: S3Object) -> str:
    """The Spark schema of a Parquet object, from its footer (ranged GETs: metadata only)."""
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    client = _client(aws)
    size = obj.size or client.head_object(Bucket=obj.bucket, Key=obj.key)["ContentLength"]
    tail = client.get_object(Bucket=obj.bucket, Key=obj.key, Range=f"bytes={max(0, size - 8)}-")["Body"].read()
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise SourceError(f"object s3://{obj.name} is not a Parquet file", "check `format` and the key filters of the source")
    footer_len = struct.unpack("<I", tail[:4])[0]
    start = max(0, size - 8 - footer_len)
    chunk = client.get_object(Bucket=obj.bucket, Key=obj.key, Range=f"bytes={start}-")["Body"].read()
    schema = pq.read_schema(pa.BufferReader(b"PAR1" + chunk)) if start > 0 else pq.read_schema(pa.BufferReader(chunk))
    return from_arrow_schema(schema).simpleString()[len("struct<"):-1]


def read_in_executors(spark, objects: list[S3Object], config: Mapping[str, Any], name: str, pending: S3IncrementalPending):
    """Reads the objects inside the executors (boto3) and checks them in one pass: records that
    do not parse stop the step with their object; objects gone from the bucket are counted."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    fmt = config["format"]
    aws = {"region": config.get("region"), "endpoint_url": config.get("endpoint_url")}
    options = _options(config)
    parallelism = max(1, min(len(objects), spark.sparkContext.defaultParallelism * 2))
    listing = spark.createDataFrame([(o.bucket, o.key) for o in objects], "bucket STRING, object_key STRING").repartition(parallelism)
    declared = config.get("schema")
    try:
        if fmt == "parquet":
            ddl = columns_ddl(declared) if declared else _parquet_schema_ddl(aws, objects[0])
            struct = StructType.fromDDL(ddl)
            out_struct = StructType(list(struct.fields) + StructType.fromDDL(f"`{OBJECT}` STRING, `{MISSING}` STRING").fields)
            arrow_schema = to_arrow_schema(out_struct)
            df = listing.mapInArrow(lambda it: fetch_parquet(aws, arrow_schema, it), out_struct)
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
            pending._cached = df
            data_cols = [f.name for f in struct.fields]
            total, missing_n = df.select(F.count(F.lit(1)), F.count(F.col(MISSING))).first()
            bad = 0
        else:
            whole = fmt == "json" and _flag(options, "multiLine")
            header = fmt == "csv" and _flag(options, "header")
            lines = listing.mapInArrow(lambda it: fetch_text(aws, whole, header, it),
                                       f"`{OBJECT}` STRING, line STRING, is_header BOOLEAN, `{MISSING}` STRING")
            lines = lines.persist(StorageLevel.MEMORY_AND_DISK)
            pending._cached = lines
            if declared:
                ddl = columns_ddl(declared)
            else:
                ddl = _infer(spark, lines, fmt, options)
            parse_opts = {k: v for k, v in options.items() if k.lower() not in ("multiline", "header", "inferschema")}
            parse_opts.update({"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
            with_corrupt = f"{ddl}, `{CORRUPT}` STRING"
            body = lines.where(~F.col("is_header") & F.col(MISSING).isNull())
            parse = F.from_json if fmt == "json" else F.from_csv
            parsed = body.select(F.col(OBJECT), parse(F.col("line"), with_corrupt, parse_opts).alias("r"), F.col("line"))
            if fmt == "json" and whole:
                # a multiLine object holds one record or an array of them; one that parses as
                # neither is a malformed record
                doc = F.ltrim(F.col("line"))
                as_array = F.from_json(F.col("line"), f"array<struct<{_struct_ddl(with_corrupt)}>>", {k: v for k, v in parse_opts.items() if k != "columnNameOfCorruptRecord"})
                records = F.when(doc.startswith("["), as_array).otherwise(F.array(F.col("one")))
                failed = F.struct(*[F.lit(None).cast(f.dataType).alias(f.name) for f in StructType.fromDDL(ddl).fields], F.col("line").alias(CORRUPT))
                parsed = (body.withColumn("one", parse(F.col("line"), with_corrupt, parse_opts))
                          .withColumn("rs", F.when(records.isNull(), F.array(failed)).otherwise(records))
                          .select(F.col(OBJECT), F.explode("rs").alias("r"), F.col("line")))
            data_cols = [f.name for f in StructType.fromDDL(ddl).fields]
            df = parsed.select(F.col(OBJECT), F.col("line"), *[F.col("r").getField(c).alias(c) for c in data_cols], F.col("r").getField(CORRUPT).alias(CORRUPT))
            total, bad = df.select(F.count(F.lit(1)), F.count(F.col(CORRUPT))).first()
            missing_n = lines.where(F.col(MISSING).isNotNull()).select(MISSING).distinct().count()
            if bad:
                rows = df.where(F.col(CORRUPT).isNotNull()).select(OBJECT, "line").limit(3).collect()
                where = "; ".join(f"s3://{r[OBJECT]}: {r['line'].strip()[:120]!r}" for r in rows)
                raise SourceError(f"source {name}: {bad} malformed record(s) in the new objects, e.g. {where}",
                                  "fix or remove those objects (or their records) and run again; nothing of this source was written")
    except SourceError:
        pending.release()
        raise
    except Exception as exc:  # noqa: BLE001 - Spark's errors on unreadable input
        pending.release()
        raise SourceError(f"source {name}: cannot read the {fmt} objects ({_first_line(exc)})",
                          "check `format`, `options` and `schema` of the source, and that the executors can reach S3") from exc
    if missing_n:
        gone = [r[MISSING] for r in (pending._cached.where(F.col(MISSING).isNotNull()).select(MISSING).distinct().limit(3).collect())]
        pending.missing = gone + [""] * (missing_n - len(gone))
    pending.rows = int(total) - int(missing_n) if fmt == "parquet" else int(total)
    result = df.where(F.col(MISSING).isNull()) if fmt == "parquet" else df
    return result.select(*[F.col(f"`{c}`") for c in data_cols])


def _struct_ddl(ddl: str) -> str:
    from pyspark.sql.types import StructType

    return ",".join(f"`{f.name}`:{f.dataType.simpleString()}" for f in StructType.fromDDL(ddl).fields)


def _infer(spark, lines, fmt: str, options: Mapping[str, str]) -> str:
    """The schema Spark's own reader infers from the (cached) lines; classic Spark only."""
    texts = lines.where("`" + MISSING + "` is null").select("line").rdd.map(lambda r: r[0])
    reader = spark.read.options(**{k: v for k, v in options.items()})
    if fmt == "json":
        schema = reader.json(texts).schema
    else:
        schema = reader.csv(texts).schema
    fields = [f for f in schema.fields if f.name != "_corrupt_record"]
    if not fields:
        raise SourceError("no column could be inferred from the objects", "declare the objects' columns in the source's `schema`")
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)

