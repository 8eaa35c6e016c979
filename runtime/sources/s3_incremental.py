"""`kind: s3_incremental`: the objects named by new events in an S3 metadata table.

Hudi's S3EventsHoodieIncrSource, declaratively. The checkpoint (stored in the consuming table's
commit) is the metadata table instant read up to, or `instant#bucket/key` when a per-run byte
limit stopped inside an instant: the events of that instant are taken in (bucket, key) order, and
the next run goes on after that object. Each run:

1. reads the metadata table's events committed after the checkpoint (an incremental read; the
   latest version of each event, so an object written again is read again);
2. keeps `ObjectCreated:*` events matching `key_prefix`, `key_suffix`, `key_glob` and the size
   bounds, ordered by (commit time, bucket, key), and takes them up to `max_bytes_per_run`;
3. reads those objects in Spark: with Spark's own `s3a://` file system when Spark has one
   (hadoop-aws on its classpath; configured by the target's `spark.hadoop.fs.s3a.*`), otherwise
   inside the executors with boto3 (the source's `region`/`endpoint_url`, else the same fs.s3a
   settings: runtime/s3.py), so object data never passes through the driver. Only the list of
   objects (bucket, key, size) reaches the driver.

Objects named by an event but gone from the bucket are skipped and counted. Objects named by an
event in a bucket the source does not declare are not read: they go to the dead-letter table
`<lake>/<source>_dead_letter` (keyed by bucket and key) once the step succeeds."""

from __future__ import annotations

import datetime as dt
import fnmatch
import io
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from runtime import s3
from runtime.spark import api as spark_api
from runtime.sources import NothingToRead, Pending, SourceError, columns_ddl, human_bytes, records
from runtime.sources.files import _first_line, _read_hint, read_with_spark
from runtime.sources.table import lost_checkpoint
from runtime.table.timeline import Timeline

OBJECT = "_pipe_object"
MISSING = records.MISSING
PROBLEM = records.PROBLEM
NEEDED = ("bucket", "object_key", "object_size", "event_name", "event_time")
DEAD_LETTER_SUFFIX = "_dead_letter"
DEAD_LETTER_KEY = ("bucket", "object_key")
DEAD_LETTER_DDL = ("bucket STRING, object_key STRING, source STRING, metadata_table STRING, event_instant STRING, "
                   "consumer STRING, reason STRING, dead_lettered_at TIMESTAMP")
