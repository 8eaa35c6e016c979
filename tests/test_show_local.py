"""`pipe show` of a table on a local disk reads it in-process with pyarrow, without Spark, and
gives the rows Spark's reader gives: copy-on-write and merge-on-read (log files with updates,
deletes and a partition move), latest, --as-of, --since, --limit, --meta, --output json."""

from __future__ import annotations

import json
import subprocess
import sys

from runtime.table.table import Table
from tests.conftest import REPO
from tests.test_run import commits, pipe, project, run_ok, timeline, write_jsonl

SOURCE = """
    sources:
      s:
        kind: files
        path: data/s
        format: json
        schema: "id BIGINT, region STRING, amount DECIMAL(10,2), day DATE, ts TIMESTAMP, score DOUBLE, status STRING"
    """
TABLES = """
    tables:
      cow:
        key: [id]
        precombine: ts
        partition_by: [region]
        delete_when: "status = 'cancelled'"
      mor:
        key: [id]
        precombine: ts
        partition_by: [region]
        delete_when: "status = 'cancelled'"
        type: merge_on_read
    """
SQL = "select id, region, amount, day, ts, score, status from {{ source('s') }}\n"


def _row(i, region, ts, status="placed", amount="1.50"):
    return {"id": i, "region": region, "amount": amount, "day": "2024-03-01", "ts": f"2024-03-01T{ts}:00Z", "score": i / 3,
            "status": status}


def _spark_rows(spark, root, table, keys: bool, as_of=None, since=None, meta=False, limit=None):
    """The rows of Spark's reader, as `pipe show --output json` prints them."""
    df = Table.open(spark, str(root / "lake" / table)).read(as_of=as_of, since=since, until=as_of if since else None, meta=meta)
    if keys:
        df = df.orderBy("id")
    if limit is not None:
        df = df.limit(limit)
    return [json.loads(json.dumps(r.asDict(), sort_keys=True, default=str)) for r in df.collect()]


def test_show_reads_local_tables_without_spark_and_gives_sparks_rows(spark, tmp_path, capsys):
    root = project(tmp_path, {"sources/s.yml": SOURCE, "tables/t.yml": TABLES, "tables/cow.sql": SQL, "tables/mor.sql": SQL})
    write_jsonl(root / "data/s/s-1.json", [_row(i, "EU" if i % 2 else "US", "08:00") for i in range(1, 7)])
    run_ok(capsys, root)
    # updates (log files on merge-on-read), a delete, a partition move, a late (ignored) update
    write_jsonl(root / "data/s/s-2.json", [_row(1, "EU", "09:00", amount="2.25"), _row(2, "US", "09:00", status="cancelled"),
                                           _row(3, "US", "09:00"), _row(4, "US", "07:00", amount="99.00"), _row(7, "APAC", "09:00")])
    run_ok(capsys, root)
    write_jsonl(root / "data/s/s-3.json", [_row(5, "EU", "10:00", status="cancelled"), _row(6, "US", "10:00", amount="3.00")])
    run_ok(capsys, root)
    mor_logs = [p for p in (root / "lake/mor").rglob(".*.log.*")]
    assert mor_logs, "the merge-on-read table has log files to merge"

    def show(table, *args):
        code, out, err = pipe(capsys, root, "show", table, "--output", "json", *args)
        assert code == 0, err
        return [json.loads(line) for line in out.splitlines()]

    for table in ("cow", "mor"):
        i1, i2, i3 = [c["instant"] for c in commits(timeline(capsys, root, table))]
        latest = show(table)
        assert [r["id"] for r in latest] == [1, 3, 4, 6, 7], table
        assert latest == _spark_rows(spark, root, table, keys=True), table
        assert latest[0] == {"id": 1, "region": "EU", "amount": "2.25", "day": "2024-03-01", "ts": "2024-03-01 09:00:00",
                             "score": 1 / 3, "status": "placed"}
        for instant in (i1, i2):
            assert show(table, "--as-of", instant) == _spark_rows(spark, root, table, keys=True, as_of=instant), (table, instant)
        assert show(table, "--meta") == _spark_rows(spark, root, table, keys=True, meta=True), table
        assert show(table, "--limit", "2") == _spark_rows(spark, root, table, keys=True, limit=2), table
        by_id = lambda rows: sorted(rows, key=lambda r: r["id"])  # noqa: E731 - an incremental read has no order
        for since, as_of in ((i1, None), (i2, None), (i1, i2), (i3, None)):
            args = ("--since", since) + (("--as-of", as_of) if as_of else ())
            assert by_id(show(table, *args)) == by_id(_spark_rows(spark, root, table, keys=False, since=since, as_of=as_of)), (table, args)
        assert len(show(table, "--since", i1, "--limit", "1")) == 1

    code, out, err = pipe(capsys, root, "show", "mor", "--limit", "2")
    assert code == 0 and "2024-03-01 09:00:00" in out and "2 rows of mor (latest), more not shown (--limit)" in out, out + err

    code, out, err = pipe(capsys, root, "timeline", "mor")  # ends its output with a newline
    assert code == 0 and out.endswith("\n") and out.count("deltacommit") == 3, out


