"""`format: dms`: AWS Database Migration Service's change records, each turned into one row of
the changed table (runtime/sources/change_events.py says what every change format gives).

Two shapes are read:

- DMS's Kafka target (https://docs.aws.amazon.com/dms/latest/userguide/CHAP_Target.Kafka.html):
  `{"data": {row}, "metadata": {"timestamp", "record-type", "operation", "schema-name",
  "table-name", "transaction-id", ...}}`; `operation` is `load` (the full load), `insert`,
  `update` or `delete`; records of type `control` (table changes) hold no row and are skipped.
- A flat row with DMS's `Op` column (`I`, `U`, `D`), as DMS writes to S3 and as many teams
  forward it: the other fields are the row.

`_cdc_position` is DMS's change sequence `AR_H_CHANGE_SEQ` when the task adds it (a
transformation rule: it orders changes exactly), else the record's commit `timestamp` (ISO text
with microseconds, which sorts in time order; two changes of one key within a microsecond then
tie). DMS records carry no schema: the columns are declared in the source's `schema` or
inferred from the rows."""

from __future__ import annotations

import json
from typing import Any, Callable

from runtime.sources.change_events import IS_DELETED, OP, POSITION, TABLE, TS, BadEvent

_OPERATIONS = {"load": "r", "insert": "c", "update": "u", "delete": "d"}
_LETTERS = {"I": "c", "U": "u", "D": "d"}
SEQUENCE = "AR_H_CHANGE_SEQ"


def decoder() -> Callable[[bytes, bytes | None], tuple[str, None] | None]:
    def decode(value: bytes, key: bytes | None) -> tuple[str, None] | None:
        try:
            record = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadEvent(f"not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise BadEvent("not a DMS record (a JSON object with `data` and `metadata`, or a row with `Op`)")
        if isinstance(record.get("metadata"), dict):
            meta = record["metadata"]
            if meta.get("record-type") == "control":
                return None  # a table's definition changed: no row
            op = _OPERATIONS.get(str(meta.get("operation")).lower())
            row = record.get("data")
            if op is None or not isinstance(row, dict):
                raise BadEvent(f"a DMS record with operation {meta.get('operation')!r} and no row in `data`")
            when = meta.get("timestamp")
            table = ".".join(str(p) for p in (meta.get("schema-name"), meta.get("table-name")) if p)
        elif "Op" in record:
            op = _LETTERS.get(str(record["Op"]).upper())
            if op is None:
                raise BadEvent(f"Op {record['Op']!r} is none of I, U, D")
            row = {k: v for k, v in record.items() if k != "Op"}
            when = row.get("timestamp")
            table = ""
        else:
            raise BadEvent("not a DMS record (a JSON object with `data` and `metadata`, or a row with `Op`)")
        position = row.get(SEQUENCE) or when
        if position is None:
            raise BadEvent(f"no position to order it by: neither {SEQUENCE} nor a timestamp")
        out: dict[str, Any] = {k: v for k, v in row.items() if k != SEQUENCE}
        out.update({OP: op, POSITION: str(position), TS: when, TABLE: table or None, IS_DELETED: op == "d"})
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")), None

    return decode
