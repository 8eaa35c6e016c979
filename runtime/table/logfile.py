"""Hudi log files (merge-on-read, table version 6): names, block framing, and the contents of
data, delete and command blocks (HUDI_FORMAT.md section 6).

A log file is a sequence of blocks, each framed (big-endian) as

    "#HUDI#" | int64 blockLength | int32 version=1 | int32 type | header | int64 contentLength
    | content | footer | int64 totalLength

where header and footer are `int32 n` then n x (int32 key, int32 length, UTF-8 bytes). pipe
writes every log file once, complete (never appended), so that it works on object stores."""

from __future__ import annotations

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
ROLLBACK = "0"  # COMMAND_BLOCK_TYPE of a rollback block

# .<fileId>_<baseInstant>.log.<version>_<writeToken>
_LOG_FILE = re.compile(r"^\.(?P<file_id>.+)_(?P<base_instant>\d{14,17})\.log\.(?P<version>\d+)_(?P<token>\d+-\d+-\d+)$")

# The delete block's record list, as table version 6 writers and readers know it (log block
# version 3): a union with several types of the same Avro kind, decoded by position.
DELETE_RECORD_LIST = {
    "type": "record", "name": "HoodieDeleteRecordList", "namespace": "org.apache.hudi.avro.model",
    "fields": [{"name": "deleteRecordList", "type": {"type": "array", "items": {
        "type": "record", "name": "HoodieDeleteRecord",
        "fields": [
            {"name": "recordKey", "type": ["null", "string"], "default": None},
            {"name": "partitionPath", "type": ["null", "string"], "default": None},
            {"name": "orderingVal", "type": [
                "null", "int", "long", "float", "double", "bytes", "string",
                {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 15},
                {"type": "int", "logicalType": "date"},
                {"type": "int", "logicalType": "time-millis"},
                {"type": "long", "logicalType": "time-micros"},
                {"type": "long", "logicalType": "timestamp-millis"},
                {"type": "long", "logicalType": "timestamp-micros"},
            ], "default": None},
        ]}}}],
}


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
    blocks, pos = [], 0
    while pos < len(data):
        if data[pos:pos + 6] != MAGIC:
            raise LogFormatError(f"{where}: no block magic at byte {pos}")
        try:
            (length,) = struct.unpack_from(">q", data, pos + 6)
            start = pos + 14
            end = start + length
            if end > len(data):
                raise LogFormatError(f"{where}: block at byte {pos} runs past the end of the file")
            version, kind = struct.unpack_from(">ii", data, start)
            cur = start + 8
            header, cur = _read_map(data, cur)
            (content_length,) = struct.unpack_from(">q", data, cur)
            cur += 8
            content = data[cur:cur + content_length]
            cur += content_length
            footer, cur = _read_map(data, cur)
            (total,) = struct.unpack_from(">q", data, end - 8)
        except struct.error as exc:
            raise LogFormatError(f"{where}: block at byte {pos} is truncated") from exc
        if total != length + len(MAGIC) or cur != end - 8:
            raise LogFormatError(f"{where}: block at byte {pos} is corrupt (its lengths disagree)")
        if version != 1:
            raise LogFormatError(f"{where}: block at byte {pos} has format version {version}; only 1 is known")
        blocks.append(Block(kind, header, content, footer))
        pos = end
    return blocks


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
    """(type, header) of every block of a log file, read without the blocks' contents: two
    small ranged reads per block."""
    out, pos = [], 0
    while pos < size:
        head = storage.read_range(rel_path, pos, min(size, pos + 4096))
        if head[:6] != MAGIC:
            raise LogFormatError(f"{rel_path}: no block magic at byte {pos}")
        try:
            (length,) = struct.unpack_from(">q", head, 6)
            (kind,) = struct.unpack_from(">i", head, 18)
            try:
                header, end = _read_map(head, 22)
            except (struct.error, UnicodeDecodeError):
                end = len(head) + 1
            if end > len(head):  # a header longer than the first read: read the whole block
                header, _ = _read_map(storage.read_range(rel_path, pos, min(size, pos + 14 + length)), 22)
        except (struct.error, UnicodeDecodeError) as exc:
            raise LogFormatError(f"{rel_path}: block at byte {pos} is truncated") from exc
        out.append((kind, header))
        pos += 14 + length
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


