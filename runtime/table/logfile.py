"""Hudi log files (merge-on-read, table version 6): names, block framing, and the contents of
data, delete and command blocks (HUDI_FORMAT.md section 6).

A log file is a sequence of blocks, each framed (big-endian) as

    "#HUDI#" | int64 blockLength | int32 version=1 | int32 type | header | int64 contentLength
    | content | footer | int64 totalLength

where header and footer are `int32 n` then n x (int32 key, int32 length, UTF-8 bytes). pipe
writes every log file once, complete (never appended), so that it works on object stores."""

from __future__ import annotations

import datetime as dt
import io
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from runtime.table.avro import parsed_schema

MAGIC = b"#HUDI#"
COMMAND, DELETE, CORRUPT, AVRO_DATA, HFILE, PARQUET_DATA, CDC = 0, 1, 2, 3, 4, 5, 6
# header keys
INSTANT_TIME, TARGET_INSTANT_TIME, SCHEMA, COMMAND_BLOCK_TYPE = 0, 1, 2, 3
COMPACTED_BLOCK_TIMES = 4  # a log compaction's block: the instants of the blocks it rewrites
IS_PARTIAL = 7  # table versions 8+: "true" on a block of partial updates (only the columns it changes)
ROLLBACK = "0"  # COMMAND_BLOCK_TYPE of a rollback block

# .<fileId>_<baseInstant>.log.<version>_<writeToken>
_LOG_FILE = re.compile(r"^\.(?P<file_id>.+)_(?P<base_instant>\d{14,17}(?:00[1-6]|010)*)\.log\.(?P<version>\d+)_(?P<token>\d+-\d+-\d+)$")

# The delete block's record list: Java's wire schema (hudi-common HoodieDeleteRecordList.avsc of
# Hudi 0.14/0.15/1.0, as the classes of the hudi-spark3.5-bundle 0.15.0 print it; hudi-rs 0.5 uses
# the same). A delete block carries no schema: readers decode with their compiled one, so the
# orderingVal union's branch *index* says which wrapper record follows. Hudi 1.1+ appends
# ArrayWrapper (index 12, several ordering fields); pipe reads it and never writes it.
_NAMESPACE = "org.apache.hudi.avro.model"
# (kind, wrapper record, type of its `value`), in union order after "null"
_WRAPPERS = (
    ("boolean", "BooleanWrapper", "boolean"),
    ("int", "IntWrapper", "int"),
    ("long", "LongWrapper", "long"),
    ("float", "FloatWrapper", "float"),
    ("double", "DoubleWrapper", "double"),
    ("bytes", "BytesWrapper", "bytes"),
    ("string", "StringWrapper", "string"),
    ("date", "DateWrapper", "int"),  # epoch days (no logical type: Java encodes it by hand)
    ("decimal", "DecimalWrapper", {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 15}),
    ("time-micros", "TimeMicrosWrapper", {"type": "long", "logicalType": "time-micros"}),
    ("timestamp-micros", "TimestampMicrosWrapper", "long"),  # epoch micros, likewise by hand
)
_KIND_OF = {name: kind for kind, name, _ in _WRAPPERS} | {"ArrayWrapper": "array"}
_WRAPPER_OF = {kind: name for kind, name, _ in _WRAPPERS}
ORDERING_TYPES = tuple(kind for kind, _, _ in _WRAPPERS)


def _wrapper(name: str, value_type) -> dict:
    return {"type": "record", "name": name, "namespace": _NAMESPACE, "fields": [{"name": "value", "type": value_type}]}


def _delete_record_list(name: str, array_wrapper: bool) -> dict:
    union = ["null"] + [_wrapper(name_, t) for _, name_, t in _WRAPPERS]
    if array_wrapper:
        items = ["null"] + [f"{_NAMESPACE}.{name_}" for _, name_, _ in _WRAPPERS] + [_wrapper("LocalDateWrapper", "int")]
        union.append({"type": "record", "name": "ArrayWrapper", "namespace": _NAMESPACE, "fields": [
            {"name": "wrappedValues", "type": ["null", {"type": "array", "items": items}], "default": None}]})
    return {
        "type": "record", "name": name, "namespace": _NAMESPACE,
        "fields": [{"name": "deleteRecordList", "type": {"type": "array", "items": {
            "type": "record", "name": "HoodieDeleteRecord", "namespace": _NAMESPACE,
            "fields": [
                {"name": "recordKey", "type": ["null", "string"], "default": None},
                {"name": "partitionPath", "type": ["null", "string"], "default": None},
                {"name": "orderingVal", "type": union, "default": None},
            ]}}}],
    }


