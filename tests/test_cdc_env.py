"""The CDC test environment is real: PostgreSQL's logical decoding read by Debezium's Postgres
connector in a Kafka Connect worker, writing JSON change events (schema + payload) into the tests'
Kafka broker (fixtures `postgres`, `debezium`, `kafka`; tests/postgres/env.py, tests/kafka/connect.py).

What the messages look like is asserted here, so that the tests of pipe's CDC sources can rely on
it: snapshot rows (op r), then c/u/d with before/after, a tombstone after each delete, keys holding
the primary key, increasing source.lsn, columns added and tables created while the connector runs."""

from __future__ import annotations

import base64
import json
import secrets
import time
from decimal import Decimal

import pytest

pytestmark = pytest.mark.cdc


def read_topic(broker, topic: str, timeout_s: float = 30) -> list[tuple[dict, dict | None]]:
    """Every message of `topic` from the earliest offset up to its end now: (key, value) parsed
    from JSON, value None for a tombstone."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from tests.kafka.env import _QUIET

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"cdc-env-{secrets.token_hex(4)}",
                         "enable.auto.commit": False, "logger": _QUIET})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        assert partitions, f"no topic {topic}"
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        left = {p for p, end in ends.items() if end > 0}
        messages = []
        deadline = time.monotonic() + timeout_s
        while left:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(left)} not read to {ends} in {timeout_s} s"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            messages.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
    finally:
        consumer.close()
    messages.sort()
    return [(json.loads(key), json.loads(value) if value is not None else None) for _, _, key, value in messages]


def decimal(value: str, field_schema: dict) -> Decimal:
    """A Connect Decimal (decimal.handling.mode=precise): base64 of the unscaled big-endian two's
    complement integer, the scale in the field's schema parameters."""
    unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
    return Decimal(unscaled).scaleb(-int(field_schema["parameters"]["scale"]))


def fields(message: dict, part: str = "after") -> dict[str, dict]:
    """The schemas of the row's fields in a value message, by name."""
    row = next(f for f in message["schema"]["fields"] if f["field"] == part)
    return {f["field"]: f for f in row["fields"]}


@pytest.fixture
def database(pg_database, debezium):
    return pg_database


