"""`kind: kafka` sources against a real Apache Kafka broker (KRaft, tests/kafka/env.py): messages
produced by Kafka's own client, `pipe run` in-process on the shared SparkSession, the tables read
back with pipe's reader and hudi-rs, offsets read from the commits (`pipe timeline`)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from pathlib import Path

import pytest

from runtime.sources.kafka import Range, _capped, format_checkpoint, parse_checkpoint
from tests.conftest import compile_errors, write_project
from tests.test_run import PROJECT_YML, assert_rows, commits, pipe, run_ok, run_results, steps, timeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

MERCHANTS = ["Café Zoë", "O'Brien \"Bikes\"", "plain", "Łódź – market"]
BASE_MS = 1_732_000_000_000


# --- the checkpoint text, without a broker --------------------------------------------------------


def test_a_checkpoint_is_hudis_kafka_text_and_round_trips():
    offsets = {("orders", 0): 120, ("orders", 2): 98, ("orders", 1): 7, ("refunds", 0): 0}
    text = format_checkpoint(offsets)
    assert text == "orders,0:120,1:7,2:98;refunds,0:0"
    assert parse_checkpoint(text, "s") == offsets
    assert parse_checkpoint(None, "s") == {}


@pytest.mark.parametrize("text", ["orders", "orders,0", "orders,x:1", "bad topic,0:1", '{"v": 1}'])
def test_a_checkpoint_pipe_did_not_write_says_so(text):
    from runtime.sources import SourceError

    with pytest.raises(SourceError, match="is not a Kafka checkpoint"):
        parse_checkpoint(text, "s")


def test_a_per_run_cap_moves_every_partition_in_proportion():
    ranges = [Range("t", 0, 0, 9000), Range("t", 1, 100, 1100), Range("t", 2, 5, 5), Range("t", 3, 0, 3)]
    capped = _capped(ranges, 1000)
    assert [r.size for r in capped] == [899, 99, 0, 1] and sum(r.size for r in capped) <= 1000
    assert all(c.start == r.start for c, r in zip(capped, ranges))


# --- what `pipe compile` refuses ------------------------------------------------------------------


@pytest.mark.parametrize("extra, where, message", [
    ("", "kind", "needs one of `topic` and `topic_pattern`"),
    ("topic: a\n                topic_pattern: 'a.*'", "topic", "needs one of `topic` and `topic_pattern`, not both"),
    ("topic: 'orders; drop'", "topic", "is not a Kafka topic name"),
    ("topic_pattern: 'orders(['", "topic_pattern", "is not a regular expression"),
    ("topic: a\n                properties: {group.id: mine}", "properties", "property group.id of source 'k' is pipe's to set"),
    ("topic: a\n                starting_offsets: latest", "starting_offsets", "starting_offsets: latest of source 'k' needs a declared `schema`"),
    ("topic: a\n                schema: 'amount INT, _kafka_offset BIGINT'", "schema", "declares _kafka_offset, a column pipe adds to every message"),
    ("topic: a\n                on_checkpoint_lost: latest", "on_checkpoint_lost", "on_checkpoint_lost: latest of source 'k' needs a declared `schema`"),
])
def test_compile_refuses_a_kafka_source_that_cannot_work(project, extra, where, message):
    root = project({
        "sources/k.yml": f"""
            sources:
              k:
                kind: kafka
                bootstrap_servers: 127.0.0.1:9092
                format: json
                {extra}
            """,
        "tables/t.sql": "select * from {{ source('k') }}",
    })
    [d] = compile_errors(root)
    assert message in d.message and d.location.file == "sources/k.yml", (d.location, d.message)


def test_compile_knows_the_columns_of_a_declared_kafka_source(project):
    root = project({
        "sources/k.yml": """
            sources:
              k:
                kind: kafka
                bootstrap_servers: 127.0.0.1:9092
                topic: payments
                format: json
                schema: "merchant STRING, amount DECIMAL(12,2)"
            """,
        "tables/t.sql": "select merchant, amount, _kafka_offset, _kafka_partitoin from {{ source('k') }}",
    })
    [d] = compile_errors(root)
    assert "unknown column '_kafka_partitoin'" in d.message and "did you mean '_kafka_partition'?" in d.hint, (d.message, d.hint)


# --- against the broker -----------------------------------------------------------------------------


def payment(i: int, version: int) -> dict:
    """A payment as a producer writes it: epoch millis, a decimal as a string, nulls, accents."""
    return {"merchant": MERCHANTS[i % len(MERCHANTS)], "txn_ref": f"T-{i:06d}", "updated_ms": BASE_MS + version * 60_000 + i,
            "amount": f"{(i * 37 % 100000) / 100:.2f}", "note": None if i % 7 == 0 else f"v{version} – {i}",
            "day": (dt.date(2024, 11, 1) + dt.timedelta(days=i % 5)).isoformat()}


def kafka_project(tmp_path: Path, broker, topic: str, name: str = "p", **source) -> Path:
    import yaml

    src = {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic, "format": "json",
           "schema": "merchant STRING, txn_ref STRING, updated_ms BIGINT, amount DECIMAL(12,2), note STRING, day DATE", **source}
    if "topic_pattern" in source:
        del src["topic"]
    if src["schema"] is None:  # inferred from the messages
        del src["schema"]
    return write_project(tmp_path / name, {
        "pipe_project.yml": PROJECT_YML,
        "sources/kafka.yml": yaml.safe_dump({"sources": {"payments_topic": src}}, sort_keys=False),
        "tables/payments.yml": """
            tables:
              payments:
                key: [merchant, txn_ref]
                precombine: updated_ms
                partition_by: [day]
                type: merge_on_read
            """,
        "tables/payments.sql": "select merchant, txn_ref, updated_ms, amount, note, day, _kafka_partition, _kafka_offset "
                               "from {{ source('payments_topic') }}\n",
    })


def as_row(p: dict) -> tuple:
    return (p["merchant"], p["txn_ref"], p["updated_ms"], decimal.Decimal(p["amount"]), p["note"], dt.date.fromisoformat(p["day"]))


COLUMNS = ["merchant", "txn_ref", "updated_ms", "amount", "note", "day"]


def send(broker, topic: str, payments: list[dict]) -> None:
    broker.produce(topic, [(f"{p['merchant']}|{p['txn_ref']}", json.dumps(p, ensure_ascii=False)) for p in payments])


def checkpoints(capsys, root: Path, table: str = "payments") -> list[str]:
    return [c["checkpoints"]["payments_topic"] for c in commits(timeline(capsys, root, table))]


def end_offsets(broker, topic: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import TopicPartition

    consumer = __import__("confluent_kafka").Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t"})
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        return {(topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        consumer.close()


def test_six_rounds_of_payments_over_six_partitions_equal_the_model_each_round(spark, tmp_path, capsys, kafka):
    """Inserts, updates of keys many times within one batch, late events with older ordering
    values: after every round the table equals the latest version of each key, read by pipe and
    by hudi-rs, and the commit holds the end offsets the run read up to."""
    kafka.create_topic("payments.rounds", partitions=6)
    root = kafka_project(tmp_path, kafka, "payments.rounds")
    rng = random.Random(40)
    model: dict[tuple[str, str], dict] = {}
    for round_no in range(6):
        batch = [payment(i, round_no) for i in range(round_no * 300, round_no * 300 + 400)]  # 100 keys of the last round again
        batch += [payment(rng.randrange(0, round_no * 300 + 400), round_no) for _ in range(200)]  # updates, some twice in the batch
        late = [payment(i, round_no - 1) for i in rng.sample(range(round_no * 300 + 400), 50)] if round_no else []
        rng.shuffle(batch)
        send(kafka, "payments.rounds", batch + late)
        for p in batch + late:
            key = (p["merchant"], p["txn_ref"])
            if key not in model or p["updated_ms"] >= model[key]["updated_ms"]:
                model[key] = p
        run_ok(capsys, root)
        assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in model.values()])
        source = steps(root)["table.payments"]["inputs"]["payments_topic"]
        assert source["rows"] == len(batch) + len(late)
        assert parse_checkpoint(checkpoints(capsys, root)[-1], "s") == end_offsets(kafka, "payments.rounds")
    assert len(model) > 1800
    # nothing new: no commit, the checkpoint stays
    before = checkpoints(capsys, root)
    run_ok(capsys, root)
    assert steps(root)["table.payments"]["state"] == "no_input"
    assert checkpoints(capsys, root) == before
    # a rebuild would read only what retention left: --full-refresh does not apply, and says so
    run_ok(capsys, root, "--full-refresh")
    step = steps(root)["table.payments"]
    assert step["state"] == "no_input" and "--full-refresh does not apply (it reads a Kafka topic" in step["message"], step
    assert checkpoints(capsys, root) == before
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in model.values()])


def test_a_backlog_is_read_in_several_commits_each_message_once(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.backlog", partitions=3)
    rows = [payment(i, 0) for i in range(5000)]
    send(kafka, "payments.backlog", rows)
    root = kafka_project(tmp_path, kafka, "payments.backlog", max_records_per_run=2000)
    runs = 0
    while True:
        run_ok(capsys, root)
        runs += 1
        if steps(root)["table.payments"]["state"] == "no_input":
            break
        detail = steps(root)["table.payments"]["inputs"]["payments_topic"]["detail"]
        assert steps(root)["table.payments"]["inputs"]["payments_topic"]["rows"] <= 2001, detail
    assert runs == 4, runs  # 2000 + 2000 + 1000, then nothing new
    assert len(checkpoints(capsys, root)) == 3
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in rows])


def test_a_new_partition_and_a_new_topic_of_the_pattern_are_read_from_their_start(spark, tmp_path, capsys, kafka):
    kafka.create_topic("shop.eu.payments", partitions=2)
    root = kafka_project(tmp_path, kafka, "", topic_pattern=r"shop\.[a-z]+\.payments")
    first = [payment(i, 0) for i in range(300)]
    send(kafka, "shop.eu.payments", first)
    run_ok(capsys, root)
    assert steps(root)["source.payments_topic"]["message"].startswith("1 topic (shop.eu.payments), 2 partitions")
    kafka.add_partitions("shop.eu.payments", 4)
    kafka.create_topic("shop.us.payments", partitions=1)
    kafka.create_topic("shop.eu.refunds", partitions=1)  # does not match
    later = [payment(i, 1) for i in range(300, 700)]
    kafka.produce("shop.eu.payments", [(None, json.dumps(p)) for p in later[:100]], partition=3)
    send(kafka, "shop.us.payments", later[100:])
    send(kafka, "shop.eu.refunds", [payment(9999, 0)])
    run_ok(capsys, root)
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in first + later])
    stored = parse_checkpoint(checkpoints(capsys, root)[-1], "s")
    assert stored == {**end_offsets(kafka, "shop.eu.payments"), **end_offsets(kafka, "shop.us.payments")}


def test_offsets_no_longer_in_the_topic_fail_by_default_and_go_on_when_told(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.retention", partitions=1)
    send(kafka, "payments.retention", [payment(i, 0) for i in range(100)])
    root = kafka_project(tmp_path, kafka, "payments.retention")
    run_ok(capsys, root)
    send(kafka, "payments.retention", [payment(i, 1) for i in range(100, 200)])
    kafka.delete_records("payments.retention", 0, 150)  # messages 100..149 never reached the table
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    message = steps(root)["table.payments"]["message"]
    assert ("topic payments.retention partition 0: the stored offset 100 is no longer in the topic, whose offsets are now 150 to 200"
            in message), message
    assert "on_checkpoint_lost: earliest" in out + err
    assert len(checkpoints(capsys, root)) == 1, "nothing was committed"

    (root / "sources/kafka.yml").write_text((root / "sources/kafka.yml").read_text() + "    on_checkpoint_lost: earliest\n")
    run_ok(capsys, root)
    detail = steps(root)["table.payments"]["inputs"]["payments_topic"]["detail"]
    assert "went on from offset 150 (on_checkpoint_lost: earliest)" in detail, detail
    assert_rows(spark, root, "payments", COLUMNS, [as_row(payment(i, 0)) for i in range(100)] + [as_row(payment(i, 1)) for i in range(150, 200)])


def test_a_bad_message_stops_the_step_naming_topic_partition_and_offset_or_is_dropped(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.bad", partitions=1)
    good = [payment(i, 0) for i in range(50)]
    messages = [(None, json.dumps(p)) for p in good[:20]] + [(None, "not json {")] \
        + [(None, json.dumps({**good[20], "amount": "twelve"}))] + [("k", None)] + [(None, json.dumps(p)) for p in good[21:]]
    kafka.produce("payments.bad", messages)
    root = kafka_project(tmp_path, kafka, "payments.bad")
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    message = steps(root)["table.payments"]["message"]
    assert "topic payments.bad partition 0 offset 20: not a valid JSON object: not json {" in message, message
    assert 'topic payments.bad partition 0 offset 21: column amount: "twelve" is not a DECIMAL(12,2)' in message, message
    assert not (root / "lake/payments/.hoodie").exists() or not checkpoints(capsys, root)

    (root / "sources/kafka.yml").write_text((root / "sources/kafka.yml").read_text() + "    on_bad_record: drop\n")
    run_ok(capsys, root)
    source = steps(root)["table.payments"]["inputs"]["payments_topic"]
    assert source["bad_records_dropped"] == 2 and source["tombstones"] == 1, source
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in good[:20] + good[21:]])


def test_a_rollback_rewinds_the_offsets_with_the_table(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.rollback", partitions=2)
    send(kafka, "payments.rollback", [payment(i, 0) for i in range(200)])
    root = kafka_project(tmp_path, kafka, "payments.rollback")
    run_ok(capsys, root)
    send(kafka, "payments.rollback", [payment(i, 1) for i in range(100, 300)])
    run_ok(capsys, root)
    first, second = checkpoints(capsys, root)
    latest = commits(timeline(capsys, root, "payments"))[-1]["instant"]
    code, out, err = pipe(capsys, root, "rollback", "payments", latest)
    assert code == 0, out + err
    assert checkpoints(capsys, root) == [first]
    assert_rows(spark, root, "payments", COLUMNS, [as_row(payment(i, 0)) for i in range(200)])
    run_ok(capsys, root)  # reads the rolled-back range again
    assert checkpoints(capsys, root)[-1] == second
    assert_rows(spark, root, "payments", COLUMNS, [as_row(payment(i, 0)) for i in range(100)] + [as_row(payment(i, 1)) for i in range(100, 300)])


def test_credentials_in_properties_reach_no_output_plan_or_commit(spark, tmp_path, capsys, kafka, monkeypatch):
    secret = "kafka-Secr3t/pa55+wörd"
    monkeypatch.setenv("KAFKA_PASSWORD", secret)
    kafka.create_topic("payments.secret", partitions=1)
    send(kafka, "payments.secret", [payment(i, 0) for i in range(10)])
    root = kafka_project(tmp_path, kafka, "payments.secret",
                         properties={"sasl.username": "pipe", "sasl.password": "{{ env_var('KAFKA_PASSWORD') }}"})
    out, err = run_ok(capsys, root)
    assert secret not in out + err
    for path in [*(root / "target").rglob("*"), *(root / "lake").rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert "${env:KAFKA_PASSWORD}" in (root / "target/plan.json").read_text()
    assert run_results(root)["success"] is True


# --- crashes and broker restarts: nothing lost, nothing twice ---------------------------------------


def log_project(tmp_path: Path, broker, topic: str, name: str = "log") -> Path:
    """An append-only table (no key: a message read twice would show as a second row)."""
    import yaml

    src = {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic, "format": "json",
           "schema": "merchant STRING, txn_ref STRING, updated_ms BIGINT, amount DECIMAL(12,2), note STRING, day DATE",
           "max_records_per_run": 20_000}
    return write_project(tmp_path / name, {
        "pipe_project.yml": PROJECT_YML,
        "sources/kafka.yml": yaml.safe_dump({"sources": {"payments_topic": src}}, sort_keys=False),
        "tables/payment_log.sql": "select txn_ref, updated_ms, amount, _kafka_partition, _kafka_offset from {{ source('payments_topic') }}\n",
    })


def _pipe_process(root: Path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "pipe", "--project-dir", str(root), "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)


def _python_workers(session: int) -> list[int]:
    """The Spark Python workers (pyspark's daemon or pipe's, and their forks) in a process session."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) != session:
                    continue
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "daemon" in cmdline and ("pyspark" in cmdline or "worker_daemon" in cmdline):
                found.append(int(entry.name))
    return found


