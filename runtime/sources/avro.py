"""Avro messages in Confluent's wire format, with their schemas from a schema registry:
`format: avro` (each message one row), and the Avro change events of `format: debezium`.

Confluent's wire format (https://docs.confluent.io/platform/current/schema-registry/fundamentals/
serdes-develop/index.html#wire-format): a zero byte, the writer schema's id (4 bytes,
big-endian), then the record in Avro's binary encoding. The executors fetch each schema id once
per Python worker from the registry's Confluent API (`GET <url>/schemas/ids/<id>`; Confluent's
Schema Registry, Apicurio's `/apis/ccompat/v7`, Karapace, Redpanda) and decode with fastavro.

A decoded record is then put in Kafka Connect's terms, the ones JsonConverter writes (a schema of
`{"type", "name", "parameters", "fields"}` and values in its encodings), so that a Debezium event
written with Avro is turned into a row by the same code as one written as JSON (debezium.py):
`connect.name` and `connect.parameters`, which Connect's Avro converters keep in the schema, name
Debezium's types (io.debezium.time.MicroTimestamp, ...); Avro's logical types map to Connect's
(decimal, date, timestamp-millis/-micros, time-millis/-micros)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import struct
import urllib.error
import urllib.request
import uuid
from typing import Any, Callable, Mapping

from runtime.sources.change_events import BadEvent

MAGIC = b"\x00"
_TIMEOUT_S = 30
_SCHEMAS: dict[tuple[str, int], tuple[Any, dict]] = {}  # (registry url, id) -> (fastavro's parsed schema, the schema as JSON); per Python worker


class RegistryError(RuntimeError):
    """The registry cannot be reached or refuses us: the run stops (no message is at fault)."""


def registry_settings(config: Mapping[str, Any]) -> dict[str, str] | None:
    """The source's `schema_registry` as plain strings (url, username, password), or None.
    Holds secrets: never logged or shown."""
    reg = config.get("schema_registry")
    if not reg:
        return None
    return {k: str(v) for k, v in reg.items() if v is not None and k in ("url", "username", "password")}


def fetch_schema(registry: Mapping[str, str], schema_id: int) -> tuple[Any, dict]:
    """(fastavro's parsed schema, the schema's JSON) of id `schema_id`, once per worker."""
    url = registry["url"].rstrip("/")
    key = (url, schema_id)
    if key in _SCHEMAS:
        return _SCHEMAS[key]
    import fastavro

    request = urllib.request.Request(f"{url}/schemas/ids/{schema_id}", headers={"Accept": "application/vnd.schemaregistry.v1+json"})
    if registry.get("username"):
        token = base64.b64encode(f"{registry['username']}:{registry.get('password', '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:  # noqa: S310 - the source's own registry URL
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise BadEvent(f"schema id {schema_id} is not in the schema registry") from None
        raise RegistryError(f"pipe: the schema registry at {url} answered HTTP {exc.code} for schema id {schema_id}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RegistryError(f"pipe: cannot fetch schema id {schema_id} from the schema registry at {url} ({exc})") from None
    if body.get("schemaType", "AVRO") != "AVRO":
        raise BadEvent(f"schema id {schema_id} is a {body['schemaType']} schema, not Avro")
    try:
        writer = json.loads(body["schema"])
        parsed = fastavro.parse_schema(writer)
    except (KeyError, ValueError, TypeError, fastavro.schema.SchemaParseException) as exc:
        raise BadEvent(f"schema id {schema_id} of the registry is not a valid Avro schema ({exc})") from None
    _SCHEMAS[key] = (parsed, writer)
    return parsed, writer


def read(value: bytes, registry: Mapping[str, str]) -> tuple[Any, dict]:
    """(the decoded record in Connect's encodings, its Connect schema) of one message."""
    import fastavro

    if len(value) < 5 or value[:1] != MAGIC:
        raise BadEvent("not in Confluent's Avro wire format (a zero byte and a schema id first)")
    (schema_id,) = struct.unpack(">I", value[1:5])
    parsed, writer = fetch_schema(registry, schema_id)
    try:
        record = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed)
    except Exception as exc:  # noqa: BLE001 - fastavro raises many kinds on bytes that do not fit the schema
        raise BadEvent(f"does not decode with its schema (id {schema_id}): {type(exc).__name__}: {exc}") from None
    schema = connect_schema(writer)
    return to_connect(record, schema), schema