DELETE_RECORD_LIST = _delete_record_list("HoodieDeleteRecordList", array_wrapper=False)  # what pipe writes
# what pipe reads: the same branches, then 1.1's ArrayWrapper (parsed_schema caches by name)
_DELETE_RECORD_LIST_READ = _delete_record_list("HoodieDeleteRecordList", array_wrapper=True)
_DELETE_RECORD_LIST_READ["name"] = "HoodieDeleteRecordListWithArrayWrapper"


class LogFormatError(ValueError):
    """A log file that does not parse: the message names the file and the offset."""


@dataclass(frozen=True)
class LogFileName:
    file_id: str
    base_instant: str
    version: int
    token: str

    @property
    def name(self) -> str:
        return f".{self.file_id}_{self.base_instant}.log.{self.version}_{self.token}"


def parse_name(name: str) -> LogFileName | None:
    m = _LOG_FILE.match(name)
    if m is None:
        return None
    return LogFileName(m["file_id"], m["base_instant"], int(m["version"]), m["token"])


@dataclass
class Block:
    type: int
    header: dict[int, str]
    content: bytes
    footer: dict[int, str] = field(default_factory=dict)

    @property
    def instant(self) -> str:
        return self.header.get(INSTANT_TIME, "")

    @property
    def is_rollback(self) -> bool:
        return self.type == COMMAND and self.header.get(COMMAND_BLOCK_TYPE) == ROLLBACK


# --- framing ------------------------------------------------------------------------------------


def _map_bytes(entries: dict[int, str]) -> bytes:
    out = [struct.pack(">i", len(entries))]
    for key, value in entries.items():
        data = value.encode("utf-8")
        out.append(struct.pack(">ii", key, len(data)) + data)
    return b"".join(out)


def encode_block(block: Block) -> bytes:
    body = (struct.pack(">ii", 1, block.type) + _map_bytes(block.header) + struct.pack(">q", len(block.content))
            + block.content + _map_bytes(block.footer))
    block_length = len(body) + 8  # through the trailing int64
    return MAGIC + struct.pack(">q", block_length) + body + struct.pack(">q", block_length + len(MAGIC))


def read_blocks(data: bytes, where: str = "log file") -> list[Block]:
    """Every block of a log file in order; a torn or corrupt stretch is one CORRUPT block (no
    header, no content), which readers skip, as Java's reader does (block_spans)."""
    blocks = []
    for start, end, corrupt in block_spans(lambda a, b: data[a:b], len(data), where):
        blocks.append(Block(CORRUPT, {}, b"") if corrupt else _parse_block(data, start, end, where))
    return blocks


def block_spans(read_at, size: int, where: str = "log file"):
    """(start, end, corrupt) of each block of a log file of `size` bytes, `read_at(a, b)` giving
    bytes [a, b). Java's rule (HoodieLogFileReader.readBlock, isBlockCorrupted, 0.14 to 1.x):
    a block is sound when its int64 length is readable, the int64 at its end repeats it (plus
    the magic's 6 bytes), and the next 6 bytes are a magic or run past the end of the file.
    Otherwise everything from the block to the next "#HUDI#" (or the end) is one corrupt block:
    a torn append, or a sound block followed by stray bytes. Fewer than 6 bytes left end the
    file; a file that does not start with the magic is no log file (Java fails too)."""
    pos = 0
    while size - pos >= len(MAGIC):
        if read_at(pos, pos + len(MAGIC)) != MAGIC:
            raise LogFormatError(f"{where}: no block magic at byte {pos}")
        start = pos + len(MAGIC)
        end = _sound_block_end(read_at, size, start)
        if end is None:
            end = _next_magic(read_at, size, start)
            yield pos, end, True
        else:
            yield pos, end, False
        pos = end


def _sound_block_end(read_at, size: int, start: int) -> int | None:
    """The end of the block whose length field is at `start`, or None when Java deems it corrupt."""
    if size - start < 8:
        return None
    (length,) = struct.unpack(">q", read_at(start, start + 8))
    length = (length + 2**31) % 2**32 - 2**31  # Java reads it as (int) readLong()
    footer_at = start + length  # the trailing int64, 8 bytes before the block's end
    if length < 8 or footer_at + 8 > size:
        return None
    tail = read_at(footer_at, min(size, footer_at + 8 + len(MAGIC)))
    (total,) = struct.unpack_from(">q", tail, 0)
    if total - len(MAGIC) != length:
        return None
    if len(tail) == 8 + len(MAGIC) and tail[8:] != MAGIC:
        return None
    return footer_at + 8


