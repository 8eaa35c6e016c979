"""`kind: jdbc` sources against a real PostgreSQL (fixture `postgres`, tests/postgres/env.py): the
JDBC driver fetched by Spark from Maven Central when `pipe run` starts Spark (a subprocess, as
users run it), the high-water mark in the commit, reads split over a column, late commits
caught by the lookback, the tables read back with hudi-rs and compared with the database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, compile_errors, write_project
from tests.test_run import PROJECT_YML, hudi_rows, pipe, timeline

pytestmark = [pytest.mark.cdc, pytest.mark.spark]

COLUMNS = ["id", "name", "balance", "updated_at"]


@pytest.fixture
def database(pg_database):
    return pg_database


def jdbc_project(tmp_path: Path, postgres, database: str, **source) -> Path:
    import yaml

    src = {"kind": "jdbc", "url": f"jdbc:postgresql://{postgres.host}:{postgres.port}/{database}", "dbtable": "public.customers",
           "user": postgres.user, "password": "{{ env_var('SHOP_DB_PASSWORD') }}", "incremental_column": "updated_at",
           "lookback": 60, "partition_column": "id", "num_partitions": 3, **source}
    src = {k: v for k, v in src.items() if v is not None}
    return write_project(tmp_path / "p", {
        "pipe_project.yml": PROJECT_YML,
        "sources/db.yml": yaml.safe_dump({"sources": {"shop_db": src}}, sort_keys=False),
        "tables/customers.yml": "tables:\n  customers:\n    key: [id]\n    precombine: updated_at\n",
        "tables/customers.sql": "select id, name, balance, updated_at from {{ source('shop_db') }}\n",
    })


def run(root: Path, postgres, *args: str) -> subprocess.CompletedProcess:
    """`pipe run` in a process of its own: Spark starts there with the JDBC driver's package."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SHOP_DB_PASSWORD": postgres.password}
    done = subprocess.run([sys.executable, "-m", "pipe", "--project-dir", str(root), "run", *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def steps(root: Path) -> dict:
    return {s["id"]: s for s in json.loads((root / "target/run_results.json").read_text())["steps"]}


def db_rows(postgres, database: str) -> list[tuple]:
    return sorted(postgres.query(f"SELECT {', '.join(COLUMNS)} FROM customers", database=database))


def test_a_table_is_read_incrementally_by_its_high_water_mark_split_over_a_column(tmp_path, capsys, postgres, database):
    pg = lambda sql, params=None: postgres.execute(sql, params, database=database)  # noqa: E731
    pg("""CREATE TABLE customers (id bigint PRIMARY KEY, name text, balance numeric(12,2), updated_at timestamptz NOT NULL);
          INSERT INTO customers SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE 'Zoë ''' || i || ''' "x"' END, (i * 37 % 100000) / 100.0,
                 timestamptz '2024-06-01 00:00:00+00' + i * interval '1 second' FROM generate_series(1, 3000) i""")
    root = jdbc_project(tmp_path, postgres, database)
    first = run(root, postgres)
    assert postgres.password not in first.stdout + first.stderr
    assert hudi_rows(root, "customers", COLUMNS) == db_rows(postgres, database)
    step = steps(root)["table.customers"]
    mark = json.loads(step["inputs"]["shop_db"]["checkpoint"])
    assert mark == {"column": "updated_at", "type": "timestamp", "max": "2024-06-01 00:50:00.000000+00:00"}, mark

    # updates and inserts past the mark, and a late commit 30 s below it (inside the 60 s lookback)
    pg("UPDATE customers SET balance = balance + 0.01, updated_at = timestamptz '2024-06-01 01:00:00.123456+00' WHERE id % 100 = 0")
    pg("INSERT INTO customers SELECT i, 'new', 1.50, timestamptz '2024-06-01 01:00:01+00' FROM generate_series(3001, 3100) i")
    pg("INSERT INTO customers VALUES (5000, 'late', 9.99, timestamptz '2024-06-01 00:59:31+00')")
    run(root, postgres)
    assert hudi_rows(root, "customers", COLUMNS) == db_rows(postgres, database)
    read = steps(root)["table.customers"]["inputs"]["shop_db"]
    assert read["new"] == 30 + 100 + 1 + 60, read  # past the mark, the late row, and the 60 s below the mark read again
    assert json.loads(read["checkpoint"])["max"] == "2024-06-01 01:00:01.000000+00:00"

    # nothing past the mark: no commit
    commits = len(timeline(capsys, root, "customers"))
    run(root, postgres)
    assert steps(root)["table.customers"]["state"] == "no_input"
    assert len(timeline(capsys, root, "customers")) == commits
    # --full-refresh reads the whole table again
    pg("DELETE FROM customers WHERE id = 7")
    run(root, postgres, "--full-refresh")
    assert steps(root)["table.customers"]["inputs"]["shop_db"]["new"] == 3100
    assert hudi_rows(root, "customers", COLUMNS) == db_rows(postgres, database)
    for path in [root / "target/run_results.json", root / "target/plan.json", *(root / "lake/customers/.hoodie").rglob("*")]:
        if path.is_file():
            assert postgres.password.encode() not in path.read_bytes(), path


def test_without_the_driver_on_spark_the_error_names_the_setting(spark, tmp_path, capsys, postgres, database):
    """The tests' own Spark started without the driver: the run says which package to add."""
    postgres.execute("CREATE TABLE customers (id bigint PRIMARY KEY, name text, balance numeric(12,2), updated_at timestamptz)",
                     database=database)
    root = jdbc_project(tmp_path, postgres, database)
    os.environ["SHOP_DB_PASSWORD"] = postgres.password
    try:
        code, out, err = pipe(capsys, root, "run")
    finally:
        del os.environ["SHOP_DB_PASSWORD"]
    assert code == 1 and "Traceback" not in out + err
    assert "source shop_db: Spark has no JDBC driver for postgresql" in out + err, out + err
    assert "spark.jars.packages: org.postgresql:postgresql:" in out + err


@pytest.mark.parametrize("extra, message", [
    ({"query": "select 1"}, "needs one of `dbtable` and `query`, not both"),
    ({"password": "hunter2"}, "the password of source 'shop_db' is written in the project"),
    ({"url": "postgresql://db/shop"}, "is not a JDBC URL"),
    ({"url": "jdbc:mysql://app:s3cret@db:3306/shop"}, "the url of source 'shop_db' holds a password"),
    ({"url": "jdbc:oracle:thin:scott/tiger@//db:1521/shop"}, "the url of source 'shop_db' holds a password"),
    ({"url": "jdbc:sqlserver://db:1433;databaseName=shop;password=x"}, "the url of source 'shop_db' holds a password"),
    ({"properties": {"dbtable": "x"}}, "property dbtable of source 'shop_db' is pipe's to set"),
])
def test_compile_refuses_a_jdbc_source_that_cannot_work(tmp_path, extra, message):
    import yaml

    src = {"kind": "jdbc", "url": "jdbc:postgresql://db:5432/shop", "dbtable": "public.customers", **extra}
    root = write_project(tmp_path / "p", {"sources/db.yml": yaml.safe_dump({"sources": {"shop_db": src}}),
                                          "tables/t.sql": "select * from {{ source('shop_db') }}"})
    diags = compile_errors(root)
    assert any(message in d.message for d in diags), [d.message for d in diags]


def test_a_query_without_incremental_column_is_read_whole_every_run(tmp_path, postgres, database):
    pg = lambda sql: postgres.execute(sql, database=database)  # noqa: E731
    pg("""CREATE TABLE customers (id bigint PRIMARY KEY, name text, balance numeric(12,2), updated_at timestamp NOT NULL);
          INSERT INTO customers SELECT i, 'c' || i, i, timestamp '2024-06-01 00:00:00' + i * interval '1 minute'
          FROM generate_series(1, 200) i""")
    root = jdbc_project(tmp_path, postgres, database, dbtable=None, incremental_column=None, lookback=0,
                        query="select id, name, balance, updated_at from customers where id % 2 = 0")
    run(root, postgres)
    assert hudi_rows(root, "customers", ["id"]) == [(i,) for i in range(2, 201, 2)]
    pg("UPDATE customers SET name = 'renamed' WHERE id = 4; INSERT INTO customers VALUES (1000, 'new', 1, now())")
    run(root, postgres)  # the second run reads the whole result again
    assert steps(root)["table.customers"]["inputs"]["shop_db"]["new"] == 101
    assert (4, "renamed") in hudi_rows(root, "customers", ["id", "name"]) and (1000,) in hudi_rows(root, "customers", ["id"])
