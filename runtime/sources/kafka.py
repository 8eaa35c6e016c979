"""`kind: kafka`: the messages of a topic, or of every topic a pattern matches, since the offsets
stored in the consuming table's last commit.

The checkpoint is Hudi's Kafka checkpoint text (what Hudi Streamer stores as
`deltastreamer.checkpoint.key`): per topic, `topic,partition:offset,...` with the next offset to
read of each partition, topics joined by `;`:

    orders,0:1200,1:1187,2:1213

A run reads, per partition, from the stored offset to the end offset it saw at its start: the
last stable offset (what a `read_committed` consumer may read: messages of open transactions
wait, those of aborted ones are skipped), so the range is fixed before anything is read and a
killed run reads the same range again. `max_records_per_run` shortens the ranges (every
partition moves on, in proportion to its backlog). A partition or a topic new since the
checkpoint is read from its earliest offset. Offsets no longer in the topic (retention, a
compaction, a topic made anew) are `on_checkpoint_lost`'s: `fail` (the default) names topic,
partition and offsets; `earliest` and `latest` go on from there and say so.

Only offsets and counts reach the driver: its Kafka calls are metadata (the partitions and
their offsets, by the admin API). The executors read the ranges, one Spark task per partition
range, with Kafka's C client (confluent-kafka, librdkafka), and the records are parsed and
checked in Spark (records.py): a message that is not a JSON object of the declared schema stops
the step naming topic, partition and offset, or is counted and left out (`on_bad_record: drop`).
A message with no value (a tombstone of a compacted topic) is not a record: it is counted."""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from compiler.columns import KAFKA_COLUMNS
from runtime.sources import NothingToRead, Pending, SourceError, avro, change_events, columns_ddl, debezium, records
from runtime.spark import api as spark_api

META_COLUMNS = KAFKA_COLUMNS
TOPIC, PARTITION, OFFSET, TIMESTAMP, KEY = META_COLUMNS
META_DDL = f"`{TOPIC}` STRING, `{PARTITION}` INT, `{OFFSET}` BIGINT, `{TIMESTAMP}` TIMESTAMP, `{KEY}` STRING"
# one row per message as the executors hand it to Spark: the value as text (records.LINES_DDL's
# columns: "topic T partition P" in FILE, the offset in LINE_NO, a tombstone marked MISSING), then
# the message's own columns
_RAW_DDL = records.LINES_DDL + f", {META_DDL}"
SCHEMA = "_pipe_schema"  # a change event's columns (debezium.decoder()), given once per task and schema
_RAW_CHANGES_DDL = _RAW_DDL + f", `{SCHEMA}` STRING, `{records.DECODE_PROBLEM}` STRING"
_CONSUME_BATCH = 10_000  # messages asked of the client at once
_TIMEOUT_S = 30.0  # the driver's metadata calls, at most (`fetch_timeout_s` when shorter)
# an Arrow batch handed to Spark holds at most this many messages or bytes of values and keys (a
# string column of one batch holds under 2 GiB; large messages stay far from it)
_BATCH_ROWS, _BATCH_BYTES = 16_384, 16 << 20
# librdkafka's own log lines (a broker not reachable yet, a retry) go to Python logging, not to
# stderr: what fails reaches the user as the step's error
_LOG = logging.getLogger("pipe.kafka")
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's own rule: no `,` `;` `:` in a topic name


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def parse_checkpoint(text: str | None, source: str) -> dict[tuple[str, int], int]:
    """{(topic, partition): next offset} of a checkpoint text (empty for None)."""
    out: dict[tuple[str, int], int] = {}
    if not text:
        return out
    try:
        for part in text.split(";"):
            topic, *offsets = part.split(",")
            if not _TOPIC_NAME.match(topic) or not offsets:
                raise ValueError(topic)
            for item in offsets:
                p, _, o = item.partition(":")
                out[(topic, int(p))] = int(o)
    except ValueError as exc:
        raise SourceError(f"source {source}: the stored checkpoint {text[:80]!r} is not a Kafka checkpoint (topic,partition:offset,...)",
                          "another writer changed the table's last commit: `pipe restore <table> <instant>` to a commit pipe wrote, "
                          "or roll the other writer's commit back") from exc
    return out