def delete_block(instant: str, deletes: list[tuple[str, str, Any]]) -> Block:
    """(record key, partition path, ordering value or None) of every deleted key."""
    import fastavro

    records = [{"recordKey": k, "partitionPath": p, "orderingVal": v} for k, p, v in deletes]
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema(DELETE_RECORD_LIST), {"deleteRecordList": records})
    payload = out.getvalue()
    return Block(DELETE, {INSTANT_TIME: instant}, struct.pack(">ii", 3, len(payload)) + payload)


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


def deleted_keys(block: Block) -> list[tuple[str, str, Any]]:
    import fastavro

    version, size = struct.unpack_from(">ii", block.content, 0)
    if version != 3:
        raise LogFormatError(f"delete block of version {version}; only 3 is known")
    record = fastavro.schemaless_reader(io.BytesIO(block.content[8:8 + size]), parsed_schema(DELETE_RECORD_LIST), None)
    return [(r["recordKey"], r["partitionPath"], r["orderingVal"]) for r in record["deleteRecordList"]]


# --- typed ordering values of deletes -------------------------------------------------------
# Under event-time ordering a delete's orderingVal counts only when it has the ordering field's
# exact Avro type (HUDI_FORMAT 6.5), so readers need the union branch, not just the value.
# Each branch wrapped in a one-field record encodes to the same bytes, and fastavro names the
# record it decoded.

ORDERING_TYPES = ("int", "long", "float", "double", "bytes", "string", "decimal", "date", "time-millis",
                  "time-micros", "timestamp-millis", "timestamp-micros")
_BRANCH_PREFIX = "ordering_"


@dataclass(frozen=True)
class OrderingValue:
    """A delete's ordering value with its Avro type, one of ORDERING_TYPES."""

    type: str
    value: Any


@dataclass(frozen=True)
class DeleteRecord:
    record_key: str | None
    partition_path: str | None
    ordering: OrderingValue | None  # None: no ordering value (delete by commit time)


def _typed_delete_schema() -> dict:
    import copy

    schema = copy.deepcopy(DELETE_RECORD_LIST)
    schema["name"] = "HoodieDeleteRecordListByBranch"  # parsed_schema caches by name; the bytes are the same
    field_ = schema["fields"][0]["type"]["items"]["fields"][2]
    branches = field_["type"][1:]
    field_["type"] = ["null"] + [
        {"type": "record", "name": _BRANCH_PREFIX + name.replace("-", "_"), "fields": [{"name": "v", "type": t}]}
        for name, t in zip(ORDERING_TYPES, branches)
    ]
    return schema


def delete_records(block: Block) -> list[DeleteRecord]:
    """The keys a delete block deletes, each with its ordering value and that value's type."""
    import fastavro

    version, size = struct.unpack_from(">ii", block.content, 0)
    if version != 3:
        raise LogFormatError(f"delete block of version {version}; only 3 is known")
    schema = parsed_schema(_typed_delete_schema())
    record = fastavro.schemaless_reader(io.BytesIO(block.content[8:8 + size]), schema, None, return_record_name=True)
    out = []
    for r in record["deleteRecordList"]:
        ordering = None
        if r["orderingVal"] is not None:
            name, wrapped = r["orderingVal"]
            kind = name.rsplit(".", 1)[-1][len(_BRANCH_PREFIX):].replace("_", "-")
            ordering = OrderingValue(kind, wrapped["v"])
        out.append(DeleteRecord(r["recordKey"], r["partitionPath"], ordering))
    return out


def typed_delete_block(instant: str, deletes: list[tuple[str, str, OrderingValue | None]]) -> Block:
    """A delete block whose ordering values have the Avro type given (e.g. a `long` 0, which
    `delete_block` would write as an `int`)."""
    import fastavro

    def branch(v: OrderingValue | None):
        if v is None:
            return None
        if v.type not in ORDERING_TYPES:
            raise ValueError(f"ordering value type {v.type} is not one of {', '.join(ORDERING_TYPES)}")
        return (f"{DELETE_RECORD_LIST['namespace']}.{_BRANCH_PREFIX}{v.type.replace('-', '_')}", {"v": v.value})

    records = [{"recordKey": k, "partitionPath": p, "orderingVal": branch(v)} for k, p, v in deletes]
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed_schema(_typed_delete_schema()), {"deleteRecordList": records})
    payload = out.getvalue()
    return Block(DELETE, {INSTANT_TIME: instant}, struct.pack(">ii", 3, len(payload)) + payload)