UNDECLARED = "the bucket is not in the source's `buckets`"


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
                 cursor: Cursor | None = None, note: str = "", s3a: Mapping[str, str] | None = None):
        super().__init__(name, until, commits)
        self.config = config
        self.s3a = dict(s3a or {})  # the target's fs.s3a settings
        self.read_through: str | None = None  # "s3a" or "boto3", once read
        self.upstream = upstream
        self.since = since  # read events committed after this (None: all of them, as of `until`)
        self.until = until
        self.cursor = cursor  # a partly consumed instant to go on from
        self.note = note
        self.objects: list[S3Object] | None = None
        self.waiting = 0
        self.missing: list[str] = []
        self.foreign: list[str] = []  # objects named by events in buckets the source does not declare
        self.foreign_objects: list[S3Object] = []  # the same, with the instant of their event (size unknown: -1)
        self.dead_lettered = 0

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
            if self.foreign:
                text += (f"; {len(self.foreign)} named by events in buckets the source does not declare (not read, "
                         f"to table {self.name}{DEAD_LETTER_SUFFIX}), e.g. {self.foreign[0]}")
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
        # the buckets the source declares, and the object sizes, are checked in `plan`: the size
        # an event states is not trusted, the object's own (HEAD) is
        if self.cursor is not None and self.cursor.after is not None:
            # after (bucket, key) in the order objects are taken; bucket names hold no "/"
            bucket, _, key = self.cursor.after.partition("/")
            later = (F.col("bucket") > F.lit(bucket)) | ((F.col("bucket") == F.lit(bucket)) & (F.col("object_key") > F.lit(key)))
            cond &= (F.col("_hoodie_commit_time") > F.lit(self.cursor.instant)) | later
        # one read per object, however many events (Put, then Copy, ...) name it: the latest one
        latest = F.max_by(F.struct(F.col("_hoodie_commit_time")), F.struct(F.col("_hoodie_commit_time"), F.col("event_time")))
        return (events.where(cond).groupBy("bucket", "object_key").agg(latest.alias("e"))
                .select(F.col("e._hoodie_commit_time").alias("instant"), "bucket", "object_key"))

    def plan(self, spark, ignore_limits: bool = False) -> list[S3Object]:
        """The objects this run reads (metadata only reaches the driver), and the checkpoint.
        Events naming a bucket the source does not declare are left out and reported; each
        object's size is asked of S3 (HEAD), in order, until `max_bytes_per_run` is reached."""
        rows = self._events(spark).orderBy("instant", "bucket", "object_key").collect()
        self.missing = []
        declared = set(self.config.get("buckets") or ())
        self.foreign_objects = [S3Object(r["instant"], r["bucket"], r["object_key"], -1) for r in rows if r["bucket"] not in declared]
        self.foreign = [f"s3://{o.name}" for o in self.foreign_objects]
        candidates = [(r["instant"], r["bucket"], r["object_key"]) for r in rows if r["bucket"] in declared]
        limit = None if ignore_limits else self.config.get("max_bytes_per_run")
        low, high = self.config.get("min_object_size"), self.config.get("max_object_size")
        taken: list[S3Object] = []
        total, seen, last = 0, 0, None
        for batch in _chunks(candidates, _HEAD_BATCH):
            sizes = object_sizes(self.config, self.s3a, [(b, k) for _, b, k in batch], self.name)
            full = False
            for (instant, bucket, key), size in zip(batch, sizes):
                if limit is not None and taken and size is not None and total + size > limit:
                    full = True
                    break
                seen += 1
                last = (instant, bucket, key)
                if size is None:
                    self.missing.append(f"{bucket}/{key}")
                    continue
                if (low is not None and size < int(low)) or (high is not None and size > int(high)):
                    continue
                taken.append(S3Object(instant, bucket, key, size))
                total += size
            if full:
                break
        self.objects, self.bytes, self.waiting = taken, total, len(candidates) - seen
        if self.waiting:
            self.checkpoint = Cursor(last[0], f"{last[1]}/{last[2]}").to_str()
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
            return spark_api.empty_frame(spark, columns_ddl(declared))
        if s3.has_s3a(spark):
            self.read_through = "s3a"
            df, self.rows, self.bad_records, self.bad_samples = read_with_spark(spark, [f"s3a://{o.name}" for o in objects], self.config,
                                                                                 self.name, "objects", self._cache)
            return df
        self.read_through = "boto3"
        return read_in_executors(spark, objects, self.config, self.name, self)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.read_through:
            out["read_through"] = self.read_through
        if self.foreign:
            out["undeclared_bucket_objects"] = len(self.foreign)
            out["undeclared_bucket_samples"] = self.foreign[:records.SAMPLES]
            out["dead_lettered"] = self.dead_lettered
        return out


def pending(name: str, config: Mapping[str, Any], upstream, consumer: str, checkpoint_text: str | None,
            s3a: Mapping[str, str] | None = None) -> S3IncrementalPending:
    """`s3a`: the target's fs.s3a settings, for reading the objects with boto3."""

    def make(*args, **kwargs) -> S3IncrementalPending:
        return S3IncrementalPending(name, config, upstream, *args, s3a=s3a, **kwargs)

    timeline: Timeline = upstream.timeline()
    if timeline.layout >= 2:  # its cursor is an instant time; a 1.x table's incremental reads take completion times
        raise SourceError(f"source {name}: the S3 metadata table {upstream.config.name} is Hudi table version "
                          f"{upstream.config.table_version}; kind: s3_incremental reads a version 6 metadata table",
                          f"declare {upstream.config.name} with `table_version: 6` (rebuild it with `pipe run --select "
                          f"{upstream.config.name} --full-refresh`)")
    done = timeline.completed()
    if not done:
        return make(None, None, 0)
    latest = done[-1].time
    cursor = Cursor.parse(checkpoint_text)
    if cursor is None:
        if config.get("read_latest_on_missing_checkpoint"):
            since = done[-2].time if len(done) > 1 else None
            return make(since, latest, 1, note="no checkpoint: the latest commit only")
        return make(None, latest, len(done))
    if cursor.instant == latest and cursor.after is None:
        return make(cursor.instant, None, 0)
    lost = lost_checkpoint(cursor.instant, done, upstream.config.name, upstream.storage)
    if lost:
        raise SourceError(f"source {name}: {lost}, so the objects since the last run of {consumer} cannot be told",
                          f"read every object the table names again with `pipe run --select {consumer} --full-refresh`")
    if cursor.after is not None:  # go on inside the partly consumed instant
        commits = len([i for i in done if i.time >= cursor.instant])
        return make(_before(cursor.instant), latest, commits, cursor)
    commits = len([i for i in done if i.time > cursor.instant])
    return make(cursor.instant, latest, commits, cursor)


