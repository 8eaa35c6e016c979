"""The `.cdc` log files of a CDC-enabled table (`hoodie.table.cdc.enabled=true`), as Hudi's
HoodieCDCLogger writes them beside a base file its merge handle rewrote (docs/hudi-cdc-format.md):

    <partition>/.<fileId>_<instant>.log.1_<writeToken>.cdc

a log file of CDC_DATA blocks (type 6), each encoded as an Avro data block (version 3: record
count, then each record's length and Avro binary), with the INSTANT_TIME and SCHEMA headers.
The record schema is the table's supplemental-logging mode's (HoodieCDCUtils):

- OP_KEY_ONLY: `Record{op, record_key}`: readers take both images from the base files;
- DATA_BEFORE: `CDC{op, record_key, before}`: the after-image from the new base file;
- DATA_BEFORE_AFTER (Hudi's default): `CDC{op, ts_ms, before, after}`, both images, which
  readers take as they are; `ts_ms` is the writing instant's time.

An image is the table's row without the `_hoodie_*` meta fields; `op` is `i`, `u` or `d`.
Java's CDC reader lists these files from the write stat's `cdcStats` only, and takes the changes
of a rewritten base file from them alone: a rewrite without one fails its query."""

from __future__ import annotations

import copy
import io
import json
import re
import struct
from typing import Any, Iterable, Mapping

from runtime.table.logfile import CDC, INSTANT_TIME, SCHEMA, Block, LogFormatError, encode_block, read_blocks

ENABLED = "hoodie.table.cdc.enabled"
MODE = "hoodie.table.cdc.supplemental.logging.mode"
OP_KEY_ONLY, DATA_BEFORE, DATA_BEFORE_AFTER = "OP_KEY_ONLY", "DATA_BEFORE", "DATA_BEFORE_AFTER"
INSERT, UPDATE, DELETE = "i", "u", "d"
SUFFIX = ".cdc"
# the spellings of Hudi 0.13 (`cdc_op_key`, ...), which 0.14+ still reads
_OLD_MODES = {"CDC_OP_KEY": OP_KEY_ONLY, "CDC_DATA_BEFORE": DATA_BEFORE, "CDC_DATA_BEFORE_AFTER": DATA_BEFORE_AFTER}
_NAME = re.compile(r"^\.(?P<file_id>[^_/]+)_(?P<instant>\d{14,17})\.log\.(?P<version>\d+)_(?P<token>\d+-\d+-\d+)\.cdc$")


def mode_of(props: Mapping[str, str]) -> str | None:
    """The table's supplemental-logging mode when it keeps CDC logs, else None; ValueError for
    a mode Hudi does not know."""
    if (props.get(ENABLED) or "false").strip().lower() != "true":
        return None
    mode = (props.get(MODE) or DATA_BEFORE_AFTER).strip().upper()
    mode = _OLD_MODES.get(mode, mode)
    if mode not in (OP_KEY_ONLY, DATA_BEFORE, DATA_BEFORE_AFTER):
        raise ValueError(f"{MODE}={props.get(MODE)} is not a mode Hudi knows (OP_KEY_ONLY, DATA_BEFORE, DATA_BEFORE_AFTER)")
    return mode


def file_name(file_id: str, instant: str, token: str) -> str:
    """The `.cdc` file of the base file `<file_id>_<token>_<instant>.parquet` (same token)."""
    return f".{file_id}_{instant}.log.1_{token}{SUFFIX}"


def parse_name(name: str) -> tuple[str, str] | None:
    """(file id, writing instant) of a `.cdc` file's name, or None."""
    m = _NAME.match(name)
    return (m["file_id"], m["instant"]) if m else None


def schema(mode: str, table_schema: dict) -> dict:
    """The record schema of `mode`'s CDC records for a table whose writer schema (an Avro record,
    meta fields left out) is `table_schema`, as HoodieCDCUtils.schemaBySupplementalLoggingMode
    builds it."""
    if mode == OP_KEY_ONLY:
        return {"type": "record", "name": "Record",
                "fields": [{"name": "op", "type": ["string", "null"]}, {"name": "record_key", "type": ["string", "null"]}]}
    image = copy.deepcopy(table_schema)
    image["fields"] = [f for f in image["fields"] if not f["name"].startswith("_hoodie_")]
    namespace = image.pop("namespace", None)  # the CDC record's, which the image inherits (as Java prints it)
    ref = image["name"]
    field = lambda name, t: {"name": name, "type": ["null", t], "doc": "", "default": None}  # noqa: E731
    if mode == DATA_BEFORE:
        fields = [field("op", "string"), field("record_key", "string"), field("before", image)]
    else:
        fields = [field("op", "string"), field("ts_ms", "string"), field("before", image), field("after", ref)]
    return {"type": "record", "name": "CDC", **({"namespace": namespace} if namespace else {}), "fields": fields}


def block(instant: str, record_schema: dict, records: Iterable[dict[str, Any]]) -> Block:
    """A CDC_DATA block of `records` (dicts of `record_schema`'s fields)."""
    import fastavro

    parsed = fastavro.parse_schema(copy.deepcopy(record_schema), named_schemas={})
    rows = list(records)
    out = [struct.pack(">ii", 3, len(rows))]
    for r in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        data = buf.getvalue()
        out.append(struct.pack(">i", len(data)) + data)
    return Block(CDC, {INSTANT_TIME: instant, SCHEMA: json.dumps(record_schema, separators=(",", ":"))}, b"".join(out))


def encode(instant: str, record_schema: dict, records: Iterable[dict[str, Any]]) -> bytes:
    """A whole `.cdc` file: one block."""
    return encode_block(block(instant, record_schema, records))


def records(data: bytes, where: str = ".cdc file") -> list[dict[str, Any]]:
    """The CDC records of a `.cdc` file's blocks, each decoded with its block's SCHEMA header."""
    import fastavro

    out: list[dict[str, Any]] = []
    for b in read_blocks(data, where):
        if b.type != CDC:
            raise LogFormatError(f"{where}: a block of type {b.type}, not a CDC data block (6)")
        parsed = fastavro.parse_schema(json.loads(b.header[SCHEMA]), named_schemas={})
        version, count = struct.unpack_from(">ii", b.content, 0)
        if version != 3:
            raise LogFormatError(f"{where}: a CDC data block of version {version}; only 3 is known")
        pos = 8
        for _ in range(count):
            (size,) = struct.unpack_from(">i", b.content, pos)
            out.append(fastavro.schemaless_reader(io.BytesIO(b.content[pos + 4:pos + 4 + size]), parsed, None))
            pos += 4 + size
    return out