def test_show_starts_no_spark(tmp_path, spark, capsys):
    """In a fresh process: `pipe show` and `pipe timeline` of a local table print its rows and
    instants and never import pyspark."""
    root = project(tmp_path, {"sources/s.yml": SOURCE, "tables/t.yml": TABLES, "tables/cow.sql": SQL, "tables/mor.sql": SQL})
    write_jsonl(root / "data/s/s-1.json", [_row(1, "EU", "08:00")])
    run_ok(capsys, root, "--select", "+mor")
    code = ("import sys\nfrom pipe.cli import main\n"
            f"rc = main(['show', 'mor', '--project-dir', {str(root)!r}])\n"
            f"rc = rc or main(['timeline', 'mor', '--project-dir', {str(root)!r}])\n"
            "assert 'pyspark' not in sys.modules, 'pyspark was imported'\nsys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "2024-03-01 08:00:00" in done.stdout and "1 row of mor (latest)" in done.stdout
    assert "deltacommit" in done.stdout and done.stdout.endswith("\n")


def test_show_of_a_table_whose_first_commit_wrote_no_file_lists_its_columns(spark, tmp_path, capsys):
    root = project(tmp_path, {"sources/s.yml": SOURCE, "tables/t.yml": "tables:\n  t:\n    key: [id]\n",
                              "tables/t.sql": "select id, region, ts from {{ source('s') }} where id > 100\n"})
    write_jsonl(root / "data/s/s-1.json", [_row(1, "EU", "08:00")])
    run_ok(capsys, root)
    assert len(commits(timeline(capsys, root, "t"))) == 1
    code, out, err = pipe(capsys, root, "show", "t")
    assert code == 0, err
    assert out.splitlines()[0].split() == ["id", "region", "ts"] and "0 rows of t (latest)" in out, out


def test_values_read_without_spark_are_the_python_values_of_sparks_collect():
    """pipe.output.spark_value against pyspark's own conversion of the same internal values."""
    import datetime as dt

    import pyarrow as pa
    from pyspark.sql import types as T

    from pipe.output import spark_value

    for micros in (0, 1709280000123456, -1, 253402300799999999):
        aware = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)
        assert spark_value(micros, pa.timestamp("us", "UTC")) == T.TimestampType().fromInternal(micros)
        assert spark_value(micros * 1000, pa.timestamp("ns", "UTC")) == T.TimestampType().fromInternal(micros)
        assert spark_value(aware, pa.timestamp("us", "UTC")) == T.TimestampType().fromInternal(micros)
        assert spark_value(micros, pa.timestamp("us")) == T.TimestampNTZType().fromInternal(micros)
        assert spark_value(aware.replace(tzinfo=None), pa.timestamp("us")) == T.TimestampNTZType().fromInternal(micros)
    assert spark_value(b"\x00a", pa.binary()) == bytearray(b"\x00a")
    assert spark_value([("k", 1)], pa.map_(pa.string(), pa.int64())) == {"k": 1}
    row = spark_value({"a": 1, "b": "x"}, pa.struct([("a", pa.int64()), ("b", pa.string())]))
    assert str(row) == str(T.Row(a=1, b="x")) == "Row(a=1, b='x')" and json.dumps(row) == json.dumps(T.Row(a=1, b="x"))
    assert spark_value([1, None], pa.list_(pa.int64())) == [1, None]
