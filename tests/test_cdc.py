"""Change data capture end to end, with real parts only: PostgreSQL (logical decoding) ->
Debezium's Postgres connector in Kafka Connect -> Kafka -> `pipe run` of a fan-out source ->
Hudi tables, read back with hudi-rs and compared with the database's own tables after every
round (fixtures `postgres`, `debezium`, `kafka`: tests/postgres/env.py, tests/kafka/connect.py)."""

from __future__ import annotations

import datetime as dt
import random
import secrets
from pathlib import Path

import pytest

from tests.conftest import write_project
from tests.test_run import PROJECT_YML, hudi_rows, pipe, pipe_rows, run_ok, steps

pytestmark = [pytest.mark.cdc, pytest.mark.kafka, pytest.mark.spark]

CUSTOMERS = ["id", "name", "email", "balance", "updated_at", "note"]
LINES = ["order_id", "line_no", "sku", "qty", "price"]
NAMES = ["Zoë", "O'Brien \"Bikes\"", "Łódź – market", "plain", None]


@pytest.fixture
def database(pg_database, debezium):
    return pg_database


def project(tmp_path: Path, kafka, prefix: str) -> Path:
    import yaml

    src = {"kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic_pattern": prefix + r"\.public\..*", "format": "debezium",
           "on_bad_record": "dead_letter", "fan_out": {"table_prefix": "", "table": {"tombstone_days": 7, "type": "merge_on_read"}}}
    return write_project(tmp_path / "p", {"pipe_project.yml": PROJECT_YML,
                                          "sources/shop.yml": yaml.safe_dump({"sources": {"shop": src}}, sort_keys=False)})


def db(postgres, database: str, table: str, columns: list[str]) -> list[tuple]:
    return sorted(postgres.query(f"SELECT {', '.join(columns)} FROM {table}", database=database))


def assert_equal(postgres, database: str, root: Path, table: str, columns: list[str]) -> None:
    want = db(postgres, database, table, columns)
    got = hudi_rows(root, table, columns)
    assert got == want, f"{table}: {len(got)} rows in the lake, {len(want)} in the database; first differences: " + \
        str([(g, w) for g, w in zip(got, want) if g != w][:3] or (sorted(set(got) ^ set(want))[:3]))


