"""Avro in Confluent's wire format (runtime/sources/avro.py): Avro schemas in Kafka Connect's
terms and fastavro's values in Connect's encodings, so that Avro rows and Debezium-Avro events
become the same rows as their JSON twins. The registry itself is exercised against a real one
in tests/test_registry*.py."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import pytest

from runtime.sources import debezium
from runtime.sources.avro import connect_schema, to_connect
from runtime.sources.change_events import BadEvent

# a Debezium 3.x value schema as Connect's Avro converters write it (connect.name, connect.parameters)
VALUE = {"type": "record", "name": "Value", "namespace": "shop.public.orders", "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": {"type": "int", "connect.type": "int16"}},
    {"name": "amount", "type": {"type": "bytes", "scale": 2, "precision": 12, "connect.version": 1,
                                "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                                "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}},
    {"name": "placed_at", "type": ["null", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}],
     "default": None},
    {"name": "seen_at", "type": ["null", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}],
     "default": None},
    {"name": "day", "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}], "default": None},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.orders", "fields": [
    {"name": "before", "type": ["null", VALUE], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "connector", "type": "string"}, {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
        {"name": "ts_ms", "type": "long"}, {"name": "lsn", "type": ["null", "long"], "default": None}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
]}


def roundtrip(schema: dict, record: dict):
    """The record as fastavro reads it back from Avro's binary encoding."""
    parsed = fastavro.parse_schema(json.loads(json.dumps(schema)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, parsed)


def test_a_debezium_avro_event_becomes_the_same_row_as_its_json_twin():
    row = {"id": 9007199254740993, "qty": 3, "amount": Decimal("-1234.56"), "placed_at": "2024-02-29T23:59:59.123456Z",
           "seen_at": 1_709_251_199_123_456, "day": 19782, "note": "Zoë \"O'Brien\""}
    event = roundtrip(ENVELOPE, {"before": None, "after": row, "op": "c", "ts_ms": 1,
                                 "source": {"connector": "postgresql", "schema": "public", "table": "orders", "ts_ms": 1_700_000_000_123,
                                            "lsn": 26_000_000_123}})
    schema = connect_schema(json.loads(json.dumps(ENVELOPE)))
    payload = to_connect(event, schema)
    after = next(f for f in schema["fields"] if f["field"] == "after")
    values = debezium.row_values(payload["after"], after)
    assert values == {"id": 9007199254740993, "qty": 3, "amount": "-1234.56", "placed_at": "2024-02-29T23:59:59.123456Z",
                      "seen_at": "2024-02-29T23:59:59.123456Z", "day": "2024-02-29", "note": "Zoë \"O'Brien\""}
    assert json.loads(debezium.columns_of(after)) == [["id", "BIGINT"], ["qty", "SMALLINT"], ["amount", "DECIMAL(12,2)"],
                                                     ["placed_at", "TIMESTAMP"], ["seen_at", "TIMESTAMP"], ["day", "DATE"],
                                                     ["note", "STRING"]]
    assert debezium.position(payload["source"], payload["op"]) == "1:00000000026000000123"


def test_avro_logical_types_become_spark_types_and_values():
    schema = {"type": "record", "name": "Click", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 10, "scale": 3}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "raw", "type": "bytes"},
        {"name": "either", "type": ["null", "long", "string"], "default": None},
    ]}
    record = roundtrip(schema, {"at": dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc),
                                "at_us": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc), "day": dt.date(1900, 3, 1),
                                "price": Decimal("-0.005"), "id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "kind": "BUY",
                                "tags": ["a", "é"], "raw": b"\x00\xff", "either": 5})
    c = connect_schema(schema)
    text, columns = debezium.RowSchemas().row(to_connect(record, c), c)
    assert json.loads(text) == {"at": "1969-12-31T23:59:59.999000Z", "at_us": "2024-01-02T03:04:05.000006Z", "day": "1900-03-01",
                                "price": "-0.005", "id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "kind": "BUY", "tags": ["a", "é"],
                                "raw": "AP8=", "either": "5"}
    assert json.loads(columns) == [["at", "TIMESTAMP"], ["at_us", "TIMESTAMP"], ["day", "DATE"], ["price", "DECIMAL(10,3)"],
                                   ["id", "STRING"], ["kind", "STRING"], ["tags", "ARRAY<STRING>"], ["raw", "BINARY"],
                                   ["either", "STRING"]]


def test_the_wire_format_is_checked_before_any_registry_call():
    from runtime.sources.avro import read

    with pytest.raises(BadEvent, match="not in Confluent's Avro wire format"):
        read(b'{"id": 1}', {"url": "http://127.0.0.1:9"})
    with pytest.raises(BadEvent, match="its value is not JSON.*needs the source's `schema_registry`"):
        debezium.decoder()(b"\x00\x00\x00\x00\x01\x02", None)


@pytest.mark.parametrize("extra, message", [
    ({}, "format: avro of source 'k' needs `schema_registry`"),
    ({"schema_registry": {"url": "http://r:8081", "username": "u", "password": "hunter2"}},
     "the schema registry password of source 'k' is written in the project"),
])
def test_compile_refuses_an_avro_source_that_cannot_work(tmp_path, extra, message):
    import yaml

    from tests.conftest import compile_errors, write_project

    src = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "clicks", "format": "avro", **extra}
    root = write_project(tmp_path / "p", {"sources/k.yml": yaml.safe_dump({"sources": {"k": src}}),
                                          "tables/t.sql": "select * from {{ source('k') }}"})
    assert any(message in d.message for d in compile_errors(root))
