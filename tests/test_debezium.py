"""`format: debezium` (runtime/sources/debezium.py): how one change event becomes a row. Unit
cases on messages shaped as Debezium 3.x's Postgres connector writes them with Kafka Connect's
JsonConverter; tests/test_cdc.py checks the same against real Postgres, Debezium and Kafka."""

from __future__ import annotations

import base64
import json

import pytest

from runtime.sources import SourceError
from runtime.sources.debezium import BadEvent, decoder, position, spark_type, union_ddl

ROW_FIELDS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "field": "amount"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "paid_at"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "seen_at"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
]


def _unscaled(cents: int) -> str:
    return base64.b64encode(cents.to_bytes((cents.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()


def event(op: str, before: dict | None, after: dict | None, lsn: int = 1000, ts_ms: int = 1_700_000_000_123, schemas: bool = True) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": ts_ms + 5,
               "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "shop", "ts_ms": ts_ms, "snapshot": "false",
                          "db": "shop", "schema": "public", "table": "payments", "txId": 771, "lsn": lsn}}
    if not schemas:
        return json.dumps(payload).encode()
    row = {"type": "struct", "optional": True, "name": "shop.public.payments.Value", "fields": ROW_FIELDS}
    schema = {"type": "struct", "name": "shop.public.payments.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "fields": [], "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source"},
        {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    return json.dumps({"schema": schema, "payload": payload}).encode()


def key(id_: int) -> bytes:
    return json.dumps({"schema": {"type": "struct", "name": "shop.public.payments.Key", "optional": False,
                                  "fields": [{"type": "int64", "optional": False, "field": "id"}]},
                       "payload": {"id": id_}}).encode()


ROW = {"id": 7, "name": "Zoë \"O'Brien\"", "amount": _unscaled(-123456), "paid_at": "2024-02-29T23:59:59.123456Z",
       "seen_at": 1_709_251_199_123_456, "day": 19782}


def test_an_insert_becomes_its_row_with_connect_encodings_turned_into_values():
    text, ddl = decoder()(event("c", None, ROW, lsn=26_000_000_123), key(7))
    row = json.loads(text)
    assert row == {"id": 7, "name": "Zoë \"O'Brien\"", "amount": "-1234.56", "paid_at": "2024-02-29T23:59:59.123456Z",
                   "seen_at": "2024-02-29T23:59:59.123456Z", "day": "2024-02-29", "_cdc_op": "c",
                   "_cdc_position": "1:00000000026000000123", "_cdc_ts": "2023-11-14T22:13:20.123000Z",
                   "_cdc_table": "public.payments", "_hoodie_is_deleted": False}
    assert json.loads(ddl) == [["id", "BIGINT"], ["name", "STRING"], ["amount", "DECIMAL(12,2)"], ["paid_at", "TIMESTAMP"],
                               ["seen_at", "TIMESTAMP"], ["day", "DATE"]]


def test_a_schema_is_given_once_per_task():
    decode = decoder()
    assert decode(event("c", None, ROW), key(7))[1] is not None
    assert decode(event("u", ROW, {**ROW, "name": None}), key(7))[1] is None


def test_a_delete_is_its_before_image_marked_deleted_and_keeps_the_key_when_before_is_empty():
    row = json.loads(decoder()(event("d", ROW, None, lsn=5000), key(7))[0])
    assert row["id"] == 7 and row["amount"] == "-1234.56" and row["_hoodie_is_deleted"] is True and row["_cdc_op"] == "d"
    # REPLICA IDENTITY NOTHING (or a before image without values): the message key names the row
    text, ddl = decoder()(event("d", None, None, lsn=5001), key(8))
    assert json.loads(text)["id"] == 8 and ["id", "BIGINT"] in json.loads(ddl)


def test_a_decimal_of_38_digits_keeps_every_digit():
    from runtime.sources.debezium import _digits

    unscaled = 12345678901123456789012345678901234567
    encoded = base64.b64encode(unscaled.to_bytes(17, "big", signed=True)).decode()
    assert _digits(encoded, 18) == "12345678901123456789.012345678901234567"
    assert _digits(base64.b64encode((-1).to_bytes(1, "big", signed=True)).decode(), 2) == "-0.01"


def test_events_without_schemas_pass_their_values_as_they_are():
    row = json.loads(decoder()(event("r", None, {"id": 1, "name": "a"}, schemas=False), None)[0])
    assert row["id"] == 1 and row["_cdc_op"] == "r"
    assert decoder()(event("r", None, {"id": 1}, schemas=False), None)[1] is None


def test_positions_sort_in_log_order():
    pg = [position({"connector": "postgresql", "lsn": n}, op) for n, op in ((10, "r"), (123_456_789_012, "r"), (9, "u"), (10, "u"),
                                                                               (123_456_789_012, "c"))]
    assert pg == sorted(pg)  # every snapshot read before every streamed change
    mysql = [position({"connector": "mysql", "file": f, "pos": p, "row": r})
             for f, p, r in (("bin.000009", 99_999, 0), ("bin.000010", 4, 0), ("bin.000010", 4, 1), ("bin.000010", 120, 0))]
    assert mysql == sorted(mysql)
    assert position({"connector": "mongodb", "ts_ms": 5}) < position({"connector": "mongodb", "ts_ms": 40})


@pytest.mark.parametrize("value, reason", [
    (b"not json", "not JSON"),
    (b'{"id": 1}', "not a Debezium change event"),
    (json.dumps({"op": "t", "source": {}}).encode(), "a TRUNCATE, which pipe does not apply"),
    (json.dumps({"op": "c", "after": None, "source": {"lsn": 1, "connector": "postgresql"}}).encode(), "op 'c' without `after`"),
    (b"\xff\xfe", "not JSON"),
])
def test_what_is_no_change_event_is_refused_with_the_reason(value, reason):
    with pytest.raises(BadEvent, match=reason.replace("(", r"\(")):
        decoder()(value, None)


def test_connect_types_map_to_spark_types():
    assert spark_type({"type": "int16"}) == "SMALLINT"
    assert spark_type({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "4"}}) == "DECIMAL(38,4)"
    assert spark_type({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []}) == "STRING"
    assert spark_type({"type": "int64", "name": "io.debezium.time.MicroTime"}) == "STRING"
    assert spark_type({"type": "array", "items": {"type": "string"}}) == "ARRAY<STRING>"


def test_the_union_of_schemas_adds_columns_and_refuses_a_changed_type():
    assert union_ddl("s", [("t/0 offset 1", '[["id", "BIGINT"], ["name", "STRING"]]'), ("t/1 offset 9", '[["id", "BIGINT"], ["email", "STRING"]]')]) \
        == "`id` BIGINT, `name` STRING, `email` STRING"
    with pytest.raises(SourceError, match=r"column id is BIGINT in the events at t/0 offset 1 and STRING in those at t/2 offset 4"):
        union_ddl("s", [("t/0 offset 1", '[["id", "BIGINT"]]'), ("t/2 offset 4", '[["id", "STRING"]]')])


# --- hand-written events through a real broker and `pipe run` ------------------------------------


def cdc_project(tmp_path, broker, topic: str, **source):
    import yaml

    from tests.conftest import write_project
    from tests.test_run import PROJECT_YML

    src = {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic, "format": "debezium", **source}
    return write_project(tmp_path / "p", {
        "pipe_project.yml": PROJECT_YML,
        "sources/cdc.yml": yaml.safe_dump({"sources": {"payments_cdc": src}}, sort_keys=False),
        "tables/payments.yml": """
            tables:
              payments:
                key: [id]
                precombine: _cdc_position
                tombstone_days: 7
            """,
        "tables/payments.sql": "select * from {{ source('payments_cdc') }}\n",
    })


@pytest.mark.kafka
@pytest.mark.spark
def test_changes_apply_in_log_order_whatever_order_they_arrive_in(spark, tmp_path, capsys, kafka):
    """Inserts, updates and deletes of one key within a batch, an update arriving after the
    delete it precedes (in a later run), a delete's tombstone message, and a poison message:
    the table holds each key's last change by LSN, deleted keys stay deleted."""
    import decimal

    from tests.test_run import assert_rows, hudi_rows, pipe, run_ok, steps

    kafka.create_topic("shop.public.payments", partitions=2)
    root = cdc_project(tmp_path, kafka, "shop.public.payments")
    row = lambda i, cents, name: {**ROW, "id": i, "amount": _unscaled(cents), "name": name}  # noqa: E731
    send = lambda events: kafka.produce("shop.public.payments", [(key(i), None if e is None else e) for i, e in events])  # noqa: E731
    send([(1, event("r", None, row(1, 100, "a"), lsn=10)), (2, event("r", None, row(2, 200, "b"), lsn=10)),
          (3, event("r", None, row(3, 300, "c"), lsn=10)),
          (1, event("u", row(1, 100, "a"), row(1, 150, "a2"), lsn=30)), (1, event("u", row(1, 150, "a2"), row(1, 175, "a3"), lsn=40)),
          (2, event("d", row(2, 200, "b"), None, lsn=50)), (2, None)])  # a delete and its tombstone
    run_ok(capsys, root)
    columns = ["id", "name", "amount", "_cdc_op", "_cdc_position"]
    d = decimal.Decimal
    assert_rows(spark, root, "payments", columns, [(1, "a3", d("1.75"), "u", f"1:{40:020d}"), (3, "c", d("3.00"), "r", f"0:{10:020d}")])
    step = steps(root)["table.payments"]
    assert step["inputs"]["payments_cdc"]["tombstones"] == 1, step
    # late: an update of key 2 from before its delete, an older update of key 1; new: key 4
    send([(2, event("u", row(2, 200, "b"), row(2, 250, "b-late"), lsn=45)), (1, event("u", None, row(1, 160, "stale"), lsn=35)),
          (4, event("c", None, row(4, 400, "Zoë \"d\""), lsn=60)), (3, event("d", row(3, 300, "c"), None, lsn=70)), (3, None)])
    run_ok(capsys, root)
    assert_rows(spark, root, "payments", columns, [(1, "a3", d("1.75"), "u", f"1:{40:020d}"), (4, 'Zoë "d"', d("4.00"), "c", f"1:{60:020d}")])
    # a key deleted, then inserted again later in the log, is back
    send([(3, event("c", None, row(3, 333, "c-again"), lsn=80))])
    run_ok(capsys, root)
    assert_rows(spark, root, "payments", columns, [(1, "a3", d("1.75"), "u", f"1:{40:020d}"), (3, "c-again", d("3.33"), "c", f"1:{80:020d}"),
                                                    (4, 'Zoë "d"', d("4.00"), "c", f"1:{60:020d}")])
    # a message that is no change event stops the step, naming topic, partition and offset
    kafka.produce("shop.public.payments", [(key(5), b'{"id": 5}')], partition=1)
    # and shapes that used to raise inside the reading task: a `source` that is no object, an unhashable op
    kafka.produce("shop.public.payments", [(key(7), b'{"op": "c", "after": {"id": 7}, "source": "x"}'),
                                           (key(8), b'{"op": ["c"], "after": {"id": 8}}')], partition=0)
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert "topic shop.public.payments partition 1 offset" in out + err and "not a Debezium change event" in out + err, out + err
    # on_bad_record: dead_letter: the run goes on, the message is kept with where it was and why
    (root / "sources/cdc.yml").write_text((root / "sources/cdc.yml").read_text() + "    on_bad_record: dead_letter\n")
    send([(6, event("c", None, row(6, 600, "f"), lsn=90))])
    out, _ = run_ok(capsys, root)
    assert "3 bad record(s) moved to table payments_cdc_dead_letter" in out, out
    assert steps(root)["table.payments"]["inputs"]["payments_cdc"]["dead_lettered"] == 3
    assert [r[0] for r in hudi_rows(root, "payments", ["id"])] == [1, 3, 4, 6]
    rows = hudi_rows(root, "payments_cdc_dead_letter", ["consumer", "topic", "partition", "offset", "message_key", "reason", "value"])
    assert sorted(r[5].split(" (")[0] for r in rows if r[2] == 0) == ["not a message pipe can read"] * 2, rows
    [dead] = [r for r in rows if r[2] == 1]
    assert dead[:3] == ("payments", "shop.public.payments", 1) and json.loads(dead[4])["payload"] == {"id": 5}, dead
    assert dead[5].startswith("not a Debezium change event") and dead[6] == '{"id": 5}', dead
    code, out, err = pipe(capsys, root, "show", "payments_cdc_dead_letter")
    assert code == 0 and "shop.public.payments" in out, out + err


# --- fan-out: one source, one table per captured table ------------------------------------------


def change(table: str, op: str, row: dict, fields: list[tuple[str, str]], lsn: int) -> bytes:
    """A Debezium event of `table` (schema public) whose row has `fields` [(name, Connect type)]."""
    schema_fields = [{"type": t, "optional": True, "field": n} for n, t in fields]
    row_schema = {"type": "struct", "optional": True, "name": f"shop.public.{table}.Value", "fields": schema_fields}
    payload = {"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op, "ts_ms": 1_700_000_000_000,
               "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": table, "lsn": lsn, "ts_ms": 1_700_000_000_000}}
    return json.dumps({"schema": {"type": "struct", "fields": [{**row_schema, "field": "before"}, {**row_schema, "field": "after"},
                                                               {"type": "string", "field": "op"}]}, "payload": payload}).encode()


def change_key(row: dict, names: list[str]) -> bytes:
    return json.dumps({"schema": {"type": "struct", "fields": [{"type": "int64", "optional": False, "field": n} for n in names]},
                       "payload": {n: row[n] for n in names}}).encode()


@pytest.mark.kafka
@pytest.mark.spark
def test_a_fan_out_source_discovers_its_tables_and_runs_one_table_per_captured_table(spark, tmp_path, capsys, kafka):
    import yaml

    from tests.conftest import write_project
    from tests.test_run import PROJECT_YML, hudi_rows, pipe, run_ok, steps

    customers = [("id", "int64"), ("email", "string")]
    lines = [("order_id", "int64"), ("line_no", "int64"), ("sku", "string")]
    for topic in ("fo.public.customers", "fo.public.order_lines", "fo.transaction"):
        kafka.create_topic(topic, partitions=2)
    kafka.produce("fo.public.customers", [(change_key(r, ["id"]), change("customers", "c", r, customers, 100 + r["id"]))
                                            for r in ({"id": i, "email": f"c{i}@shop.example"} for i in range(50))])
    kafka.produce("fo.public.order_lines", [(change_key(r, ["order_id", "line_no"]), change("order_lines", "c", r, lines, 200 + i))
                                              for i, r in enumerate({"order_id": o, "line_no": n, "sku": f"S-{o}-{n}"}
                                                                    for o in range(20) for n in range(3))])
    kafka.produce("fo.transaction", [(b'{"id": "771"}', b'{"status": "BEGIN", "id": "771"}')])
    src = {"kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic_pattern": r"fo\.public\..*", "format": "debezium",
           "fan_out": {"table": {"tombstone_days": 7, "tags": ["bronze"]}}}
    root = write_project(tmp_path / "p", {"pipe_project.yml": PROJECT_YML,
                                          "sources/cdc.yml": yaml.safe_dump({"sources": {"shop_cdc": src}}, sort_keys=False)})
    code, out, err = pipe(capsys, root, "compile")
    assert code == 0 and "fans out to no table yet" in out + err and "pipe discover shop_cdc" in out + err, out + err

    code, out, err = pipe(capsys, root, "discover", "shop_cdc")
    assert code == 0, out + err
    assert "+ customers: topic fo.public.customers, key id, 2 column(s)" in out, out
    assert "+ order_lines: topic fo.public.order_lines, key order_id, line_no, 3 column(s)" in out, out
    captured = yaml.safe_load((root / "sources/shop_cdc.captured.yml").read_text())
    assert captured == {"captured": {"shop_cdc": {
        "customers": {"topic": "fo.public.customers", "key": ["id"], "schema": {"id": "BIGINT", "email": "STRING"}},
        "order_lines": {"topic": "fo.public.order_lines", "key": ["order_id", "line_no"],
                        "schema": {"order_id": "BIGINT", "line_no": "BIGINT", "sku": "STRING"}}}}}
    code, out, _ = pipe(capsys, root, "ls", "--select", "tag:bronze")
    assert out.split() == ["table.shop_cdc_customers", "table.shop_cdc_order_lines"], out
    (root / "target/plan.json").rename(root / "base-plan.json")

    run_ok(capsys, root, "--threads", "2")
    assert hudi_rows(root, "shop_cdc_customers", ["id", "email"]) == [(i, f"c{i}@shop.example") for i in range(50)]
    assert len(hudi_rows(root, "shop_cdc_order_lines", ["order_id", "line_no"])) == 60
    inputs = steps(root)["table.shop_cdc_order_lines"]["inputs"]
    assert list(inputs) == ["shop_cdc__order_lines"] and inputs["shop_cdc__order_lines"]["checkpoint"].startswith("fo.public.order_lines,0:")

    # a table added in the database: its topic waits, named, until discovery writes it down; a
    # column added flows in at once, and discovery records it
    kafka.create_topic("fo.public.refunds", partitions=1)
    kafka.produce("fo.public.refunds", [(change_key({"id": 1}, ["id"]), change("refunds", "c", {"id": 1, "cents": 500},
                                                                                  [("id", "int64"), ("cents", "int64")], 300))])
    wider = customers + [("phone", "string")]
    kafka.produce("fo.public.customers", [(change_key({"id": 3}, ["id"]),
                                             change("customers", "u", {"id": 3, "email": "new@shop.example", "phone": "+33 1 23"}, wider, 400))])
    run_ok(capsys, root)
    assert "1 topic(s) without a table yet: fo.public.refunds (`pipe discover shop_cdc` writes them down)" in steps(root)["source.shop_cdc"]["message"]
    assert (3, "new@shop.example", "+33 1 23") in hudi_rows(root, "shop_cdc_customers", ["id", "email", "phone"])
    code, out, err = pipe(capsys, root, "discover", "shop_cdc")
    assert code == 0 and "+ refunds: topic fo.public.refunds, key id, 2 column(s)" in out and "~ customers: column(s) added: phone" in out, out
    code, out, err = pipe(capsys, root, "diff", str(root / "base-plan.json"))
    assert "+ table.shop_cdc_refunds  added" in out and "column(s) added: phone" in out and "most severe: non-breaking" in out, out
    run_ok(capsys, root)
    assert hudi_rows(root, "shop_cdc_refunds", ["id", "cents"]) == [(1, 500)]


def test_the_example_projects_commented_cdc_sources_compile_once_uncommented(tmp_path, monkeypatch):
    """project_template/sources/shop.yml shows a fan-out Debezium source and a jdbc source,
    commented out: uncommented as its instructions say, they compile (the fan-out waits for
    `pipe discover`)."""
    import shutil

    from compiler.api import compile_project
    from tests.conftest import TEMPLATE

    root = tmp_path / "shop"
    shutil.copytree(TEMPLATE, root)
    path = root / "sources/shop.yml"
    out, on = [], False
    for line in path.read_text().splitlines():
        on = on or line.startswith("#   shop_db:")
        out.append(line[2:] if on and line.startswith("# ") else "" if on and line == "#" else line)
    path.write_text("\n".join(out) + "\n")
    monkeypatch.setenv("SHOP_KAFKA_BROKERS", "127.0.0.1:9")
    result = compile_project(root)
    assert {"shop_db", "shop_db_orders"} <= {s.name for s in result.plan.steps if s.kind == "ingest"}
    assert any("fans out to no table yet" in w.message for w in result.warnings)


def _compact(message: bytes) -> bytes:
    """The message as JsonConverter writes it: no spaces."""
    return json.dumps(json.loads(message), ensure_ascii=False, separators=(",", ":")).encode()


def test_a_schema_seen_before_is_not_parsed_again_and_the_result_is_json_loads():
    from runtime.sources.debezium import Envelopes

    envelopes = Envelopes()
    first, second = _compact(event("c", None, ROW, lsn=1)), _compact(event("u", ROW, {**ROW, "name": "Zoë \"x\" \\ é"}, lsn=2))
    assert envelopes.parse(first) == json.loads(first)
    schema = envelopes.parse(first)["schema"]
    assert envelopes.parse(second) == json.loads(second)
    assert envelopes.parse(second)["schema"] is schema  # the schema text was recognised, not parsed
    head, payload = second.split(b',"payload":', 1)
    spaced = head + b', "payload": ' + payload  # the same schema, then a space JsonConverter never writes
    assert envelopes.parse(spaced) == json.loads(spaced)
    # what json.loads refuses is refused, with the schema known or not
    for bad in (second[:-1] + b"}x", second[:-1], head + b',"payload":' + payload[:-2] + b"}", second + b"\xc2\xa0", second + b"\xa0"):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            envelopes.parse(bad)
    repeated = second[:-1] + b',"payload":1}'  # a repeated key is JSON (the last one wins)
    assert envelopes.parse(repeated) == json.loads(repeated)
    # another schema after the first: parsed whole, and recognised from then on
    other = _compact(event("c", None, {**ROW, "extra": 1}, lsn=3).replace(b'"fields": [', b'"fields": [{"type": "int32", "field": "extra"}, ', 1))
    assert envelopes.parse(other) == json.loads(other)
    assert envelopes.parse(second) == json.loads(second)
    # other encodings and no schema at all
    assert envelopes.parse(json.dumps({"a": "é"}).encode("utf-16")) == {"a": "é"}
    assert envelopes.parse(event("c", None, ROW, schemas=False)) == json.loads(event("c", None, ROW, schemas=False))


def test_decoding_a_topics_messages_with_and_without_the_schema_cache_gives_the_same_rows(monkeypatch):
    import runtime.sources.debezium as dbz

    messages = [(_compact(event("u", None, {**ROW, "id": i, "name": f"n{i} «é»"}, lsn=100 + i)), key(i)) for i in range(50)]
    messages.insert(20, (_compact(event("d", ROW, None, lsn=99)), key(7)))
    messages.insert(30, (event("c", None, {**ROW, "id": 999}, lsn=98), key(999)))  # spaced: parsed whole
    cached = [decoder()(v, k) for v, k in messages]
    monkeypatch.setattr(dbz.Envelopes, "parse", lambda self, data: json.loads(data))
    assert cached == [decoder()(v, k) for v, k in messages]
    assert [json.loads(text)["id"] for text, _ in cached] == [i for i in range(20)] + [7] + list(range(20, 29)) + [999] + list(range(29, 50))