def test_change_events(postgres, debezium, kafka, database):
    pg = lambda sql, params=None: postgres.execute(sql, params, database=database)  # noqa: E731
    pg("""
        CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text);
        CREATE TABLE order_lines (
            order_id bigint, line_no int, amount numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL,
            note text, discount numeric(12,2), PRIMARY KEY (order_id, line_no));
        ALTER TABLE order_lines REPLICA IDENTITY FULL;  -- every column in before (customers keeps DEFAULT)
        INSERT INTO customers VALUES (1, 'Zoë "the" O''Brien', NULL);
        INSERT INTO order_lines VALUES (10, 1, 12345.67, '2024-03-01 12:30:00.123456+02', 'crème brûlée, l''été "x"', NULL);
    """)
    prefix = f"env{secrets.token_hex(3)}"
    started = time.monotonic()
    config = debezium.add_connector(f"env-{database}", database, prefix)
    added = time.monotonic() - started
    debezium.wait_caught_up()
    snapshot_s = time.monotonic() - started
    assert config["plugin.name"] == "pgoutput" and config["publication.autocreate.mode"] == "all_tables"

    # one transaction of several tables and operations, then transactions of one statement each
    pg("""BEGIN;
        INSERT INTO customers VALUES (2, 'Åsa', 'asa@example.com');
        INSERT INTO order_lines VALUES (10, 2, -0.05, '2024-12-31 23:59:59+00', NULL, 1.50);
        UPDATE order_lines SET amount = 9999999999.99, note = 'a\\b' WHERE order_id = 10 AND line_no = 1;
        DELETE FROM customers WHERE id = 1;
        COMMIT""")
    pg("UPDATE customers SET email = NULL WHERE id = 2")
    pg("DELETE FROM order_lines WHERE order_id = 10 AND line_no = 2")
    pg("ALTER TABLE customers ADD COLUMN vip boolean")
    pg("INSERT INTO customers VALUES (3, 'Ng', NULL, true)")
    pg("CREATE TABLE late (id int PRIMARY KEY, v text); INSERT INTO late VALUES (1, 'after the start')")
    started = time.monotonic()
    debezium.wait_caught_up()
    caught_up_s = time.monotonic() - started
    print(f"add_connector {added:.2f} s, snapshot in Kafka {snapshot_s:.2f} s, wait_caught_up {caught_up_s:.2f} s")

    customers = read_topic(kafka, f"{prefix}.public.customers")
    lines = read_topic(kafka, f"{prefix}.public.order_lines")
    late = read_topic(kafka, f"{prefix}.public.late")

    # --- customers: REPLICA IDENTITY DEFAULT -------------------------------------------------------
    ops = [(v["payload"]["op"] if v else None, k["payload"]["id"]) for k, v in customers]
    assert ops == [("r", 1), ("c", 2), ("d", 1), (None, 1), ("u", 2), ("c", 3)]
    key, value = customers[0]
    assert key["schema"]["fields"] == [{"type": "int64", "optional": False, "field": "id"}]
    assert value["payload"]["before"] is None
    assert value["payload"]["after"] == {"id": 1, "name": 'Zoë "the" O\'Brien', "email": None}
    assert value["payload"]["source"]["snapshot"] in ("true", "first", "last", "first_in_data_collection", "last_in_data_collection")
    assert value["payload"]["source"]["db"] == database and value["payload"]["source"]["table"] == "customers"
    deleted = customers[2][1]["payload"]
    assert deleted["after"] is None
    # only the key is known: the other columns are null, or a NOT NULL column's zero value
    assert deleted["before"] == {"id": 1, "name": "", "email": None}
    updated = customers[4][1]["payload"]
    assert updated["before"] is None  # DEFAULT identity: no old row for an update of a non-key column
    assert updated["after"] == {"id": 2, "name": "Åsa", "email": None}
    assert "vip" not in fields(customers[4][1])
    added_column = customers[5][1]
    assert fields(added_column)["vip"]["type"] == "boolean"
    assert added_column["payload"]["after"] == {"id": 3, "name": "Ng", "email": None, "vip": True}

    # --- order_lines: composite key, numeric, timestamptz, REPLICA IDENTITY FULL --------------------
    ops = [(v["payload"]["op"] if v else None, k["payload"]["order_id"], k["payload"]["line_no"]) for k, v in lines]
    assert ops == [("r", 10, 1), ("c", 10, 2), ("u", 10, 1), ("d", 10, 2), (None, 10, 2)]
    key = lines[0][0]
    assert [(f["field"], f["type"]) for f in key["schema"]["fields"]] == [("order_id", "int64"), ("line_no", "int32")]
    snap, created, updated, deleted = (v["payload"] for _, v in lines[:4])
    schema = fields(lines[0][1])
    assert schema["amount"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert schema["amount"]["parameters"] == {"scale": "2", "connect.decimal.precision": "12"}
    assert schema["placed_at"] == {"type": "string", "optional": False, "name": "io.debezium.time.ZonedTimestamp",
                                   "version": 1, "field": "placed_at"}
    assert decimal(snap["after"]["amount"], schema["amount"]) == Decimal("12345.67")
    assert snap["after"]["placed_at"] == "2024-03-01T10:30:00.123456Z"  # UTC
    assert snap["after"]["note"] == "crème brûlée, l'été \"x\"" and snap["after"]["discount"] is None
    assert decimal(created["after"]["amount"], schema["amount"]) == Decimal("-0.05")
    assert decimal(created["after"]["discount"], schema["discount"]) == Decimal("1.50")
    assert created["after"]["placed_at"] == "2024-12-31T23:59:59.000000Z"  # always the column's 6 digits
    assert decimal(updated["before"]["amount"], schema["amount"]) == Decimal("12345.67")  # FULL: the old row
    assert decimal(updated["after"]["amount"], schema["amount"]) == Decimal("9999999999.99")
    assert updated["after"]["note"] == "a\\b"
    assert deleted["before"]["line_no"] == 2 and decimal(deleted["before"]["amount"], schema["amount"]) == Decimal("-0.05")
    assert deleted["after"] is None

    # --- order and transactions -----------------------------------------------------------------
    streamed = [v["payload"]["source"] for _, v in customers[1:] + lines[1:] if v is not None]
    snapshot_lsn = max(v["payload"]["source"]["lsn"] for v in (customers[0][1], lines[0][1]))
    # snapshot rows carry the slot's start LSN, which a change committed right after can share
    assert all(s["snapshot"] == "false" and s["lsn"] >= snapshot_lsn for s in streamed)
    for topic in (customers, lines):
        lsns = [v["payload"]["source"]["lsn"] for _, v in topic if v is not None]
        assert lsns == sorted(lsns) and len(set(lsns[1:])) == len(lsns) - 1, lsns
    first_tx = {customers[1][1]["payload"]["source"]["txId"], customers[2][1]["payload"]["source"]["txId"],
                lines[1][1]["payload"]["source"]["txId"], lines[2][1]["payload"]["source"]["txId"]}
    assert len(first_tx) == 1 and customers[4][1]["payload"]["source"]["txId"] not in first_tx

    # --- a table created after the connector started ----------------------------------------------
    assert [(k["payload"], v["payload"]["op"], v["payload"]["after"]) for k, v in late] == [
        ({"id": 1}, "c", {"id": 1, "v": "after the start"})]

    debezium.remove_connector(f"env-{database}")
    assert not postgres.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (config["slot.name"],))
    assert not postgres.query("SELECT 1 FROM pg_publication WHERE pubname = %s", (config["publication.name"],), database=database)


def test_wait_caught_up_is_exact(postgres, debezium, kafka, database):
    """Right after wait_caught_up(), every row committed before it is in Kafka: rounds of a few
    transactions read back at once, never a message short; also with a filtered publication."""
    postgres.execute("CREATE TABLE t (id int PRIMARY KEY, round int); CREATE TABLE other (id int PRIMARY KEY)", database=database)
    prefix = f"exact{secrets.token_hex(3)}"
    debezium.add_connector(f"exact-{database}", database, prefix, tables=["public.t"])
    expected = []
    for round_ in range(4):
        for i in range(3):
            row = round_ * 10 + i
            postgres.execute("INSERT INTO t VALUES (%s, %s)", (row, round_), database=database)
            expected.append(row)
        postgres.execute("INSERT INTO other VALUES (%s)", (round_,), database=database)  # not captured
        started = time.monotonic()
        debezium.wait_caught_up()
        took = time.monotonic() - started
        got = [v["payload"]["after"]["id"] for _, v in read_topic(kafka, f"{prefix}.public.t")]
        assert got == expected, f"round {round_} (wait_caught_up {took:.2f} s)"
    topics = kafka.admin().list_topics(timeout=10).topics
    assert f"{prefix}.public.other" not in topics