def dead_letter_rows(pending: S3IncrementalPending, consumer: str) -> list[dict]:
    """The dead-letter table's rows for the objects `pending` would not read (metadata only)."""
    now = dt.datetime.now(dt.timezone.utc)
    return [{"bucket": o.bucket, "object_key": o.key, "source": pending.name, "metadata_table": pending.upstream.config.name,
             "event_instant": o.instant, "consumer": consumer, "reason": UNDECLARED, "dead_lettered_at": now}
            for o in pending.foreign_objects]


# --- reading objects inside the executors --------------------------------------------------------


def bucket_options(config: Mapping[str, Any], s3a: Mapping[str, str], buckets) -> dict[str, tuple]:
    """boto3's options per bucket: the target's fs.s3a settings for it, with the source's own
    `region` and `endpoint_url` over them. Travels to the tasks."""
    own = {k: config[k] for k in ("region", "endpoint_url") if config.get(k)}
    return {b: tuple({**dict(s3.client_options(s3a, b)), **own}.items()) for b in sorted(set(buckets))}


def _client(aws: Mapping[str, tuple], bucket: str):
    """The boto3 client for `bucket` (bucket_options), one per options in a process."""
    return s3.client(aws.get(bucket, ()))


_HEAD_BATCH = 64  # objects whose size is asked at once


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def object_sizes(config: Mapping[str, Any], s3a: Mapping[str, str], objects: list[tuple[str, str]], source: str) -> list[int | None]:
    """The size S3 gives each (bucket, key) (HEAD, a few at once), None for an object gone. The
    size an event states is never used: anyone who can send to the queue writes it."""
    from concurrent.futures import ThreadPoolExecutor

    aws = bucket_options(config, s3a, [b for b, _ in objects])

    def head(obj: tuple[str, str]) -> int | None:
        bucket, key = obj
        try:
            return int(_client(aws, bucket).head_object(Bucket=bucket, Key=key)["ContentLength"])
        except Exception as exc:  # noqa: BLE001 - botocore's ClientError, by its code
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise SourceError(f"source {source}: cannot read the size of s3://{bucket}/{key} ({_first_line(exc)})",
                              "check the source's `region`, `endpoint_url` and the credentials' access to the bucket; "
                              "nothing of this source was written and its checkpoint did not move") from exc

    if not objects:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(objects))) as pool:
        return list(pool.map(head, objects))


