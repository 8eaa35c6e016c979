"""`format: dms` (runtime/sources/dms.py): AWS DMS's change records, in the shape of its Kafka
target and as rows with `Op`. DMS itself cannot run outside AWS: the records are written as the
DMS documentation shows them, and read through a real broker and `pipe run`."""

from __future__ import annotations

import json

import pytest

from runtime.sources.change_events import BadEvent
from runtime.sources.dms import decoder


def dms(operation: str, row: dict, ts: str, record_type: str = "data") -> bytes:
    return json.dumps({"data": row, "metadata": {"timestamp": ts, "record-type": record_type, "operation": operation,
                                                 "partition-key-type": "primary-key", "schema-name": "sales", "table-name": "orders",
                                                 "transaction-id": 8589934592}}).encode()


def test_kafka_target_records_become_rows_ordered_by_the_change_sequence_or_the_timestamp():
    decode = decoder()
    row = json.loads(decode(dms("update", {"id": 1, "total": "12.50", "AR_H_CHANGE_SEQ": "20241001102233000000000000000000421"},
                                "2024-10-01T10:22:33.123456Z"), None)[0])
    assert row == {"id": 1, "total": "12.50", "_cdc_op": "u", "_cdc_position": "20241001102233000000000000000000421",
                   "_cdc_ts": "2024-10-01T10:22:33.123456Z", "_cdc_table": "sales.orders", "_hoodie_is_deleted": False}
    deleted = json.loads(decode(dms("delete", {"id": 1}, "2024-10-01T10:22:34.000001Z"), None)[0])
    assert deleted["_hoodie_is_deleted"] is True and deleted["_cdc_position"] == "2024-10-01T10:22:34.000001Z"
    assert json.loads(decode(dms("load", {"id": 2}, "2024-10-01T09:00:00.000000Z"), None)[0])["_cdc_op"] == "r"
    assert decode(dms("create-table", {}, "2024-10-01T09:00:00.000000Z", record_type="control"), None) is None


def test_rows_with_op_are_read_too():
    row = json.loads(decoder()(json.dumps({"Op": "D", "id": 4, "timestamp": "2024-10-01 10:00:00.000001"}).encode(), None)[0])
    assert row["id"] == 4 and row["_cdc_op"] == "d" and row["_hoodie_is_deleted"] is True and "Op" not in row


@pytest.mark.parametrize("value, reason", [
    (b"[1]", "not a DMS record"),
    (json.dumps({"Op": "X", "id": 1, "timestamp": "t"}).encode(), "Op 'X' is none of I, U, D"),
    (json.dumps({"Op": "I", "id": 1}).encode(), "no position to order it by"),
    (json.dumps({"data": {"id": 1}, "metadata": {"operation": "merge", "timestamp": "t"}}).encode(), "operation 'merge'"),
])
def test_what_is_no_dms_record_is_refused_with_the_reason(value, reason):
    with pytest.raises(BadEvent, match=reason):
        decoder()(value, None)


@pytest.mark.kafka
@pytest.mark.spark
def test_dms_changes_apply_in_order_through_a_broker(spark, tmp_path, capsys, kafka):
    import decimal

    import yaml

    from tests.conftest import write_project
    from tests.test_run import PROJECT_YML, assert_rows, run_ok, steps

    kafka.create_topic("dms.sales.orders", partitions=3)
    root = write_project(tmp_path / "p", {
        "pipe_project.yml": PROJECT_YML,
        "sources/dms.yml": yaml.safe_dump({"sources": {"orders_dms": {
            "kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic": "dms.sales.orders", "format": "dms",
            "schema": "id BIGINT, customer STRING, total DECIMAL(10,2)"}}}, sort_keys=False),
        "tables/orders.yml": "tables:\n  orders:\n    key: [id]\n    precombine: _cdc_position\n    tombstone_days: 3\n",
        "tables/orders.sql": "select id, customer, total, _cdc_op, _cdc_position, _hoodie_is_deleted from {{ source('orders_dms') }}\n",
    })
    ts = lambda s: f"2024-10-01T10:00:{s:02d}.000000Z"  # noqa: E731
    model = {}
    records = []
    for i in range(300):
        records.append((str(i), dms("load", {"id": i, "customer": f"Zoë {i}", "total": f"{i}.50"}, ts(0))))
        model[i] = (i, f"Zoë {i}", decimal.Decimal(f"{i}.50"), "r")
    for i in range(0, 300, 7):  # updated, some twice; some deleted
        records.append((str(i), dms("update", {"id": i, "customer": "O'Brien", "total": "1.00"}, ts(10))))
        records.append((str(i), dms("update", {"id": i, "customer": "O'Brien \"2\"", "total": "2.00"}, ts(20))))
        model[i] = (i, "O'Brien \"2\"", decimal.Decimal("2.00"), "u")
    for i in range(0, 300, 11):
        records.append((str(i), dms("delete", {"id": i, "customer": None, "total": None}, ts(30))))
        model.pop(i)
    records.append(("ctl", dms("drop-table", {}, ts(31), record_type="control")))
    kafka.produce("dms.sales.orders", [(k, v) for k, v in records])
    run_ok(capsys, root)
    assert "1 message(s) without a row (tombstones, control records) skipped" in steps(root)["table.orders"]["inputs"]["orders_dms"]["detail"]
    assert_rows(spark, root, "orders", ["id", "customer", "total", "_cdc_op"], list(model.values()))
    # late: an update older than the delete of its key stays deleted; a newer insert is back
    kafka.produce("dms.sales.orders", [("0", dms("update", {"id": 0, "customer": "late", "total": "9.99"}, ts(25))),
                                       ("11", dms("insert", {"id": 11, "customer": "again", "total": "3.00"}, ts(40)))])
    model[11] = (11, "again", decimal.Decimal("3.00"), "c")
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["id", "customer", "total", "_cdc_op"], list(model.values()))