def test_postgres_tables_arrive_equal_round_after_round(spark, tmp_path, capsys, kafka, postgres, debezium, database):
    """Inserts, updates (a key many times within a round), deletes (and keys deleted and inserted
    again), transactions over two tables, a column added and a table added: after every round the
    lake's tables equal the database's."""
    pg = lambda sql, params=None: postgres.execute(sql, params, database=database)  # noqa: E731
    rng = random.Random(40)
    pg("""
        CREATE TABLE customers (id bigint PRIMARY KEY, name text, email text, balance numeric(12,2) NOT NULL,
                                updated_at timestamptz NOT NULL, note text);
        CREATE TABLE order_lines (order_id bigint, line_no int, sku text NOT NULL, qty int NOT NULL, price numeric(10,2),
                                  PRIMARY KEY (order_id, line_no));
        ALTER TABLE order_lines REPLICA IDENTITY FULL;
    """)
    next_id = [0]

    def insert_customers(n: int) -> None:
        rows = []
        for _ in range(n):
            i = next_id[0] = next_id[0] + 1
            rows.append((i, rng.choice(NAMES), f"c{i}@shop.example", f"{rng.randint(-10_000_00, 10_000_00) / 100:.2f}", rng.choice(NAMES)))
        with postgres.connect(database) as conn:
            conn.cursor().executemany("INSERT INTO customers VALUES (%s, %s, %s, %s, now() - random() * interval '900 days', %s)", rows)

    insert_customers(400)
    pg("INSERT INTO order_lines SELECT o, l, 'SKU-' || o || '-' || l, 1 + (o * l) % 5, (o % 97) + 0.99 "
       "FROM generate_series(1, 100) o, generate_series(1, 3) l")
    prefix = f"pg{secrets.token_hex(3)}"
    kafka.create_topic(f"{prefix}.public.customers", partitions=3)  # the key picks the partition: a key's changes stay in order
    debezium.add_connector(f"shop-{database}", database, prefix)
    debezium.wait_caught_up()

    root = project(tmp_path, kafka, prefix)
    code, out, err = pipe(capsys, root, "discover", "shop")
    assert code == 0 and "+ customers: topic" in out and "key order_id, line_no" in out, out + err
    run_ok(capsys, root, "--threads", "2")  # the snapshot
    assert_equal(postgres, database, root, "customers", CUSTOMERS)
    assert_equal(postgres, database, root, "order_lines", LINES)
    (root / "target/plan.json").rename(root / "base-plan.json")

    for round_no in range(1, 5):
        insert_customers(120)
        ids = [r[0] for r in postgres.query("SELECT id FROM customers", database=database)]
        for i in rng.sample(ids, 60):
            pg("UPDATE customers SET balance = balance + 1.25, note = %s, updated_at = now() WHERE id = %s", (rng.choice(NAMES), i))
        hot = rng.choice(ids)
        for n in range(6):  # one key, many times within one run
            pg("UPDATE customers SET email = %s WHERE id = %s", (f"hot{n}@shop.example", hot))
        gone = rng.sample([i for i in ids if i != hot], 25)
        pg("DELETE FROM customers WHERE id = ANY(%s)", (gone,))
        again = gone[:5]  # deleted, then inserted again with the same key within the round
        with postgres.connect(database) as conn:
            conn.cursor().executemany("INSERT INTO customers (id, name, balance, updated_at) VALUES (%s, 'again', 0, now())",
                                      [(i,) for i in again])
        order = 1000 + round_no
        pg(f"""BEGIN;
               INSERT INTO order_lines VALUES ({order}, 1, 'NEW-{order}', 2, 10.50), ({order}, 2, 'NEW-{order}-b', 1, NULL);
               UPDATE customers SET balance = balance - 10.50 WHERE id = {hot};
               DELETE FROM order_lines WHERE order_id = {round_no} AND line_no = 2;
               UPDATE order_lines SET qty = qty + 10 WHERE order_id = {round_no + 10};
               COMMIT""")
        if round_no == 2:  # a column added in the database flows in with the next run
            pg("ALTER TABLE customers ADD COLUMN phone text")
            pg("UPDATE customers SET phone = '+33 1 ' || id WHERE id % 7 = 0")
        if round_no == 3:  # a table added in the database
            pg("CREATE TABLE refunds (id bigint PRIMARY KEY, order_id bigint NOT NULL, cents bigint NOT NULL, reason text)")
            pg("INSERT INTO refunds SELECT r, r % 100, r * 125, CASE WHEN r % 3 = 0 THEN NULL ELSE 'damaged \"box\"' END "
               "FROM generate_series(1, 40) r")
        debezium.wait_caught_up()
        run_ok(capsys, root, "--threads", "2")
        columns = CUSTOMERS + (["phone"] if round_no >= 2 else [])
        assert_equal(postgres, database, root, "customers", columns)
        assert_equal(postgres, database, root, "order_lines", LINES)
        if round_no == 3:
            message = steps(root)["source.shop"]["message"]
            assert f"1 topic(s) without a table yet: {prefix}.public.refunds" in message, message
            code, out, err = pipe(capsys, root, "discover", "shop")
            assert "+ refunds: topic" in out and "~ customers: column(s) added: phone" in out, out + err
            code, out, err = pipe(capsys, root, "diff", str(root / "base-plan.json"))
            assert "+ table.refunds  added" in out and "column(s) added: phone" in out, out
            run_ok(capsys, root)
            assert_equal(postgres, database, root, "refunds", ["id", "order_id", "cents", "reason"])
    # pipe's own reader agrees with hudi-rs; the dead-letter table was never needed
    naive = [tuple(v.astimezone(dt.timezone.utc).replace(tzinfo=None) if isinstance(v, dt.datetime) else v for v in row)
             for row in db(postgres, database, "customers", CUSTOMERS)]  # Spark's TIMESTAMP: UTC here, without a zone
    assert pipe_rows(spark, root, "customers", CUSTOMERS) == naive
    assert not (root / "lake/shop__customers_dead_letter").exists()
    assert steps(root)["table.customers"]["inputs"]["shop__customers"]["checkpoint"].startswith(f"{prefix}.public.customers,0:")


def test_avro_change_events_through_a_real_schema_registry_arrive_equal(spark, tmp_path, capsys, kafka, postgres, debezium,
                                                                          schema_registry, database):
    """Debezium writes Avro (Apicurio's converter, Confluent's wire format) registered in a real
    registry; the source reads it through the registry's Confluent API: decimals, timestamps,
    dates, accents, deletes and a column added flow into the table as they do with JSON."""
    import yaml

    pg = lambda sql, params=None: postgres.execute(sql, params, database=database)  # noqa: E731
    pg("""CREATE TABLE payments (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, paid_at timestamptz NOT NULL,
                                 payer text NOT NULL, note text, due date);
          INSERT INTO payments SELECT i, (i * 7919 % 1000000) / 100.0 - 5000, timestamptz '2024-03-01 10:30:00.123456+00' + i * interval '1 hour',
                 'Zoë Ångström-Müller ' || i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'O''Brien "x"' END, date '1969-12-25' + i
          FROM generate_series(1, 500) i""")
    prefix = f"av{secrets.token_hex(3)}"
    debezium.add_connector(f"avro-{database}", database, prefix, avro_registry=schema_registry.api_url)
    debezium.wait_caught_up()
    src = {"kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic": f"{prefix}.public.payments", "format": "debezium",
           "schema_registry": {"url": schema_registry.url}}
    root = write_project(tmp_path / "p", {
        "pipe_project.yml": PROJECT_YML,
        "sources/pay.yml": yaml.safe_dump({"sources": {"payments_cdc": src}}, sort_keys=False),
        "tables/payments.yml": "tables:\n  payments:\n    key: [id]\n    precombine: _cdc_position\n    tombstone_days: 7\n",
        "tables/payments.sql": "select * from {{ source('payments_cdc') }}\n"})
    columns = ["id", "amount", "paid_at", "payer", "note", "due"]
    run_ok(capsys, root)
    assert_equal(postgres, database, root, "payments", columns)
    pg("UPDATE payments SET amount = amount + 0.01, note = 'Łódź' WHERE id % 10 = 0")
    pg("DELETE FROM payments WHERE id % 25 = 0")
    pg("ALTER TABLE payments ADD COLUMN region text")
    pg("INSERT INTO payments VALUES (1000, -0.05, now(), 'new', NULL, NULL, 'EU')")
    debezium.wait_caught_up()
    run_ok(capsys, root)
    assert_equal(postgres, database, root, "payments", columns + ["region"])