def kill_runs(root: Path, rng: random.Random, earliest_s: float, latest_s: float, times: int = 3) -> int:
    """Starts `pipe run` `times` times, each killed with SIGKILL (its whole process group) after
    a random wait: Spark's start, the offsets, the read, the writes, the commits, anywhere; how
    many were killed before they ended."""
    import os
    import signal
    import time

    killed = 0
    for _ in range(times):
        proc = _pipe_process(root)
        time.sleep(rng.uniform(earliest_s, latest_s))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait()
    return killed


def _log_rows(root: Path) -> list[tuple]:
    from tests.test_run import hudi_rows

    return hudi_rows(root, "payment_log", ["_kafka_partition", "_kafka_offset", "txn_ref"])


def test_kill_9_of_pipe_run_at_random_moments_loses_and_repeats_no_message(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.kill", partitions=4)
    sent = [payment(i, 0) for i in range(60_000)]
    send(kafka, "payments.kill", sent)
    root = log_project(tmp_path, kafka, "payments.kill")
    assert kill_runs(root, random.Random(9), 4, 18) >= 2, "most runs were killed before they ended"
    while True:  # the runs a user starts after the crashes
        run_ok(capsys, root)
        if steps(root)["table.payment_log"]["state"] == "no_input":
            break
    rows = _log_rows(root)
    assert len(rows) == len(sent), "every message exactly once"
    assert len(set((p, o) for p, o, _ in rows)) == len(rows)
    assert sorted(t for _, _, t in rows) == sorted(p["txn_ref"] for p in sent)
    assert parse_checkpoint(checkpoints(capsys, root, "payment_log")[-1], "s") == end_offsets(kafka, "payments.kill")


def test_a_broker_restart_in_the_middle_of_a_run_loses_and_repeats_no_message(spark, tmp_path, capsys, kafka):
    import threading
    import time

    kafka.create_topic("payments.restart", partitions=3)
    sent = [payment(i, 0) for i in range(40_000)]
    send(kafka, "payments.restart", sent)
    root = log_project(tmp_path, kafka, "payments.restart")
    proc = _pipe_process(root)

    def restart_while_reading() -> None:
        """Restarts the broker once the run's Python workers run: the first Python tasks of the
        run are the ones reading the partitions."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if _python_workers(proc.pid):
                kafka.restart()
                restarted.append(time.monotonic())
                return
            time.sleep(0.05)

    restarted: list[float] = []
    restarter = threading.Thread(target=restart_while_reading)
    restarter.start()
    out, _ = proc.communicate(timeout=600)
    restarter.join()
    assert restarted, f"the run ended before it read:\n{out}"
    # the run either succeeded or failed cleanly, naming the brokers; nothing half-written either way
    assert proc.returncode in (0, 1), out
    assert "Traceback" not in out, out
    if proc.returncode == 1:
        assert "brokers at" in out, out
    while True:
        run_ok(capsys, root)
        if steps(root)["table.payment_log"]["state"] == "no_input":
            break
    rows = _log_rows(root)
    assert len(rows) == len(sent) and len(set((p, o) for p, o, _ in rows)) == len(rows)


def test_dry_run_says_how_many_messages_wait_and_reads_none(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.dry", partitions=2)
    send(kafka, "payments.dry", [payment(i, 0) for i in range(120)])
    root = kafka_project(tmp_path, kafka, "payments.dry")
    code, out, err = pipe(capsys, root, "run", "--dry-run")
    assert code == 0, out + err
    assert "120 new messages in 2 of 2 partitions of payments.dry" in steps(root)["table.payments"]["message"]
    assert not (root / "lake/payments").exists()


def test_unreachable_brokers_are_one_clear_error(spark, tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    broker = type("Nowhere", (), {"bootstrap": f"127.0.0.1:{port}"})()
    root = kafka_project(tmp_path, broker, "payments", fetch_timeout_s=5)
    code, out, err = pipe(capsys, root, "run")
    assert code == 1
    assert "Traceback" not in out + err and "%3|" not in out + err, out + err  # no librdkafka log lines either
    message = steps(root)["source.payments_topic"]["message"]
    assert f"source payments_topic: cannot list the topics from the brokers at 127.0.0.1:{port}" in message, message
    assert "check `bootstrap_servers`" in out + err


def test_a_first_run_at_the_latest_offsets_records_where_it_starts_and_reads_what_follows(spark, tmp_path, capsys, kafka):
    kafka.create_topic("payments.latest", partitions=2)
    send(kafka, "payments.latest", [payment(i, 0) for i in range(100)])  # before the table: never read
    root = kafka_project(tmp_path, kafka, "payments.latest", starting_offsets="latest")
    run_ok(capsys, root)
    assert "the offsets to start from are recorded" in steps(root)["table.payments"]["inputs"]["payments_topic"]["detail"]
    assert_rows(spark, root, "payments", COLUMNS, [])
    assert parse_checkpoint(checkpoints(capsys, root)[-1], "s") == end_offsets(kafka, "payments.latest")
    send(kafka, "payments.latest", [payment(i, 1) for i in range(100, 150)])
    run_ok(capsys, root)
    assert_rows(spark, root, "payments", COLUMNS, [as_row(payment(i, 1)) for i in range(100, 150)])


def test_a_time_sample_reads_the_messages_produced_since_and_consumes_nothing(spark, tmp_path, capsys, kafka):
    """`--sample '2 days'` (docs/dev-loop.md) starts each partition at the first message produced
    in the last 2 days (by its timestamp); the commit moves no offset, and the next run rebuilds
    the table from the whole topic."""
    import time

    kafka.create_topic("payments.sampled", partitions=3)
    five_days_ago = int((time.time() - 5 * 86400) * 1000)  # within the topic's 7-day retention
    send_at = lambda payments, ms: kafka.produce("payments.sampled", [(f"{p['merchant']}|{p['txn_ref']}", json.dumps(p, ensure_ascii=False))
                                                                       for p in payments], timestamp_ms=ms)  # noqa: E731
    old, new = [payment(i, 0) for i in range(300)], [payment(i, 1) for i in range(300, 420)]
    send_at(old, five_days_ago)
    send(kafka, "payments.sampled", new)
    root = kafka_project(tmp_path, kafka, "payments.sampled")
    code, out, err = pipe(capsys, root, "run", "--sample", "2 days")
    assert code == 0, out + err
    assert "built from a sample (2 days)" in out + err
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in new])
    assert commits(timeline(capsys, root, "payments"))[-1]["checkpoints"] == {}  # no offset moved
    run_ok(capsys, root)  # a real run: the whole topic, from its start
    assert "rebuilt (its last build was a --sample '2 days' build)" in steps(root)["table.payments"]["message"]
    assert_rows(spark, root, "payments", COLUMNS, [as_row(p) for p in old + new])
    # a built table that reads a topic is not sampled: a rebuild from part of a topic could not be undone
    code, out, err = pipe(capsys, root, "run", "--sample", "1 days")
    assert code == 1 and "reads a Kafka topic: --sample would rebuild it from part of the topic" in out + err