def _get(client, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None when it no longer exists."""
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def s3_opener(aws: Mapping[str, tuple]):
    """records.line_reader's opener: objects opened by "bucket/key"."""
    def open_object(name: str):
        """The object's body as a stream (read in pieces), or None when it no longer exists."""
        bucket, _, key = name.partition("/")
        client = _client(aws, bucket)
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"]
        except client.exceptions.NoSuchKey:
            return None

    return open_object


def fetch_parquet(aws: Mapping[str, tuple], arrow_schema, batches: Iterator) -> Iterator:
    """mapInArrow: (bucket, object_key) rows in, the objects' rows out (cast to the schema). An
    object gone gives one row naming it in MISSING; a column that does not cast to its declared
    type gives one row saying so in PROBLEM."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_fields = [f for f in arrow_schema if f.name not in (OBJECT, MISSING, PROBLEM)]

    def marker(name: str, missing: str | None, problem: str | None):
        cols = [pa.nulls(1, f.type) for f in data_fields] + [pa.array([name]), pa.array([missing], pa.string()), pa.array([problem], pa.string())]
        return pa.RecordBatch.from_arrays(cols, schema=arrow_schema)

    for batch in batches:
        for bucket, key in zip(batch.column("bucket").to_pylist(), batch.column("object_key").to_pylist()):
            name = f"{bucket}/{key}"
            body = _get(_client(aws, bucket), bucket, key)
            if body is None:
                yield marker(name, name, None)
                continue
            table = pq.read_table(io.BytesIO(body))
            n = table.num_rows
            cols, problem = [], None
            for f in data_fields:
                if f.name not in table.column_names:
                    cols.append(pa.nulls(n, f.type))
                    continue
                column = table.column(f.name)
                try:
                    cols.append(column.cast(f.type).combine_chunks())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    problem = f"column {f.name} holds {column.type} values, which do not convert to the declared type ({str(exc).splitlines()[0][:160]})"
                    break
            if problem is not None:
                yield marker(name, None, problem)
                continue
            cols += [pa.array([name] * n), pa.nulls(n, pa.string()), pa.nulls(n, pa.string())]
            out = pa.Table.from_arrays(cols, schema=arrow_schema)
            yield from out.to_batches()


def _parquet_schema_ddl(aws: Mapping[str, tuple], obj: S3Object) -> str:
    """The Spark schema of a Parquet object, from its footer (ranged GETs: metadata only)."""
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    client = _client(aws, obj.bucket)
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
    """Reads the objects inside the executors (boto3) and checks them in one pass: a record or
    value that does not fit the schema stops the step naming its object (records.py); objects
    gone from the bucket are counted."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    fmt = config["format"]
    aws = bucket_options(config, pending.s3a, [o.bucket for o in objects])
    options = config.get("options") or {}
    declared = config.get("schema")
    on_bad = config.get("on_bad_record") or "fail"
    try:
        if fmt == "parquet":
            parallelism = max(1, min(len(objects), spark_api.default_parallelism(spark) * 2))
            listing = spark.createDataFrame([(o.bucket, o.key) for o in objects], "bucket STRING, object_key STRING").repartition(parallelism)
            ddl = columns_ddl(declared) if declared else _parquet_schema_ddl(aws, objects[0])
            struct = StructType.fromDDL(ddl)
            out_struct = StructType(list(struct.fields) + StructType.fromDDL(f"`{OBJECT}` STRING, `{MISSING}` STRING, `{PROBLEM}` STRING").fields)
            arrow_schema = to_arrow_schema(out_struct, timezone="UTC")  # Spark's timestamps are instants in UTC
            df = listing.mapInArrow(lambda it: fetch_parquet(aws, arrow_schema, it), out_struct)
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
            pending._cache.append(df)
            data_cols = [f.name for f in struct.fields]
            total, missing_n, bad = df.select(F.count(F.lit(1)), F.count(F.col(MISSING)), F.count(F.col(PROBLEM))).first()
            if bad:
                rows = df.where(F.col(PROBLEM).isNotNull()).select(OBJECT, PROBLEM).orderBy(OBJECT).limit(records.SAMPLES).collect()
                samples = [f"s3://{r[OBJECT]}: {r[PROBLEM]}" for r in rows]
                raise SourceError(records.bad_message(name, "objects", bad, samples, unit="objects"),
                                  "declare the column with the type the objects have (and cast it in the SQL), or fix the objects; "
                                  "nothing of this source was written and its checkpoint did not move")
            missing = records.missing_names(df, missing_n)
            rows_read = int(total) - int(missing_n)
            result = df.where(F.col(MISSING).isNull()).select(*[F.col(f"`{c}`") for c in data_cols])
        else:
            lines = records.line_reader(spark, [(f"s3://{o.name}", o.name) for o in objects], lambda: s3_opener(aws), options, fmt)
            if declared:
                ddl = columns_ddl(declared)
            else:  # inferring reads the lines once more
                lines = lines.persist(StorageLevel.MEMORY_AND_DISK)
                pending._cache.append(lines)
                ddl = records.infer_ddl(spark, lines, fmt, options, name, where=f"({len(objects)} new)")
            data_cols = [f.name for f in StructType.fromDDL(ddl).fields]
            checked = records.check(records.parse(lines, ddl, fmt, options), data_cols, name, "objects", on_bad, pending._cache)
            result, rows_read, missing = checked.df, checked.rows, [m[len("s3://"):] for m in checked.missing]
            pending.bad_records, pending.bad_samples = checked.bad, checked.samples
    except SourceError:
        pending.release()
        raise
    except Exception as exc:  # noqa: BLE001 - Spark's errors on unreadable input
        pending.release()
        raise SourceError(f"source {name}: cannot read the {fmt} objects ({_first_line(exc)})",
                          _read_hint(exc, "check `format`, `options` and `schema` of the source, and that the executors can reach S3")) from exc
    pending.missing = pending.missing + missing  # gone at HEAD time (plan), then at read time
    pending.rows = rows_read
    return result