def test_kill_9_at_random_moments_and_a_broker_restart_lose_and_repeat_no_change(spark, tmp_path, capsys, kafka, postgres,
                                                                                debezium, database):
    """Real Debezium events of 8,000 rows (snapshot, an update of every row, 5% deleted) read
    3,000 messages per run into an upsert table and an append-only log of every event: `pipe run`
    killed with SIGKILL three times at random moments, the broker restarted while a run reads,
    then runs until nothing is new: the table equals the database, and the log holds every change
    event exactly once (no offset read twice, none skipped)."""
    import threading
    import time

    import yaml

    from tests.test_kafka import _pipe_process, _python_workers, kill_runs

    pg = lambda sql, params=None: postgres.execute(sql, params, database=database)  # noqa: E731
    pg("""CREATE TABLE accounts (id bigint PRIMARY KEY, owner text, balance numeric(14,2) NOT NULL, opened date, updated_ms bigint);
          INSERT INTO accounts SELECT i, CASE WHEN i % 9 = 0 THEN NULL ELSE 'Zoë ''' || i || ''' "Łódź"' END,
                 (i * 7919 % 10000000) / 100.0 - 40000, date '2020-01-01' + i % 2000, 1717000000000 + i
          FROM generate_series(1, 8000) i""")
    prefix = f"kl{secrets.token_hex(3)}"
    topic = f"{prefix}.public.accounts"
    kafka.create_topic(topic, partitions=4)
    debezium.add_connector(f"kill-{database}", database, prefix)
    pg("UPDATE accounts SET balance = balance + 0.01, updated_ms = updated_ms + 1")
    pg("DELETE FROM accounts WHERE id % 20 = 0")
    debezium.wait_caught_up()
    events = 8_000 + 8_000 + 400  # snapshot reads, updates, deletes (tombstones are no events)

    src = {"kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic": topic, "format": "debezium", "max_records_per_run": 3_000}
    root = write_project(tmp_path / "p", {
        "pipe_project.yml": PROJECT_YML,
        "sources/cdc.yml": yaml.safe_dump({"sources": {"accounts_cdc": src}}, sort_keys=False),
        "tables/accounts.yml": "tables:\n  accounts:\n    key: [id]\n    precombine: _cdc_position\n    tombstone_days: 7\n",
        "tables/accounts.sql": "select * from {{ source('accounts_cdc') }}\n",
        "tables/account_log.sql": "select id, _cdc_op, _kafka_partition, _kafka_offset from {{ source('accounts_cdc') }}\n"})

    assert kill_runs(root, random.Random(40), 4, 16) >= 2, "most runs were killed before they ended"

    proc = _pipe_process(root)  # the broker restarts while this run reads the partitions
    deadline = time.monotonic() + 300
    while proc.poll() is None and not _python_workers(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    restarted = proc.poll() is None
    if restarted:
        restarter = threading.Thread(target=kafka.restart)
        restarter.start()
    out, _ = proc.communicate(timeout=600)
    if restarted:
        restarter.join()
    assert "Traceback" not in out and proc.returncode in (0, 1), out  # done, or failed naming the brokers
    assert restarted, f"the run ended before it read:\n{out}"

    while True:  # the runs a user starts after the crashes
        run_ok(capsys, root)
        if all(steps(root)[f"table.{t}"]["state"] == "no_input" for t in ("accounts", "account_log")):
            break
    assert_equal(postgres, database, root, "accounts", ["id", "owner", "balance", "opened", "updated_ms"])
    log = hudi_rows(root, "account_log", ["_kafka_partition", "_kafka_offset", "_cdc_op"])
    assert len(log) == events, f"{len(log)} events in the log, {events} written by Debezium"
    assert len({(p, o) for p, o, _ in log}) == len(log), "an event read twice"
    assert sorted({op for _, _, op in log}) == ["d", "r", "u"]