def format_checkpoint(offsets: Mapping[tuple[str, int], int]) -> str:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append((partition, offset))
    return ";".join(f"{topic}," + ",".join(f"{p}:{o}" for p, o in sorted(parts)) for topic, parts in sorted(by_topic.items()))


def client_config(config: Mapping[str, Any]) -> dict[str, str]:
    """The Kafka client's settings: the source's `properties` (security settings and any
    librdkafka setting) and its bootstrap servers. Holds secrets: never logged or shown."""
    out = {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (config.get("properties") or {}).items()}
    out["bootstrap.servers"] = str(config["bootstrap_servers"])
    return out


def _admin(source: str, config: Mapping[str, Any]):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        return AdminClient({**client_config(config), "socket.timeout.ms": str(int(_timeout(config) * 1000)), "logger": _LOG})
    except (KafkaException, ValueError, TypeError) as exc:  # a setting the client does not know or a value it refuses
        from runtime.sources.files import _first_line

        raise SourceError(f"source {source}: the Kafka client refuses the source's settings ({_first_line(exc)})",
                          "`properties` take librdkafka's names and values (https://github.com/confluentinc/librdkafka/blob/master/"
                          "CONFIGURATION.md), e.g. `sasl.mechanism`, not the Java client's `sasl.jaas.config`") from exc


def _timeout(config: Mapping[str, Any]) -> float:
    return min(_TIMEOUT_S, float(config.get("fetch_timeout_s") or _TIMEOUT_S))


def _describe_ranges(ranges: list["Range"]) -> str:
    shown = ", ".join(f"{r.topic}/{r.partition} offsets {r.start}-{r.end - 1}" for r in ranges[:3])
    return shown + (f" and {len(ranges) - 3} more partition(s)" if len(ranges) > 3 else "")


def _where(config: Mapping[str, Any]) -> str:
    return f"the brokers at {config['bootstrap_servers']}"


def _kafka_error(source: str, config: Mapping[str, Any], doing: str, exc: BaseException) -> SourceError:
    from runtime.sources.files import _first_line

    return SourceError(f"source {source}: cannot {doing} from {_where(config)} ({_first_line(exc)})",
                       "check `bootstrap_servers`, that the brokers are up and reachable from this machine and the executors, and the "
                       "security settings in `properties` (security.protocol, sasl.mechanism, sasl.username, sasl.password); "
                       "nothing of this source was written and its checkpoint did not move")


def topics(source: str, config: Mapping[str, Any], admin=None) -> dict[str, list[int]]:
    """{topic: partitions} of the source's topic, or of every topic its pattern matches (topics
    whose name starts with `__` are Kafka's own and never match)."""
    admin = admin or _admin(source, config)
    try:
        meta = admin.list_topics(timeout=_timeout(config))
    except Exception as exc:  # noqa: BLE001 - KafkaException: the brokers cannot be reached
        raise _kafka_error(source, config, "list the topics", exc) from exc
    if config.get("topic"):
        wanted = [config["topic"]]
        if config["topic"] not in meta.topics:
            raise SourceError(f"source {source}: topic {config['topic']} does not exist on {_where(config)}",
                              "check `topic` (names are case-sensitive), or create the topic")
    else:
        pattern = re.compile(config["topic_pattern"])
        wanted = sorted(t for t in meta.topics if pattern.fullmatch(t) and not t.startswith("__"))
    out = {}
    for t in wanted:
        info = meta.topics[t]
        if info.error is not None:
            raise _kafka_error(source, config, f"read the partitions of topic {t}", info.error)
        out[t] = sorted(info.partitions)
    return out


def _offsets(source: str, config: Mapping[str, Any], admin, parts: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (earliest offset, last stable offset)}: what a read_committed consumer
    can read now."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    out: dict[tuple[str, int], list[int]] = {p: [0, 0] for p in parts}
    for i, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        try:
            futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in parts}, isolation_level=IsolationLevel.READ_COMMITTED,
                                         request_timeout=_timeout(config))
            for tp, future in futures.items():
                out[(tp.topic, tp.partition)][i] = future.result().offset
        except Exception as exc:  # noqa: BLE001 - KafkaException
            raise _kafka_error(source, config, "read the partitions' offsets", exc) from exc
    return {k: (v[0], v[1]) for k, v in out.items()}