def _next_magic(read_at, size: int, start: int, chunk: int = 1 << 20) -> int:
    """Where the next "#HUDI#" at or after `start` begins, or `size`."""
    pos = start
    while pos < size:
        piece = read_at(pos, min(size, pos + chunk))
        found = piece.find(MAGIC)
        if found >= 0:
            return pos + found
        if pos + len(piece) >= size:
            break
        pos += len(piece) - len(MAGIC) + 1
    return size


def _parse_block(data: bytes, pos: int, end: int, where: str) -> Block:
    """The sound block in data[pos:end] (its framing checked by block_spans)."""
    try:
        version, kind = struct.unpack_from(">ii", data, pos + 14)
        cur = pos + 22
        header, cur = _read_map(data, cur)
        (content_length,) = struct.unpack_from(">q", data, cur)
        cur += 8
        content = data[cur:cur + content_length]
        cur += content_length
        footer, cur = _read_map(data, cur)
    except (struct.error, UnicodeDecodeError) as exc:
        raise LogFormatError(f"{where}: block at byte {pos} is truncated") from exc
    if cur != end - 8:
        raise LogFormatError(f"{where}: block at byte {pos} is corrupt (its lengths disagree)")
    if version != 1:
        raise LogFormatError(f"{where}: block at byte {pos} has format version {version}; only 1 is known")
    return Block(kind, header, content, footer)


def _read_map(data: bytes, pos: int) -> tuple[dict[int, str], int]:
    (n,) = struct.unpack_from(">i", data, pos)
    pos += 4
    out = {}
    for _ in range(n):
        key, size = struct.unpack_from(">ii", data, pos)
        pos += 8
        out[key] = data[pos:pos + size].decode("utf-8")
        pos += size
    return out, pos


def block_headers(storage, rel_path: str, size: int) -> list[tuple[int, dict[int, str]]]:
    """(type, header) of every block of a log file, read without the blocks' contents: a few
    small ranged reads per block. A corrupt stretch is (CORRUPT, {})."""
    def read_at(a: int, b: int) -> bytes:
        return storage.read_range(rel_path, a, b)

    out = []
    for pos, end, corrupt in block_spans(read_at, size, rel_path):
        if corrupt:
            out.append((CORRUPT, {}))
            continue
        head = read_at(pos, min(end, pos + 4096))
        try:
            (kind,) = struct.unpack_from(">i", head, 18)
            try:
                header, stop = _read_map(head, 22)
            except (struct.error, UnicodeDecodeError):
                stop = len(head) + 1
            if stop > len(head):  # a header longer than the first read: read the whole block
                header, _ = _read_map(read_at(pos, end), 22)
        except (struct.error, UnicodeDecodeError) as exc:
            raise LogFormatError(f"{rel_path}: block at byte {pos} is truncated") from exc
        out.append((kind, header))
    return out


def written_by(storage, rel_path: str, size: int) -> str | None:
    """The one instant whose data or delete blocks fill the log file (every pipe log), or None
    when its blocks come from several instants or include a command block (Java appends to
    logs and writes rollback blocks): such a file is never deleted for one instant."""
    headers = block_headers(storage, rel_path, size)
    instants = {h.get(INSTANT_TIME) for _, h in headers}
    if len(instants) != 1 or any(kind == COMMAND for kind, _ in headers):
        return None
    return instants.pop()


# --- contents ---------------------------------------------------------------------------------


def parquet_block(instant: str, schema_json: str, table) -> Block:
    """A data block holding `table` (an Arrow table with the base file's exact schema: meta
    columns first) as one complete Parquet file."""
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return Block(PARQUET_DATA, {INSTANT_TIME: instant, SCHEMA: schema_json}, buf.getvalue())


def rollback_block(instant: str, target: str) -> Block:
    return Block(COMMAND, {INSTANT_TIME: instant, TARGET_INSTANT_TIME: target, COMMAND_BLOCK_TYPE: ROLLBACK}, b"")