def connect_schema(avro: Any, names: dict[str, Any] | None = None) -> dict:
    """Kafka Connect's schema (as JsonConverter writes it) of an Avro schema."""
    names = {} if names is None else names
    optional = False
    if isinstance(avro, list):  # a union: [null, T] is an optional T; others are read as JSON text
        branches = [b for b in avro if b != "null"]
        optional = len(branches) < len(avro)
        if len(branches) != 1:
            return {"type": "string", "optional": True, "name": "pipe.avro.Union"}
        avro = branches[0]
    if isinstance(avro, str):
        if avro in names:
            return {**names[avro], "optional": optional}
        avro = {"type": avro}
    kind, logical = avro.get("type"), avro.get("logicalType")
    if isinstance(kind, (dict, list)):
        return {**connect_schema(kind, names), "optional": optional}
    out: dict[str, Any] = {"optional": optional}
    if kind == "record":
        out.update(type="struct", name=avro.get("connect.name") or avro.get("name"))
        names[avro.get("name")] = out
        if avro.get("namespace"):
            names[f"{avro['namespace']}.{avro.get('name')}"] = out
        out["fields"] = [{**connect_schema(f["type"], names), "field": f["name"]} for f in avro.get("fields") or []]
        return out
    if kind == "array":
        return {**out, "type": "array", "items": connect_schema(avro.get("items"), names)}
    if kind == "map":
        return {**out, "type": "map", "keys": {"type": "string"}, "values": connect_schema(avro.get("values"), names)}
    if kind == "enum":
        out.update(type="string")
        names[avro.get("name")] = out
        return out
    if kind == "fixed":
        names[avro.get("name")] = out
    base = {"boolean": "boolean", "int": avro.get("connect.type") or "int32", "long": "int64", "float": "float32",
            "double": "float64", "bytes": "bytes", "fixed": "bytes", "string": "string"}.get(kind)
    if base is None:
        raise BadEvent(f"an Avro type {kind!r} that pipe cannot read")
    out["type"] = base
    name = avro.get("connect.name")
    params = dict(avro.get("connect.parameters") or {})
    if logical == "decimal":
        name = "org.apache.kafka.connect.data.Decimal"
        params.setdefault("scale", str(avro.get("scale", 0)))
        params.setdefault("connect.decimal.precision", str(avro.get("precision", 38)))
    elif not name and logical:
        name = {"date": "org.apache.kafka.connect.data.Date", "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
                "timestamp-micros": "io.debezium.time.MicroTimestamp", "local-timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
                "local-timestamp-micros": "io.debezium.time.MicroTimestamp", "time-millis": "org.apache.kafka.connect.data.Time",
                "time-micros": "io.debezium.time.MicroTime"}.get(logical)
    if name:
        out["name"] = name
    if params:
        out["parameters"] = params
    return out


def to_connect(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A value fastavro decoded, in the encoding JsonConverter gives it for `schema`."""
    if value is None or schema is None:
        return value
    kind, name = schema.get("type"), schema.get("name")
    if kind == "struct" and isinstance(value, dict):
        fields = {f["field"]: f for f in schema.get("fields") or []}
        return {k: to_connect(v, fields.get(k)) for k, v in value.items()}
    if kind == "array":
        return [to_connect(v, schema.get("items")) for v in value]
    if kind == "map":
        return {str(k): to_connect(v, schema.get("values")) for k, v in dict(value).items()}
    if name == "pipe.avro.Union":
        return json.dumps(value, default=str, ensure_ascii=False)
    if isinstance(value, decimal.Decimal):  # Connect's Decimal: the unscaled value's bytes, in base64
        scale = int((schema.get("parameters") or {}).get("scale", -value.as_tuple().exponent))
        unscaled = int(value.scaleb(scale, decimal.Context(prec=len(value.as_tuple().digits) + scale + 2)))
        return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()
    if isinstance(value, dt.datetime):
        at = value if value.tzinfo is None else value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        micros = (at - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
        return micros // 1000 if name == "org.apache.kafka.connect.data.Timestamp" else micros
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    if isinstance(value, dt.time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        return micros // 1000 if name == "org.apache.kafka.connect.data.Time" else micros
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def decoder(registry: Mapping[str, str]) -> Callable[[bytes, bytes | None], tuple[str, str | None]]:
    """`format: avro`: each message's record is a row, its columns from its writer schema."""
    from runtime.sources import debezium

    rows = debezium.RowSchemas()

    def decode(value: bytes, key: bytes | None) -> tuple[str, str | None]:
        record, schema = read(value, registry)
        if schema.get("type") != "struct" or not isinstance(record, dict):
            raise BadEvent("its Avro schema is not a record")
        return rows.row(record, schema)

    return decode