def offsets_at(source: str, config: Mapping[str, Any], at_ms: int) -> str:
    """The checkpoint of the source at a moment (`--sample '3 days'`, runtime/sample.py): of each
    partition the first offset whose message was produced at or after `at_ms` (by the message's
    timestamp), or its end when none was."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(source, config)
    parts = [(t, p) for t, ps in topics(source, config, admin).items() for p in ps]
    bounds = _offsets(source, config, admin, parts)
    out = {}
    try:
        futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.for_timestamp(at_ms) for t, p in parts},
                                     isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=_timeout(config))
        for tp, future in futures.items():
            found = future.result().offset
            out[(tp.topic, tp.partition)] = found if found >= 0 else bounds[(tp.topic, tp.partition)][1]
    except Exception as exc:  # noqa: BLE001 - KafkaException
        raise _kafka_error(source, config, "find the offsets of a time", exc) from exc
    return format_checkpoint(out)


def plan_ranges(source: str, config: Mapping[str, Any], stored: Mapping[tuple[str, int], int],
                bounds: Mapping[tuple[str, int], tuple[int, int]], first_run: bool) -> tuple[list[Range], dict[tuple[str, int], int], list[str]]:
    """(ranges to read, the offsets to store after them, notes) from the stored offsets and the
    partitions' bounds. Raises SourceError for offsets no longer in the topic under `fail`."""
    notes: list[str] = []
    lost_policy = config.get("on_checkpoint_lost") or "fail"
    starting = config.get("starting_offsets") or "earliest"
    starts: dict[tuple[str, int], int] = {}
    for key, (low, high) in sorted(bounds.items()):
        topic, partition = key
        if key not in stored:
            # a first run starts where `starting_offsets` says; a partition or topic that appeared since is read whole
            starts[key] = high if (first_run and starting == "latest") else low
            continue
        at = stored[key]
        if low <= at <= high:
            starts[key] = at
            continue
        what = (f"topic {topic} partition {partition}: the stored offset {at} is no longer in the topic, whose offsets are now "
                f"{low} to {high}" + (" (retention or compaction removed the messages in between)" if at < low
                                      else " (the topic was deleted and made anew, or its messages were deleted)"))
        if lost_policy == "fail":
            raise SourceError(f"source {source}: {what}",
                              "set `on_checkpoint_lost: earliest` on the source to go on from the earliest offset there is (the "
                              "messages in between are lost to this table) or `latest` to skip to the newest; nothing was written "
                              "and the checkpoint did not move")
        starts[key] = low if lost_policy == "earliest" else high
        notes.append(f"{what}; went on from offset {starts[key]} (on_checkpoint_lost: {lost_policy})")
    gone = sorted(set(stored) - set(bounds))
    if gone:
        shown = ", ".join(f"{t}/{p}" for t, p in gone[:3])
        notes.append(f"{len(gone)} partition(s) of the checkpoint no longer match the source ({shown}); their offsets are kept")
    ranges = [Range(t, p, starts[(t, p)], bounds[(t, p)][1]) for t, p in sorted(starts)]
    limit = config.get("max_records_per_run")
    backlog = sum(r.size for r in ranges)
    if limit is not None and backlog > int(limit):
        ranges = _capped(ranges, int(limit))
    after = dict(stored)
    after.update({(r.topic, r.partition): r.end for r in ranges})
    return [r for r in ranges if r.size], after, notes