def data_rows(block: Block):
    """The rows of a data block as an Arrow table (Parquet blocks), or as a list of dicts
    with the writer schema's JSON (Avro blocks)."""
    if block.type == PARQUET_DATA:
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.read_table(pa.BufferReader(block.content))
    if block.type == AVRO_DATA:
        import json

        import fastavro

        schema = fastavro.parse_schema(json.loads(block.header[SCHEMA]))
        version, count = struct.unpack_from(">ii", block.content, 0)
        if version != 3:
            raise LogFormatError(f"Avro data block of version {version}; only 3 is known")
        pos, rows = 8, []
        for _ in range(count):
            (size,) = struct.unpack_from(">i", block.content, pos)
            pos += 4
            rows.append(fastavro.schemaless_reader(io.BytesIO(block.content[pos:pos + size]), schema, None))
            pos += size
        return rows
    raise LogFormatError(f"block type {block.type} holds no rows")


# --- delete blocks ------------------------------------------------------------------------------
# Each delete names its key and an ordering value wrapped in one of Java's wrapper records, so
# readers know the Java class of the value (HoodieAvroUtils.wrapValueIntoAvro/unwrapAvroValueWrapper).


@dataclass(frozen=True)
class OrderingValue:
    """A delete's ordering value and its wrapper's kind (ORDERING_TYPES, or "array" from 1.1+):
    `IntWrapper(0)` is OrderingValue("int", 0)."""

    type: str
    value: Any


NATURAL_ORDER = OrderingValue("int", 0)  # Java's DeleteRecord.create(key): "delete whatever came before"


@dataclass(frozen=True)
class DeleteRecord:
    record_key: str | None
    partition_path: str | None
    ordering: OrderingValue | None  # None only in blocks of other writers (Java never writes null)


def ordering_kind(arrow_type) -> str | None:
    """The wrapper Java's Spark writer gives the precombine value of a column of this Arrow
    type (the class getNestedFieldVal returns with Hudi's default, non-"consistent" logical
    timestamps: a timestamp is its epoch micros as a Long), or None for types with no wrapper."""
    import pyarrow.types as t

    if t.is_int8(arrow_type) or t.is_int16(arrow_type) or t.is_int32(arrow_type) or t.is_time32(arrow_type):
        return "int"
    if t.is_int64(arrow_type) or t.is_timestamp(arrow_type) or t.is_time64(arrow_type):
        return "long"
    if t.is_float32(arrow_type):
        return "float"
    if t.is_float64(arrow_type):
        return "double"
    if t.is_boolean(arrow_type):
        return "boolean"
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        return "string"
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        return "bytes"
    if t.is_decimal(arrow_type):
        return "decimal"
    if t.is_date32(arrow_type):
        return "date"
    return None


def ordering_values(column) -> list[OrderingValue]:
    """The ordering value of each row of a precombine column (an Arrow array), as Java's writer
    wraps it; a null, a type with no wrapper, or a decimal Java could not encode at scale 15
    (it would fail the write) is NATURAL_ORDER."""
    import pyarrow as pa

    kind = ordering_kind(column.type)
    if kind is None:
        return [NATURAL_ORDER] * len(column)
    if kind == "long" and not pa.types.is_int64(column.type):
        column = column.cast(pa.int64())  # a timestamp's or time's count of its unit
    elif kind == "int" and not pa.types.is_int32(column.type):
        column = column.cast(pa.int32())
    out = []
    for v in column.to_pylist():
        if v is None:
            out.append(NATURAL_ORDER)
        elif kind == "decimal":
            out.append(NATURAL_ORDER if _decimal_bytes(v) is None else OrderingValue(kind, v))
        else:
            out.append(OrderingValue(kind, v))
    return out


def _decimal_bytes(value) -> bytes | None:
    """A decimal as DecimalWrapper's value: Avro's decimal(30, 15) bytes, the unscaled value's
    minimal big-endian two's complement (BigInteger.toByteArray); None where Java's
    tryUpcastDecimal throws (digits past the 15th decimal, or over 30 digits)."""
    import decimal

    unscaled = value.scaleb(15)
    if unscaled != unscaled.to_integral_value() or abs(unscaled) >= decimal.Decimal(10) ** 30:
        return None
    n = int(unscaled)
    length = (n if n >= 0 else ~n).bit_length() // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def delete_block(instant: str, deletes: list[tuple[str | None, str | None, OrderingValue | None]],
                 schema_json: str | None = None) -> Block:
    """A delete block of (record key, partition path, ordering value) in Java's wire format.
    A missing ordering value is written as NATURAL_ORDER, as Java's DeleteRecord.create(key)
    does: Java's readers call equals() on it, a null would stop them. `schema_json`, the
    write's schema, goes in the header as Java's append handle puts it on every block."""
    import fastavro

    records = []
    for key, partition, v in deletes:
        v = v or NATURAL_ORDER
        if v.type not in _WRAPPER_OF:
            raise ValueError(f"ordering value type {v.type} is not one of {', '.join(ORDERING_TYPES)}")
        records.append({"recordKey": key, "partitionPath": partition,
                        "orderingVal": (f"{_NAMESPACE}.{_WRAPPER_OF[v.type]}", {"value": _wrapped_value(v)})})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema(DELETE_RECORD_LIST), {"deleteRecordList": records})
    payload = out.getvalue()
    header = {INSTANT_TIME: instant, SCHEMA: schema_json} if schema_json else {INSTANT_TIME: instant}
    return Block(DELETE, header, struct.pack(">ii", 3, len(payload)) + payload)


