"""`format: debezium`: Debezium's change events, each turned into one row of the changed table.

A Debezium message's value is an envelope (https://debezium.io/documentation/reference/stable/
connectors/postgresql.html#postgresql-events): `op` (`c` insert, `u` update, `d` delete, `r` a
row read by the snapshot), the row `before` and `after` the change, and `source` (the connector,
the table, the position in the database's log, the commit time). With Kafka Connect's
JsonConverter and `schemas.enable=true` (its default) every message also carries the envelope's
schema: `{"schema": ..., "payload": ...}`, and the key holds the primary key the same way.

`decoder()` returns the function the executors apply to each message (kafka.fetch): it flattens
the envelope into one JSON record: the row (`after`; for a delete, `before` and the key's
fields), the values turned from Connect's encodings into what Spark's JSON reader takes (a
decimal's base64 bytes into its digits, epoch days and micros into ISO dates and timestamps),
plus

- `_cdc_op`: c, u, d or r;
- `_cdc_position`: the change's place in the database's log, as text that sorts in log order
  (Postgres: the LSN, then 0 for a snapshot read and 1 for a change; MySQL: binlog file,
  position and row; else the commit time in millis),
  the `precombine` of a table that applies the changes: the newest change of a key wins
  whatever order the messages arrive in;
- `_cdc_ts`: when the change was committed in the database (`source.ts_ms`);
- `_cdc_table`: the changed table, `schema.table` (`db.table` for MySQL);
- `_hoodie_is_deleted`: true for a delete: the write deletes the key (Hudi's own convention).

and the row's columns with their Spark types, from the message's schema (each distinct one once
per task): the driver unions them into the columns of the run (`union_ddl`), so a column added in
the database arrives as a new nullable column. A message that is not a Debezium event, or a
value that does not fit its own schema, gets a reason instead, which `records.check` reports
with topic, partition and offset (or drops, with `on_bad_record: drop`)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any, Callable, Iterable, Mapping

from runtime.sources import SourceError
from runtime.sources.change_events import IS_DELETED, OP, OPS, POSITION, TABLE, TS, BadEvent, iso_millis

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_PLAIN = {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT", "float64": "DOUBLE",
          "boolean": "BOOLEAN", "string": "STRING", "bytes": "BINARY"}
_TIMESTAMPS = {  # logical name: units per second of its number (None: an ISO string already)
    "io.debezium.time.Timestamp": 1_000, "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1_000_000, "io.debezium.time.NanoTimestamp": 1_000_000_000,
    "io.debezium.time.ZonedTimestamp": None,
}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_TIMES = {"io.debezium.time.Time": 1_000, "org.apache.kafka.connect.data.Time": 1_000, "io.debezium.time.MicroTime": 1_000_000,
          "io.debezium.time.NanoTime": 1_000_000_000, "io.debezium.time.ZonedTime": None}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


def spark_type(schema: Mapping[str, Any]) -> str:
    """The Spark type of a Connect field schema (JsonConverter's `{"type": ..., "name": ...}`)."""
    name, kind = schema.get("name"), schema.get("type")
    if name == _DECIMAL:
        params = schema.get("parameters") or {}
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", 38))
        return f"DECIMAL({precision},{scale})" if precision <= 38 and 0 <= scale <= precision else "STRING"
    if name == _VARIABLE_DECIMAL:
        return "STRING"  # a numeric without a declared scale: its digits, exactly
    if name in _TIMESTAMPS:
        return "TIMESTAMP"
    if name in _DATES:
        return "DATE"
    if name in _TIMES:
        return "STRING"  # Spark has no time of day: HH:MM:SS.ffffff
    if kind == "struct":
        return "STRUCT<" + ", ".join(f"`{f['field']}`: {spark_type(f)}" for f in schema.get("fields") or []) + ">"
    if kind == "array":
        return f"ARRAY<{spark_type(schema.get('items') or {'type': 'string'})}>"
    if kind == "map":
        return f"MAP<{spark_type(schema.get('keys') or {'type': 'string'})}, {spark_type(schema.get('values') or {'type': 'string'})}>"
    if kind in _PLAIN:
        return _PLAIN[kind]
    raise BadEvent(f"a field of Connect type {kind!r} that pipe cannot read")


def _value(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """One value from Connect's JSON encoding into one Spark's JSON reader takes for spark_type()."""
    if value is None or schema is None:
        return value
    name, kind = schema.get("name"), schema.get("type")
    if name == _DECIMAL:
        scale = int((schema.get("parameters") or {}).get("scale", 0))
        return _digits(value, scale)
    if name == _VARIABLE_DECIMAL:
        return _digits(value["value"], int(value["scale"]))
    if name in _TIMESTAMPS:
        per_second = _TIMESTAMPS[name]
        if per_second is None:
            return value
        micros = int(value) * 1_000_000 // per_second
        return (_EPOCH + dt.timedelta(microseconds=micros)).isoformat() + "Z"
    if name in _DATES:
        return (_EPOCH_DAY + dt.timedelta(days=int(value))).isoformat()
    if name in _TIMES:
        per_second = _TIMES[name]
        if per_second is None:
            return value
        micros = int(value) * 1_000_000 // per_second
        return (_EPOCH + dt.timedelta(microseconds=micros)).time().isoformat()
    if kind == "struct":
        fields = {f["field"]: f for f in schema.get("fields") or []}
        return {k: _value(v, fields.get(k)) for k, v in value.items()}
    if kind == "array":
        return [_value(v, schema.get("items")) for v in value]
    if kind == "map":
        return {k: _value(v, schema.get("values")) for k, v in value.items()}
    return value


def _digits(encoded: Any, scale: int) -> str:
    """A decimal's text from Connect's encoding: the unscaled value's two's-complement bytes,
    big-endian, in base64."""
    unscaled = int.from_bytes(base64.b64decode(encoded, validate=True), "big", signed=True)
    return format(decimal.Decimal(f"{unscaled}E{-scale}"), "f")  # exact: no context rounds a string's digits


def _split(obj: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """(payload, schema) of a JsonConverter message, with or without `schemas.enable`."""
    if isinstance(obj, dict) and set(obj) == {"schema", "payload"}:
        return obj["payload"], obj["schema"]
    return obj, None


def _field(schema: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    if schema is None:
        return None
    return next((f for f in schema.get("fields") or [] if f.get("field") == name), None)


def position(source: Mapping[str, Any], op: str = "c") -> str:
    """The change's place in the database's log, as text that sorts in log order. For Postgres
    every snapshot read (`op: r`) sorts before every streamed change: a snapshot's rows carry
    the LSN it was taken at, and a transaction that wrote before that LSN but committed after
    it is streamed with its (lower) change LSN, yet is newer than the snapshot's row."""
    connector = source.get("connector")
    if connector == "postgresql" and source.get("lsn") is not None:
        return f"{0 if op == 'r' else 1}:{int(source['lsn']):020d}"
    if connector == "mysql" and source.get("file"):
        seq = source["file"].rsplit(".", 1)[-1]
        return f"{int(seq) if seq.isdigit() else 0:010d}:{int(source.get('pos') or 0):020d}:{int(source.get('row') or 0):06d}"
    if connector == "sqlserver" and source.get("commit_lsn"):
        return f"{source['commit_lsn']}:{source.get('change_lsn') or ''}:{int(source.get('event_serial_no') or 0):06d}"
    if source.get("ts_ms") is not None:
        return f"{int(source['ts_ms']):020d}"
    raise BadEvent("its `source` block has no position (lsn, binlog file and pos) and no ts_ms")


def row_values(row: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A row's values from Connect's encodings (schema: the row's struct schema, or None)."""
    return _convert(row, _converters(schema))


def _converters(schema: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The fields of a row's struct schema whose values need converting (_value), by name."""
    fields = (schema or {}).get("fields") or []
    return {f["field"]: f for f in fields if f.get("name") is not None or f.get("type") in ("struct", "array", "map")}


def _convert(row: Mapping[str, Any], converters: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    try:
        return {k: (_value(v, converters[k]) if k in converters else v) for k, v in row.items()}
    except (KeyError, ValueError, TypeError, OverflowError, decimal.InvalidOperation) as exc:
        raise BadEvent(f"a value does not fit its schema ({type(exc).__name__}: {exc})") from None


def columns_of(schema: Mapping[str, Any] | None) -> str | None:
    """A row's columns as JSON `[[name, Spark type], ...]` from its struct schema (None: none)."""
    fields = (schema or {}).get("fields") or []
    return json.dumps([[f["field"], spark_type(f)] for f in fields], ensure_ascii=False) if fields else None


class RowSchemas:
    """What a task makes once per distinct row schema (each message carries its own copy): the
    fields to convert and the columns, the latter given with the first row of them only. A few
    recent schemas are kept; a message's is compared with them (a dict comparison, in C)."""

    def __init__(self, keep: int = 8):
        self._recent: list[tuple[Any, dict[str, Mapping[str, Any]], str | None]] = []  # (schema, converters, columns)
        self._keep = keep
        self._given: set[str] = set()

    def row(self, row: Mapping[str, Any], schema: Mapping[str, Any] | None) -> tuple[str, str | None]:
        """(the row as JSON text, its columns the first time this task sees them, else None)."""
        values, columns = self.convert(row, schema)
        return self.text(values), columns

    def convert(self, row: Mapping[str, Any], schema: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
        """(the row's values, its columns the first time this task sees them, else None)."""
        _, converters, columns = self._entry(schema)
        values = _convert(row, converters)
        if columns is None or columns in self._given:
            return values, None
        self._given.add(columns)
        return values, columns

    @staticmethod
    def text(values: Mapping[str, Any]) -> str:
        # ASCII (other characters as \\u escapes, which Spark's JSON reader reads back): Arrow
        # takes an ASCII str as it is, any other one only by encoding it, at ten times the cost
        return json.dumps(values, separators=(",", ":"))

    def _entry(self, schema: Mapping[str, Any] | None) -> tuple[Any, dict[str, Mapping[str, Any]], str | None]:
        for i, entry in enumerate(self._recent):
            if entry[0] is schema or entry[0] == schema:
                if i:
                    self._recent.insert(0, self._recent.pop(i))
                return entry
        entry = (schema, _converters(schema), columns_of(schema))
        self._recent.insert(0, entry)
        del self._recent[self._keep:]
        return entry


class Envelopes:
    """JsonConverter's messages with `schemas.enable` are `{"schema":S,"payload":P}`, and a
    topic's messages repeat the same schema text S, most of each message's bytes. A message that
    starts with the S of the one before (S once parsed whole, and seen to end where `,"payload":`
    begins) has only its payload parsed: JSON's grammar makes the result the same as parsing
    it whole. Anything else (another schema, another key order, spaces) is parsed whole."""

    _HEAD, _BETWEEN, _SPACE = '{"schema":', ',"payload":', " \t\n\r"

    def __init__(self):
        self._prefix: bytes | None = None  # '{"schema":' S ',"payload":', as the message's bytes
        self._schema: Any = None
        self._json = json.JSONDecoder()

    def parse(self, data: bytes) -> Any:
        """The message as json.loads gives it (ValueError, UnicodeDecodeError as json.loads)."""
        if self._prefix is not None and data.startswith(self._prefix):
            schema = self._schema
            try:  # only the payload is decoded: most of a message's bytes are its schema's
                text = data[len(self._prefix):].decode("utf-8")
            except UnicodeDecodeError:
                return json.loads(data)  # its error, as json.loads words it
            start = 0
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return json.loads(data)  # another encoding json.loads detects, or its error
            if not text.startswith(self._HEAD + "{"):
                return json.loads(data)  # as json.loads reads bytes: a BOM, another encoding
            try:  # a schema not seen before: parsed once, and kept
                schema, end = self._json.raw_decode(text, len(self._HEAD))
            except ValueError:
                return json.loads(data)
            if not text.startswith(self._BETWEEN, end):
                return json.loads(data)
            start = end + len(self._BETWEEN)
            self._prefix, self._schema = text[:start].encode("utf-8"), schema
        try:
            payload, end = self._json.raw_decode(text, start)
        except ValueError:
            return json.loads(data)  # its error, as json.loads words it
        if text[end:].strip(self._SPACE) == "}":
            return {"schema": schema, "payload": payload}
        return json.loads(data)


def _parse(data: bytes, registry: Mapping[str, str] | None, what: str,
           envelopes: Envelopes | None = None) -> tuple[Any, Mapping[str, Any] | None]:
    """(payload, Connect schema) of a message's value or key: Avro in Confluent's wire format
    when a registry is set and the bytes start with its zero byte, else JsonConverter's JSON
    (through `envelopes`, which skips parsing a schema seen before)."""
    if registry is not None and data[:1] == b"\x00":
        from runtime.sources import avro

        return avro.read(data, registry)
    try:
        return _split(envelopes.parse(data) if envelopes is not None else json.loads(data))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadEvent(f"its {what} is not JSON ({exc})" + ("; Avro needs the source's `schema_registry`" if data[:1] == b"\x00" else "")) from None


def decoder(registry: Mapping[str, str] | None = None) -> Callable[[bytes, bytes | None], tuple[str, str | None]]:
    """The function the executors call on each message with a value: (the flattened record as
    JSON text, its columns as JSON `[[name, Spark type], ...]`, or None when this task gave them
    already). Raises BadEvent with the reason for a message that is not a change event.
    `registry` (avro.registry_settings): events written with Avro are read too."""
    rows, envelopes = RowSchemas(), Envelopes()

    def decode(value: bytes, key: bytes | None) -> tuple[str, str | None]:
        envelope, schema = _parse(value, registry, "value", envelopes)
        if not isinstance(envelope, dict) or "op" not in envelope:
            raise BadEvent("not a Debezium change event (no `op`): is the topic a table's, and the connector's converter JSON or Avro?")
        op = envelope["op"]
        if op not in OPS:
            what = {"t": "a TRUNCATE", "m": "a logical decoding message"}.get(op, f"op {op!r}")
            raise BadEvent(f"{what}, which pipe does not apply (set the connector's skipped.operations to leave it out)")
        source = envelope.get("source") or {}
        side = "before" if op == "d" else "after"
        row, row_schema = envelope.get(side), _field(schema, side)
        if op == "d":
            key_obj, key_schema = _parse(key, registry, "key") if key else (None, None)
            if isinstance(key_obj, dict):  # the primary key, also when `before` is empty (REPLICA IDENTITY NOTHING)
                row = {**(row or {}), **{k: v for k, v in key_obj.items() if (row or {}).get(k) is None}}
                if row_schema is None and key_schema is not None:
                    row_schema = key_schema
        if not isinstance(row, dict):
            raise BadEvent(f"op {op!r} without `{side}`")
        out, columns = rows.convert(row, row_schema)
        out[OP] = op
        out[POSITION] = position(source, op)
        ts = source.get("ts_ms")
        out[TS] = None if ts is None else iso_millis(ts)
        out[TABLE] = ".".join(str(p) for p in (source.get("schema") or source.get("db"), source.get("table")) if p)
        out[IS_DELETED] = op == "d"
        return rows.text(out), columns

    return decode


def union_ddl(source: str, found: Iterable[tuple[str, str]]) -> str:
    """The Spark DDL of a run's columns from the distinct row schemas its messages carried
    (decoder()'s `[[name, type], ...]`), in the order given (by first place seen, `where`): the
    first schema's columns, then each column a later one adds. A column whose type changes is
    refused, naming where."""
    columns: dict[str, tuple[str, str, str]] = {}  # lower name -> (name, type, where first seen)
    for where, text in found:
        for name, typ in json.loads(text):
            known = columns.get(name.lower())
            if known is None:
                columns[name.lower()] = (name, typ, where)
            elif known[1] != typ:
                raise SourceError(f"source {source}: column {name} is {known[1]} in the events at {known[2]} and {typ} in those at {where}",
                                  "a column's type changed in the database: rebuild the table under a new name, or declare the "
                                  "source's `schema` with the type to read it as")
    return ", ".join("`" + name.replace("`", "``") + f"` {typ}" for name, typ, _ in columns.values())


def captured_table(messages: Iterable[tuple[bytes | None, bytes | None]],
                   registry: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]] | None:
    """(key columns, {column: Spark type}) of the table whose change events `messages` are
    (newest first): the key from the message key's fields (its Connect schema, or the fields of
    the key object), the columns from the newest event carrying a schema. None when no message
    is a change event with a key."""
    from runtime.sources.avro import RegistryError

    key: list[str] | None = None
    columns: dict[str, str] = {}
    for k, v in messages:
        if not k or not v:
            continue
        try:
            key_obj, key_schema = _parse(k, registry, "key")
            envelope, schema = _parse(v, registry, "value")
        except RegistryError:
            raise  # the registry cannot be asked: say so, rather than that no message is a change event
        except Exception:  # noqa: BLE001 - untrusted bytes: a message that is no change event is skipped
            continue
        if not isinstance(envelope, dict) or not isinstance(envelope.get("op"), str) or envelope["op"] not in OPS \
                or not isinstance(key_obj, dict):
            continue
        try:
            if key is None:
                key = [str(f["field"]) for f in key_schema.get("fields") or []] if isinstance(key_schema, dict) else [str(k) for k in key_obj]
            row_schema = _field(schema, "after") if isinstance(schema, dict) else None
            if row_schema and not columns:
                columns = {str(f["field"]): spark_type(f) for f in row_schema.get("fields") or []}
        except Exception:  # noqa: BLE001 - a schema of another shape: its columns stay unknown
            columns = {}
        if key is not None and (columns or schema is None):
            break
    return (key, columns) if key else None