def _capped(ranges: list[Range], limit: int) -> list[Range]:
    """The ranges shortened to about `limit` offsets in all, each partition in proportion to its
    backlog (at least one offset of each partition that has any), so none waits behind another."""
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        take = 0 if not r.size else max(1, r.size * limit // total)
        out.append(Range(r.topic, r.partition, r.start, r.start + min(r.size, take)))
    return out


class KafkaPending(Pending):
    def __init__(self, name: str, config: Mapping[str, Any], ranges: list[Range], after: dict[tuple[str, int], int],
                 waiting: int, partitions: int, notes: list[str], moved: bool = False):
        total = sum(r.size for r in ranges)
        # the checkpoint moves with new messages, and also without: a first run that starts at the
        # latest offsets, or offsets skipped under on_checkpoint_lost, commit where they start
        super().__init__(name, format_checkpoint(after) if (ranges or moved) else None, total)
        self.config = config
        self.ranges = ranges
        self.waiting = waiting  # offsets left for the next run (max_records_per_run)
        self.partitions = partitions
        self.notes = notes
        self.tombstones = 0
        self.rejected = None  # the bad messages for the dead-letter table (on_bad_record: dead_letter), a DataFrame
        self.dead_lettered = 0

    def describe(self) -> str:
        topics = sorted({r.topic for r in self.ranges})
        if not self.ranges:
            text = f"no new messages in {self.partitions} partition{'s' if self.partitions != 1 else ''}"
            if self.checkpoint is not None:
                text += "; the offsets to start from are recorded"
        else:
            where = topics[0] if len(topics) == 1 else f"{len(topics)} topics"
            text = (f"{self.count} new message{'s' if self.count != 1 else ''} in {len(self.ranges)} of {self.partitions} "
                    f"partition{'s' if self.partitions != 1 else ''} of {where}")
            if self.waiting:
                text += f", {self.waiting} more waiting for the next run (max_records_per_run)"
            if self.tombstones:
                text += f"; {self.tombstones} message(s) without a row (tombstones, control records) skipped"
        return text + "".join(f"; {n}" for n in self.notes)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["ranges"] = [{"topic": r.topic, "partition": r.partition, "from": r.start, "to": r.end} for r in self.ranges]
        if self.tombstones:
            out["tombstones"] = self.tombstones
        if self.dead_lettered:
            out["dead_lettered"] = self.dead_lettered
        return out

    def dataframe(self, spark):
        return read(spark, self)


def pending(name: str, config: Mapping[str, Any], checkpoint_text: str | None) -> KafkaPending:
    """What is new in the source's topics for one table, from the offsets of its last commit:
    metadata calls only."""
    stored = parse_checkpoint(checkpoint_text, name)
    admin = _admin(name, config)
    found = topics(name, config, admin)
    parts = [(t, p) for t, ps in found.items() for p in ps]
    bounds = _offsets(name, config, admin, parts) if parts else {}
    ranges, after, notes = plan_ranges(name, config, stored, bounds, first_run=checkpoint_text is None)
    backlog = sum(max(0, bounds[k][1] - after.get(k, bounds[k][1])) for k in bounds)
    if not found:
        notes.append(f"no topic matches {config.get('topic_pattern')!r} yet")
    moved = any(stored.get(k) != v for k, v in after.items())
    return KafkaPending(name, config, ranges, after, backlog, len(parts), notes, moved)


# --- reading in the executors ----------------------------------------------------------------------


def fetch(client: Mapping[str, str], source: str, timeout_s: float, schema, ranges: Iterable[tuple[str, int, int, int]],
          decode: Callable[[bytes, bytes | None], tuple[str, str | None]] | None = None) -> Iterator:
    """Arrow batches of one row per message of each (topic, partition, start, end) range's
    [start, end) (records.LINES_DDL's columns and the message's own). The value is decoded as
    UTF-8 (bytes that are not become records.INVALID, which `records.parse` reports), or by
    `decode` (a change-event format: the record's JSON text and its columns, in SCHEMA; the reason it cannot, in records.DECODE_PROBLEM)."""
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    records._register_invalid_marker()
    consumer = Consumer({**client, "logger": _LOG, "group.id": f"pipe-{source}-{uuid.uuid4().hex[:8]}", "enable.auto.commit": "false",
                         "enable.partition.eof": "true", "isolation.level": "read_committed", "auto.offset.reset": "error"})
    try:
        for topic, partition, start, end in ranges:
            consumer.assign([TopicPartition(topic, partition, start)])
            place = f"topic {topic} partition {partition}"
            cols: dict[str, list] = {f.name: [] for f in schema}
            held = 0  # bytes of the values and keys in `cols`
            deadline = time.monotonic() + timeout_s
            done = False
            following = start  # the offset after the last message seen
            while not done:
                # consume() waits until it has as many messages as asked for (or the timeout): never
                # ask for more than the range still holds, or its last batch waits out the timeout
                messages = consumer.consume(max(1, min(_CONSUME_BATCH, end - following)), 1.0)
                if not messages and time.monotonic() > deadline:
                    raise RuntimeError(f"pipe: {place}: no message for {timeout_s:.0f} s while reading offsets {start} to {end - 1} "
                                       f"(last read: {cols[records.LINE_NO][-1] if cols[records.LINE_NO] else 'none'})")
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"pipe: {place}: {err.str()}")
                        # the end of what is readable: the range is done once it reaches `end` (the
                        # offsets before it may be transaction markers, never delivered); short of
                        # it, the messages are not there yet (a broker restarting): wait for them
                        if m.offset() >= end:
                            done = True
                            break
                        continue
                    deadline = time.monotonic() + timeout_s
                    offset = m.offset()
                    following = offset + 1
                    if offset >= end:
                        done = True
                        break
                    value, key = m.value(), m.key()
                    ts_type, ts = m.timestamp()
                    cols[records.FILE].append(place)
                    cols[records.LINE_NO].append(offset)
                    skipped = value is None  # a tombstone of a compacted topic
                    if decode is None:
                        cols[records.TEXT].append(value)  # bytes: made text by _batch, in Arrow
                    else:
                        text = ddl = problem = None
                        if value is not None:
                            try:
                                decoded = decode(value, key)
                                if decoded is None:  # a message without a row (a control record): skipped, counted
                                    skipped = True
                                else:
                                    text, ddl = decoded
                            except change_events.BadEvent as exc:  # kept as it came, for the message and the dead-letter table
                                problem, text = str(exc), _as_text(value)
                            except avro.RegistryError:
                                raise  # the registry, not the message: the run stops
                            except Exception as exc:  # noqa: BLE001 - any other failure on an untrusted message is the message's
                                problem = f"not a message pipe can read ({type(exc).__name__}: {str(exc)[:200]})"
                                text = _as_text(value)
                        cols[records.TEXT].append(text)
                        cols[SCHEMA].append(ddl)
                        cols[records.DECODE_PROBLEM].append(problem)
                    held += len(value or b"") + len(key or b"")
                    cols[records.IS_HEADER].append(False)
                    cols[records.MISSING].append(f"{place} offset {offset}" if skipped else None)
                    cols[TOPIC].append(topic)
                    cols[PARTITION].append(partition)
                    cols[OFFSET].append(offset)
                    cols[TIMESTAMP].append(ts * 1000 if ts_type and ts >= 0 else None)  # millis to Spark's micros
                    cols[KEY].append(None if key is None else key.decode("utf-8", "backslashreplace"))  # binary keys: \\xNN escapes
                    if offset >= end - 1:
                        done = True
                        break
                if len(cols[records.FILE]) >= _BATCH_ROWS or held >= _BATCH_BYTES or done:
                    if cols[records.FILE]:
                        yield _batch(cols, schema, raw=decode is None)
                    cols, held = {f.name: [] for f in schema}, 0
    finally:
        consumer.close()


