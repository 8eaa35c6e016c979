"""Avro change events through a real schema registry: Apicurio Registry (tests/registry/env.py,
fixture `schema_registry`) serving Confluent's API, and Debezium writing Avro keys and values in
Confluent's wire format through Apicurio's converter (`debezium.add_connector(...,
avro_registry=schema_registry.api_url)`, tests/kafka/connect.py).

Asserted from real messages, the way a Confluent consumer reads them: byte 0 is 0, bytes 1-4 the
schema's id (big-endian), GET <url>/schemas/ids/<id> is the writer's schema, and fastavro decodes
the rest with it into Debezium's envelope."""

from __future__ import annotations

import io
import json
import secrets
import time
from datetime import date
from decimal import Decimal

import pytest

pytestmark = pytest.mark.cdc


def read_raw(broker, topic: str, timeout_s: float = 30) -> list[tuple[bytes, bytes | None]]:
    """Every message of `topic` (one partition) from the earliest offset up to its end now, as
    (key, value) bytes, value None for a tombstone."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from tests.kafka.env import _QUIET

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"registry-env-{secrets.token_hex(4)}",
                         "enable.auto.commit": False, "logger": _QUIET})
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        messages = []
        deadline = time.monotonic() + timeout_s
        while len(messages) < end:
            assert time.monotonic() < deadline, f"{topic}: {len(messages)} of {end} messages read in {timeout_s} s"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            apicurio = [name for name, _ in msg.headers() or () if name.startswith("apicurio.")]
            assert not apicurio, f"the schema's id belongs in the bytes, not in headers: {msg.headers()}"
            messages.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return messages


def decode(registry, data: bytes) -> tuple[int, dict, dict]:
    """Confluent's wire format: (schema id, writer's schema from the registry, decoded record)."""
    import fastavro

    assert data[0] == 0, f"magic byte {data[0]}, not 0: {data[:16].hex()}"
    schema_id = int.from_bytes(data[1:5], "big")
    schema = registry.schema(schema_id)
    record = fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(schema))
    return schema_id, schema, record


def row_fields(envelope: dict) -> dict[str, object]:
    """The Avro types of a row's columns, by name: the record `Value` that the envelope's `before`
    defines (["null", {"type": "record", "name": "Value", ...}]) and `after` names (["null", "Value"])."""
    before, after = ([f["type"] for f in envelope["fields"] if f["name"] == name][0] for name in ("before", "after"))
    assert after == ["null", "Value"]
    row = before[1]
    assert before[0] == "null" and row["type"] == "record" and row["name"] == "Value"
    return {f["name"]: f["type"] for f in row["fields"]}


def test_registry_speaks_confluents_api(schema_registry):
    schema = {"type": "record", "name": "Probe", "namespace": "pipe.tests",
              "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]}
    subject = f"probe-{secrets.token_hex(4)}-value"
    schema_id = schema_registry.register(subject, schema)
    assert schema_registry.schema(schema_id) == schema
    assert schema_registry.register(subject, schema) == schema_id  # the same text: the same id
    latest = schema_registry.get(f"/subjects/{subject}/versions/latest")
    assert (latest["id"], latest["version"], json.loads(latest["schema"])) == (schema_id, 1, schema)
    assert subject in schema_registry.get("/subjects")


def test_debezium_avro_in_confluents_wire_format(postgres, debezium, kafka, schema_registry, pg_database):
    pg = lambda sql, params=None: postgres.execute(sql, params, database=pg_database)  # noqa: E731
    pg("""
        CREATE TABLE payments (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, paid_at timestamptz NOT NULL,
                               payer text NOT NULL, note text, due date);
        INSERT INTO payments VALUES (1, 1234.56, '2024-03-01 10:30:00.123456+00', 'Zoë Ångström-Müller', NULL, '2024-03-31');
    """)
    prefix = f"avro{secrets.token_hex(3)}"
    config = debezium.add_connector(f"{pg_database}-avro", pg_database, prefix, avro_registry=schema_registry.api_url)
    assert config["value.converter"] == "io.apicurio.registry.utils.converter.AvroConverter"
    pg("INSERT INTO payments VALUES (2, -0.05, '2024-12-31 23:59:59+02', 'Ça va? «ok» 日本', 'café', NULL)")
    pg("UPDATE payments SET note = 'naïve', amount = 99999999.99 WHERE id = 1")
    pg("DELETE FROM payments WHERE id = 2")
    debezium.wait_caught_up()

    topic = f"{prefix}.public.payments"
    messages = read_raw(kafka, topic)
    assert len(messages) == 5, messages  # r 1, c 2, u 1, d 2, tombstone 2
    keys = [decode(schema_registry, key) for key, _ in messages]
    values = [decode(schema_registry, value) if value is not None else None for _, value in messages]

    # the key: a record of the primary key, under subject <topic>-key
    assert [record for _, _, record in keys] == [{"id": 1}, {"id": 2}, {"id": 1}, {"id": 2}, {"id": 2}]
    key_id, key_schema, _ = keys[0]
    assert {i for i, _, _ in keys} == {key_id}
    assert key_schema == {"type": "record", "name": "Key", "namespace": topic, "fields": [{"name": "id", "type": "long"}],
                          "connect.name": f"{topic}.Key"}
    latest = schema_registry.get(f"/subjects/{topic}-key/versions/latest")
    assert latest["id"] == key_id and json.loads(latest["schema"]) == key_schema

    # the value: Debezium's envelope, one schema for every change of the table, under <topic>-value
    assert values[4] is None
    value_id, value_schema, _ = values[0]
    assert {i for i, _, _ in values[:4]} == {value_id}
    latest = schema_registry.get(f"/subjects/{topic}-value/versions/latest")
    assert latest["id"] == value_id and json.loads(latest["schema"]) == value_schema
    assert value_schema["name"] == "Envelope" and value_schema["namespace"] == topic
    assert [f["name"] for f in value_schema["fields"]][:4] == ["before", "after", "source", "transaction"]
    records = [record for _, _, record in values[:4]]
    assert [r["op"] for r in records] == ["r", "c", "u", "d"]
    for record in records:
        assert set(record) >= {"before", "after", "source", "op", "ts_ms"}
        assert record["source"]["connector"] == "postgresql" and record["source"]["table"] == "payments"
        assert record["source"]["db"] == pg_database

    # the columns' Avro types: numeric(12,2) Avro's decimal (bytes), timestamptz a string
    # (io.debezium.time.ZonedTimestamp), date an int of days (io.debezium.time.Date), text a string
    columns = row_fields(value_schema)
    assert columns["id"] == "long"
    assert columns["amount"] == {"type": "bytes", "scale": 2, "precision": 12, "connect.version": 1,
                                 "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
                                 "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}
    assert columns["paid_at"] == {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}
    assert columns["payer"] == "string"
    assert columns["note"] == ["null", "string"]
    assert columns["due"] == ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}]

    snapshot, insert, update, delete = records
    assert snapshot["before"] is None
    assert snapshot["after"] == {"id": 1, "amount": Decimal("1234.56"), "paid_at": "2024-03-01T10:30:00.123456Z",
                                 "payer": "Zoë Ångström-Müller", "note": None, "due": (date(2024, 3, 31) - date(1970, 1, 1)).days}
    assert insert["after"] == {"id": 2, "amount": Decimal("-0.05"), "paid_at": "2024-12-31T21:59:59.000000Z",
                               "payer": "Ça va? «ok» 日本", "note": "café", "due": None}
    assert update["after"]["amount"] == Decimal("99999999.99") and update["after"]["note"] == "naïve"
    assert update["before"] is None  # REPLICA IDENTITY DEFAULT
    # REPLICA IDENTITY DEFAULT: the key, and the zero value of each other NOT NULL column
    assert delete["after"] is None
    assert delete["before"] == {"id": 2, "amount": Decimal("0.00"), "paid_at": "1970-01-01T00:00:00Z", "payer": "",
                                "note": None, "due": None}
    assert snapshot["source"]["snapshot"] == "last"  # the snapshot's one row is its last
    assert [r["source"]["snapshot"] for r in (insert, update, delete)] == ["false"] * 3
    assert insert["source"]["lsn"] < update["source"]["lsn"] < delete["source"]["lsn"]