def delete_blocks(instant: str, deletes: list[tuple[str | None, str | None, OrderingValue | None]],
                  schema_json: str | None = None) -> list[Block]:
    """The deletes as delete blocks, one per ordering-value type, in the order the types first
    come: a partition move's IntWrapper(0) and a bigint or timestamp column's LongWrapper
    values never share a block. Java reads either way; hudi-rs refuses a block whose ordering
    values have several wrapper types ("Delete block mixes ordering types")."""
    by_type: dict[str, list] = {}
    for key, partition, v in deletes:
        v = v or NATURAL_ORDER
        by_type.setdefault(v.type, []).append((key, partition, v))
    return [delete_block(instant, same, schema_json) for same in by_type.values()]


def _wrapped_value(v: OrderingValue):
    """The wrapper's `value` of an ordering value given as delete_records returns it."""
    import decimal

    if v.type == "date" and isinstance(v.value, dt.date):
        return (v.value - dt.date(1970, 1, 1)).days
    if v.type == "timestamp-micros" and isinstance(v.value, dt.datetime):
        return (v.value - _EPOCH) // dt.timedelta(microseconds=1)
    if v.type == "decimal" and isinstance(v.value, decimal.Decimal):
        encoded = _decimal_bytes(v.value)
        if encoded is None:
            raise ValueError(f"decimal ordering value {v.value} does not fit Hudi's decimal(30, 15)")
        return encoded
    return v.value


def delete_records(block: Block) -> list[DeleteRecord]:
    """The keys a delete block deletes, each with its ordering value unwrapped as Java does
    (a date as a date, a decimal as a Decimal, a timestamp-micros wrapper as a UTC datetime)."""
    import fastavro

    version, size = struct.unpack_from(">ii", block.content, 0)
    if version != 3:
        raise LogFormatError(f"delete block of version {version}; only 3 is known")
    schema = _read_schema()
    try:
        record = fastavro.schemaless_reader(io.BytesIO(block.content[8:8 + size]), schema, None, return_record_name=True)
    except (EOFError, IndexError, ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise LogFormatError(f"delete block of {block.instant} does not decode with Hudi's schema: {exc}") from exc
    return [DeleteRecord(r["recordKey"], r["partitionPath"], _unwrap(r["orderingVal"])) for r in record["deleteRecordList"]]


def deleted_keys(block: Block) -> list[tuple[str, str, Any]]:
    """(record key, partition path, unwrapped ordering value) of every delete."""
    return [(d.record_key, d.partition_path, d.ordering.value if d.ordering else None) for d in delete_records(block)]


_READ_SCHEMA: list = []


def _read_schema():
    import fastavro

    if not _READ_SCHEMA:
        _READ_SCHEMA.append(fastavro.parse_schema(_DELETE_RECORD_LIST_READ, named_schemas={}))
    return _READ_SCHEMA[0]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _unwrap(wrapped) -> OrderingValue | None:
    if wrapped is None:
        return None
    name, record = wrapped
    kind = _KIND_OF[name.rsplit(".", 1)[-1]]
    if kind == "array":
        return OrderingValue(kind, tuple(None if v is None else _unwrap(v).value for v in record["wrappedValues"] or ()))
    value = record["value"]
    if kind == "date" or name.endswith("LocalDateWrapper"):
        return OrderingValue("date", dt.date(1970, 1, 1) + dt.timedelta(days=value))
    if kind == "timestamp-micros":
        return OrderingValue(kind, _EPOCH + dt.timedelta(microseconds=value))
    return OrderingValue(kind, value)