def _batch(cols: dict[str, list], schema, raw: bool):
    """The Arrow batch of `cols`. With `raw`, the values are the messages' bytes: checked to be
    UTF-8 by Arrow in one call (a Python str of text that is not ASCII costs ten times as much to
    hand to Arrow as its bytes do); a batch with bytes that are not is decoded message by message,
    their bad bytes marked records.INVALID."""
    import pyarrow as pa

    arrays = []
    for f in schema:
        values = cols[f.name]
        if raw and f.name == records.TEXT:
            try:
                arrays.append(pa.array(values, pa.binary()).cast(f.type))
                continue
            except pa.ArrowInvalid:
                values = [None if v is None else v.decode("utf-8", records._INVALID_HANDLER) for v in values]
        arrays.append(pa.array(values, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _as_text(value: bytes) -> str:
    """A message's value as text for a bad record's sample and the dead-letter table: UTF-8, or
    `base64:` and its bytes in base64 (an Avro message)."""
    import base64

    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode()


def _decoded_ddl(spark, name: str, lines, options: Mapping[str, Any], ranges: list[Range], changes: bool) -> str:
    """The columns of a run of decoded messages: the union of the row schemas the messages carry
    (each distinct one with the first place it was seen: metadata), or, for events without
    schemas (JsonConverter's `schemas.enable=false`, DMS), what Spark infers from the rows; then
    the _cdc_ columns of change events (`changes`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    found = (lines.where(F.col(SCHEMA).isNotNull()).groupBy(SCHEMA)
             .agg(F.min(F.struct(TOPIC, PARTITION, OFFSET)).alias("at")).collect())
    cdc = [f.name for f in StructType.fromDDL(change_events.CDC_DDL).fields] if changes else []
    if found:
        found = sorted(found, key=lambda r: (r["at"][0], r["at"][1], r["at"][2]))
        data = debezium.union_ddl(name, [(f"{r['at'][0]}/{r['at'][1]} offset {r['at'][2]}", r[SCHEMA]) for r in found])
    else:
        try:
            inferred = records.infer_ddl(spark, lines, "json", options, name, "messages", "at " + _describe_ranges(ranges))
        except SourceError:
            if changes and lines.where(F.col(records.DECODE_PROBLEM).isNotNull()).limit(1).count():
                return change_events.CDC_DDL  # no event decoded: the check that follows names the messages and why
            raise
        data = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in StructType.fromDDL(inferred).fields if f.name not in cdc)
    clash = sorted({f.name for f in StructType.fromDDL(data).fields} & set(cdc)) if data else []
    if clash:
        raise SourceError(f"source {name}: the changed table has a column named {clash[0]}, the name of a column pipe adds to every change",
                          "rename the column in the database, or declare the source's `schema` without it")
    return (data + ", " if data else "") + change_events.CDC_DDL


DEAD_LETTER_SUFFIX = "_dead_letter"
DEAD_LETTER_KEY = ("consumer", "topic", "partition", "offset")
DEAD_LETTER_DDL = ("consumer STRING, topic STRING, partition INT, offset BIGINT, source STRING, message_key STRING, "
                   "message_timestamp TIMESTAMP, reason STRING, value STRING, dead_lettered_at TIMESTAMP")


def _dead_letters(rejected, name: str):
    """The dead-letter table's rows of the bad messages (`on_bad_record: dead_letter`), but the
    consumer (the table that read them), which `settle` adds: a DataFrame, never collected."""
    from pyspark.sql import functions as F

    return rejected.select(F.col(TOPIC).alias("topic"), F.col(PARTITION).alias("partition"), F.col(OFFSET).alias("offset"),
                           F.lit(name).alias("source"), F.col(KEY).alias("message_key"), F.col(TIMESTAMP).alias("message_timestamp"),
                           F.col(records.PROBLEM).alias("reason"),
                           F.regexp_replace(F.col(records.TEXT), records.INVALID, "\ufffd").alias("value"),
                           F.current_timestamp().alias("dead_lettered_at")).dropDuplicates(["topic", "partition", "offset"])


def read(spark, p: KafkaPending):
    """The new messages of `p` as the table's input: the value's columns (declared, or inferred
    from the messages) and the message's own (`_kafka_topic`, `_kafka_partition`,
    `_kafka_offset`, `_kafka_timestamp`, `_kafka_key`), one Spark task per partition range."""
    from pyspark import StorageLevel
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    config, name = p.config, p.name
    options = config.get("options") or {}
    declared = config.get("schema")
    if not p.ranges:  # the checkpoint moves without a message (a first run at the latest offsets)
        if not declared:
            raise NothingToRead(f"source {name}: no new message, and without a declared `schema` there are no columns to offer the table",
                                "declare the messages' columns in the source's `schema`")
        p.rows = 0
        cdc = f"{change_events.CDC_DDL}, " if config.get("format") in change_events.FORMATS else ""
        return spark_api.empty_frame(spark, f"{columns_ddl(declared)}, {cdc}{META_DDL}")
    client = client_config(config)
    timeout_s = float(config.get("fetch_timeout_s") or 120)
    ranges = [(r.topic, r.partition, r.start, r.end) for r in p.ranges]
    changes = config.get("format") in change_events.FORMATS  # rows with the _cdc_ columns
    decoded = config.get("format") in change_events.DECODED
    registry = avro.registry_settings(config)
    raw_struct = StructType.fromDDL(_RAW_CHANGES_DDL if decoded else _RAW_DDL)
    arrow_schema = to_arrow_schema(raw_struct, timezone="UTC")  # made here: the executors have no Spark to parse DDL

    def task(batches):
        decode = change_events.decoder(config["format"], registry) if decoded else None
        for batch in batches:  # ids of spark.range: one range per task
            yield from fetch(client, name, timeout_s, arrow_schema, [ranges[i] for i in batch.column(0).to_pylist()], decode)

    try:
        lines = spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(task, raw_struct)
        if declared:
            ddl = columns_ddl(declared) + (f", {change_events.CDC_DDL}" if changes else "")
        else:  # inferring reads the messages once more: keep them
            lines = lines.persist(StorageLevel.MEMORY_AND_DISK)
            p._cache.append(lines)
            ddl = _decoded_ddl(spark, name, lines, options, p.ranges, changes) if decoded else \
                records.infer_ddl(spark, lines, "json", options, name, "messages", "at " + _describe_ranges(p.ranges))
        data_cols = [f.name for f in StructType.fromDDL(ddl).fields]
        clash = sorted(set(data_cols) & set(META_COLUMNS))
        if clash:
            raise SourceError(f"source {name}: the messages have a field named {clash[0]}, the name of a column pipe adds to every message",
                              "rename the field in the messages' producer, or declare the source's `schema` without it")
        keep = META_COLUMNS + ((records.DECODE_PROBLEM,) if decoded else ())
        parsed = records.parse(lines, ddl, "json", options, keep=keep, with_text=config.get("on_bad_record") == "dead_letter",
                               arrays=not decoded)
        checked = records.check(parsed, data_cols + list(META_COLUMNS), name, "messages", config.get("on_bad_record") or "fail",
                                p._cache, line="offset")
    except SourceError:
        p.release()
        raise
    except Exception as exc:  # noqa: BLE001 - a task's failure: the brokers, the client's settings
        p.release()
        from runtime.sources.files import _first_line, _read_hint

        first = _first_line(exc)
        if "schema registry" in first:
            raise SourceError(f"source {name}: cannot read the messages: {first.removeprefix('pipe: ')}",
                              "check `schema_registry` (its url, and username and password when it asks for them) and that the "
                              "executors reach it; nothing of this source was written and its checkpoint did not move") from exc
        raise SourceError(f"source {name}: cannot read the messages from {_where(config)} ({first})",
                          _read_hint(exc, "check that the executors reach the brokers, and the source's `properties`; nothing of "
                                          "this source was written and its checkpoint did not move")) from exc
    p.rows = checked.rows
    p.bad_records, p.bad_samples = checked.bad, checked.samples
    if checked.rejected is not None:
        p.rejected = _dead_letters(checked.rejected, name)
    p.tombstones = len(checked.missing)
    return checked.df


def latest_messages(source: str, config: Mapping[str, Any], topic: str, per_partition: int = 20) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of the last `per_partition` messages of each partition of `topic`, newest
    first: what `pipe discover` reads to learn a topic's key and columns (a few messages on the
    driver, never a range)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    admin = _admin(source, config)
    parts = [(topic, p) for p in topics(source, {**config, "topic": topic, "topic_pattern": None}, admin)[topic]]
    bounds = _offsets(source, config, admin, parts)
    consumer = Consumer({**client_config(config), "logger": _LOG, "group.id": f"pipe-discover-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false", "enable.partition.eof": "true", "isolation.level": "read_committed",
                         "auto.offset.reset": "error"})
    found: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        for (t, p), (low, high) in sorted(bounds.items()):
            if high <= low:
                continue
            consumer.assign([TopicPartition(t, p, max(low, high - per_partition))])
            deadline = time.monotonic() + _timeout(config)
            done = False
            while not done and time.monotonic() < deadline:
                for m in consumer.consume(per_partition, 1.0):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            done = True
                            break
                        raise _kafka_error(source, config, f"read topic {t} partition {p}", m.error())
                    found.append((m.timestamp()[1], m.key(), m.value()))
                    done = m.offset() >= high - 1
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - KafkaException
        raise _kafka_error(source, config, f"read topic {topic}", exc) from exc
    finally:
        consumer.close()
    return [(k, v) for _, k, v in sorted(found, key=lambda f: f[0], reverse=True)]
