"""Record keys and partition paths as Hudi's Java key generators write them (keygen.py): the
ComplexKeyGenerator's single-key encoding (HUDI-7001) and the text of timestamp, decimal and
binary values; tables whose stored keys have another text keep it, never two texts at once."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from decimal import Decimal

import hudi
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from runtime.table import Table, TableConfig
from runtime.table.errors import TableError

SCHEMA = "id long, a string, b string, ts long, v string"


def stored(table, *cols):
    return sorted(tuple(r[c] for c in ("_hoodie_record_key", "_hoodie_partition_path", *cols)) for r in table.read().collect())


def hudi_keys(path):
    batches = hudi.HudiTableBuilder.from_base_uri(path).build().read()
    return sorted(r["_hoodie_record_key"] for r in pa.Table.from_batches(batches).to_pylist())


def rewrite_stored(path, column, fn):
    """Rewrites one meta column of every base file: a table as another writer left it."""
    for f in glob.glob(f"{path}/**/*.parquet", recursive=True):
        t = pq.read_table(f)
        i = t.schema.get_field_index(column)
        t = t.set_column(i, column, fn(t))
        pq.write_table(t, f)


def set_properties(path, **changes):
    p = f"{path}/.hoodie/hoodie.properties"
    lines = [ln for ln in open(p).read().splitlines() if ln.split("=", 1)[0] not in changes]
    lines += [f"{k}={v}" for k, v in changes.items() if v is not None]
    open(p, "w").write("\n".join(lines) + "\n")


# --- ComplexKeyGenerator with one key field ----------------------------------------------------


def test_one_key_two_partition_fields_writes_field_prefixed_keys_and_declares_it(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("id",), partition_fields=("a", "b"), precombine_field="ts"))
    props = open(f"{path}/.hoodie/hoodie.properties").read()
    assert "hoodie.table.keygenerator.class=org.apache.hudi.keygen.ComplexKeyGenerator" in props
    assert "hoodie.table.complex.keygen.encoding=FIELD_PREFIXED" in props
    table.write(spark.createDataFrame([(1, "x", "y", 1, "v1")], SCHEMA), "bulk_insert")  # keys made in the write tasks
    table.write(spark.createDataFrame([(2, "x", "y", 1, "v1")], SCHEMA), "upsert")
    table.write(spark.createDataFrame([(1, "x", "y", 2, "v2"), (2, "x", "y", 2, "v2")], SCHEMA), "upsert")
    assert stored(table, "v") == [("id:1", "a=x/b=y", "v2"), ("id:2", "a=x/b=y", "v2")]
    assert hudi_keys(path) == ["id:1", "id:2"]
    assert Table.open(spark, path).config.complex_key_encoding == "FIELD_PREFIXED"


def _java_complex_table(spark, path, prefixed: bool):
    """A table keyed like one Java's ComplexKeyGenerator wrote with one key field and no
    encoding property: `id:1` (0.14.0, or 0.14.2+ by default) or `1` (0.14.1, 0.15.0, 1.0.0-1.0.2)."""
    s = "id long, p string, ts long, v string"
    table = Table.create(spark, path, TableConfig(name="jc", record_key_fields=("id",), partition_fields=("p",), precombine_field="ts"))
    table.write(spark.createDataFrame([(1, "a", 1, "v1"), (2, "a", 1, "v1")], s), "upsert")
    set_properties(path, **{"hoodie.table.keygenerator.class": "org.apache.hudi.keygen.ComplexKeyGenerator"})
    if prefixed:
        rewrite_stored(path, "_hoodie_record_key", lambda t: pc.binary_join_element_wise("id:", t.column("_hoodie_record_key"), ""))
    return Table.open(spark, path), s


@pytest.mark.parametrize("prefixed", [True, False], ids=["id:1", "bare"])
def test_upsert_and_delete_keep_the_single_key_text_the_table_has(spark, tmp_path, prefixed):
    path = str(tmp_path / "t")
    table, s = _java_complex_table(spark, path, prefixed)
    assert "complex.keygen.encoding" not in open(f"{path}/.hoodie/hoodie.properties").read()
    table.write(spark.createDataFrame([(1, "a", 2, "v2"), (3, "a", 2, "v2")], s), "upsert")
    table.write(spark.createDataFrame([(2,)], "id long"), "delete")
    k = (lambda i: f"id:{i}") if prefixed else str
    assert stored(table, "id", "v") == [(k(1), "p=a", 1, "v2"), (k(3), "p=a", 3, "v2")]


# --- the text of timestamp, decimal and binary values -----------------------------------------

VALUES = "k timestamp, n timestamp_ntz, d decimal(20,10), bin binary, day date, x double, v string"
ROW_TS = dt.datetime(2024, 1, 1, 10, 0, tzinfo=dt.timezone.utc)


def _rows(spark, v="v1"):
    rows = [
        (ROW_TS, dt.datetime(2024, 1, 1, 10, 0), Decimal("0.0000000001"), b"abc", dt.date(2024, 1, 1), 1e-5, v),
        (ROW_TS + dt.timedelta(microseconds=1), dt.datetime(1969, 12, 31, 23, 59, 59), Decimal("0"), b"\x00\xff", dt.date(2024, 1, 2), 1e10, v),
        (ROW_TS + dt.timedelta(seconds=1), dt.datetime(2024, 1, 1), Decimal("-0.0000000150"), b"/:", dt.date(2024, 1, 3), 0.5, v),
        (ROW_TS + dt.timedelta(seconds=2), dt.datetime(2024, 1, 1), Decimal("1.5"), b"", dt.date(2024, 1, 4), -0.0, v),
    ]
    return spark.createDataFrame(rows, VALUES)


# What Java's key generators write for the rows above (Long.toString of the epoch micros,
# BigDecimal.toString, lower-case hex, LocalDate, Double.toString)
JAVA_KEYS = [
    "k:1704103200000000,n:1704103200000000,d:1E-10",
    "k:1704103200000001,n:-1000000,d:0E-10",
    "k:1704103201000000,n:1704067200000000,d:-1.50E-8",
    "k:1704103202000000,n:1704067200000000,d:1.5000000000",
]
JAVA_PARTITIONS = [
    "bin=616263/day=2024-01-01/x=1.0E-5/d=1E-10",
    "bin=00ff/day=2024-01-02/x=1.0E10/d=0E-10",
    "bin=2f3a/day=2024-01-03/x=0.5/d=-1.50E-8",
    "bin=__HIVE_DEFAULT_PARTITION__/day=2024-01-04/x=-0.0/d=1.5000000000",
]


@pytest.mark.parametrize("operation, zone", [("upsert", "America/Los_Angeles"), ("bulk_insert", "UTC")])
def test_keys_and_partition_paths_of_timestamps_decimals_and_binary_are_javas(spark, tmp_path, zone, operation):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k", "n", "d"), partition_fields=("bin", "day", "x", "d")))
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        table.write(_rows(spark), operation)
        table.write(_rows(spark, "v2"), "upsert")  # the same keys again: updates, in place
        got = stored(table, "v")
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert [(k, p) for k, p, _ in got] == sorted(zip(JAVA_KEYS, JAVA_PARTITIONS))
    assert {v for *_, v in got} == {"v2"}
    assert sorted(os.listdir(f"{path}/bin=616263/day=2024-01-01/x=1.0E-5")) == ["d=1E-10"]


def test_single_timestamp_key_and_partition_are_epoch_micros(spark, tmp_path):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("k",)))
    table.write(spark.createDataFrame([(ROW_TS, "x")], "k timestamp, v string"), "upsert")
    assert stored(table) == [("1704103200000000", "k=1704103200000000")]
    assert hudi_keys(path) == ["1704103200000000"]


def test_a_table_with_pipes_former_timestamp_text_keeps_it(spark, tmp_path):
    """Tables pipe wrote before took Spark's cast to string; their keys stay as they are."""
    path = str(tmp_path / "t")
    s = "k timestamp, p string, v string"
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("p",)))
    table.write(spark.createDataFrame([(ROW_TS, "a", "v1")], s), "upsert")
    rewrite_stored(path, "_hoodie_record_key", lambda t: pa.array(["2024-01-01 10:00:00"]))
    table = Table.open(spark, path)
    table.write(spark.createDataFrame([(ROW_TS, "a", "v2"), (ROW_TS + dt.timedelta(hours=1), "a", "v2")], s), "upsert")
    assert stored(table, "v") == [("2024-01-01 10:00:00", "p=a", "v2"), ("2024-01-01 11:00:00", "p=a", "v2")]


def test_a_table_whose_key_text_pipe_cannot_make_is_refused(spark, tmp_path):
    path = str(tmp_path / "t")
    s = "k timestamp, p string, v string"
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=("k",), partition_fields=("p",)))
    table.write(spark.createDataFrame([(ROW_TS, "a", "v1")], s), "upsert")
    # Java with consistent.logical.timestamp.enabled, in a JVM west of UTC: java.sql.Timestamp text
    rewrite_stored(path, "_hoodie_record_key", lambda t: pa.array(["2024-01-01 02:00:00.0"]))
    table = Table.open(spark, path)
    instants = sorted(os.listdir(f"{path}/.hoodie"))
    with pytest.raises(TableError) as info:
        table.write(spark.createDataFrame([(ROW_TS, "a", "v2")], s), "upsert")
    assert "2024-01-01 02:00:00.0" in str(info.value) and "table t" in str(info.value)
    assert "consistent.logical.timestamp" in info.value.hint
    assert sorted(os.listdir(f"{path}/.hoodie")) == instants  # nothing written


def test_partitions_named_by_rows_take_the_tables_text(spark, tmp_path):
    """delete_partition with SQL names partitions by rows (executor): their paths are the text
    the table writes, e.g. epoch micros for a timestamp."""
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", partition_fields=("ts", "d")))
    df = spark.createDataFrame([(ROW_TS, Decimal("0.0000000001"))], "ts timestamp, d decimal(20,10)")
    assert table.partition_paths(df) == {"ts=1704103200000000/d=1E-10"}


# --- rows without a key (issue 39 B.8, B.11) ----------------------------------------------------

LEDGER_SOURCE = """
    sources:
      payments:
        kind: files
        path: data/payments
        format: json
        schema: "merchant STRING, txn_ref STRING, amount DECIMAL(12,2), ts BIGINT"
    """


def _ledger(tmp_path, key: str):
    from tests.test_run import project

    return project(tmp_path, {
        "sources/payments.yml": LEDGER_SOURCE,
        "tables/ledger.sql": "select merchant, txn_ref, amount, ts from {{ source('payments') }}\n",
        "tables/ledger.yml": f"tables:\n  ledger:\n    key: {key}\n    precombine: ts\n",
    })


def _completed(root):
    hoodie = root / "lake/ledger/.hoodie"
    return sorted(p.name for p in hoodie.iterdir() if p.name.endswith((".commit", ".deltacommit", ".replacecommit"))) if hoodie.exists() else []


def test_composite_keys_with_null_and_empty_parts_stay_distinct_rows_in_hudis_text(spark, tmp_path, capsys):
    from tests.test_run import run_ok, write_jsonl

    root = _ledger(tmp_path, "[merchant, txn_ref]")
    write_jsonl(root / "data/payments/1.json", [
        {"merchant": "Café Zoë", "txn_ref": "T-1", "amount": "12.50", "ts": 1_700_000_000_123},
        {"merchant": "Café Zoë", "txn_ref": None, "amount": "3.10", "ts": 1_700_000_000_456},
        {"merchant": None, "txn_ref": "T-1", "amount": "7.00", "ts": 1_700_000_000_789},
        {"merchant": "", "txn_ref": "T-1", "amount": "8.00", "ts": 1_700_000_001_000},
        {"merchant": "O'Brien \"Books\"", "txn_ref": "", "amount": "9.99", "ts": 1_700_000_001_500},
    ])
    run_ok(capsys, root)
    write_jsonl(root / "data/payments/2.json", [  # a second round updates the keys with null parts
        {"merchant": "Café Zoë", "txn_ref": None, "amount": "4.20", "ts": 1_700_000_100_000},
        {"merchant": None, "txn_ref": "T-1", "amount": "7.70", "ts": 1_700_000_100_001},
    ])
    run_ok(capsys, root)
    expected = {
        "merchant:Café Zoë,txn_ref:T-1": "12.50",
        "merchant:Café Zoë,txn_ref:__null__": "4.20",
        "merchant:__null__,txn_ref:T-1": "7.70",
        "merchant:__empty__,txn_ref:T-1": "8.00",
        "merchant:O'Brien \"Books\",txn_ref:__empty__": "9.99",
    }
    rows = pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(str(root / "lake/ledger")).build().read()).to_pylist()
    assert {r["_hoodie_record_key"]: str(r["amount"]) for r in rows} == expected
    assert len(rows) == 5


@pytest.mark.parametrize("key, row, named", [
    ("[merchant, txn_ref]", {"merchant": None, "txn_ref": None, "amount": "1.00", "ts": 1_700_000_000_999}, "every one of its key columns merchant, txn_ref"),
    ("[merchant, txn_ref]", {"merchant": "", "txn_ref": "", "amount": "1.00", "ts": 1_700_000_000_999}, "every one of its key columns merchant, txn_ref"),
    ("[txn_ref]", {"merchant": "Café Zoë", "txn_ref": None, "amount": "1.00", "ts": 1_700_000_000_999}, "its key column txn_ref"),
    ("[txn_ref]", {"merchant": "Café Zoë", "txn_ref": "", "amount": "1.00", "ts": 1_700_000_000_999}, "its key column txn_ref"),
], ids=["all-null-composite", "all-empty-composite", "null-single", "empty-single"])
def test_a_row_without_a_key_is_refused_naming_table_and_record_and_nothing_is_written(spark, tmp_path, capsys, key, row, named):
    from tests.test_run import assert_clean, pipe, write_jsonl

    root = _ledger(tmp_path, key)
    write_jsonl(root / "data/payments/1.json", [
        {"merchant": "Café Zoë", "txn_ref": "T-1", "amount": "12.50", "ts": 1_700_000_000_123}, row])
    code, out, err = pipe(capsys, root, "run")
    text = out + err
    assert code != 0, text
    assert_clean(out, err)
    assert "ledger" in text and named in text and "null or empty" in text, text
    assert f'"merchant":{json.dumps(row["merchant"], ensure_ascii=False)}' in text and '"ts":1700000000999' in text, text  # the record itself
    assert "HoodieKeyException" in text
    assert _completed(root) == []


@pytest.mark.parametrize("keys, row", [
    (("a",), (1_700_000_000_123, None, "x", 1, "v1")),  # the key made in the write task
    (("a",), (1_700_000_000_123, "", "x", 1, "v1")),
    (("a", "b"), (1_700_000_000_123, None, "", 1, "v1")),  # the key made by Spark
], ids=["null-single", "empty-single", "null-and-empty-composite"])
def test_bulk_insert_refuses_a_row_without_a_key_and_commits_nothing(spark, tmp_path, keys, row):
    path = str(tmp_path / "t")
    table = Table.create(spark, path, TableConfig(name="t", record_key_fields=keys, precombine_field="ts"))
    good = (1_700_000_000_456, "k-1", "Zoë", 2, "v1")
    with pytest.raises(Exception) as info:
        table.write(spark.createDataFrame([good, row], SCHEMA).coalesce(1), "bulk_insert")  # one task, which stops at the row
    assert "no record key" in str(info.value) and "HoodieKeyException" in str(info.value)
    assert not [f for f in os.listdir(f"{path}/.hoodie") if f.endswith(".commit")]
    assert Table.open(spark, path).read().count() == 0


# --- partition values that would leave the table's folder (issue 39 C.15) -------------------------


@pytest.mark.parametrize("hive", [False, True], ids=["bare-values", "hive-style"])
@pytest.mark.parametrize("value", ["..", "../x", ".hoodie", "a/../../b", "/etc", "a//b"])
def test_a_partition_value_that_is_no_folder_of_the_table_is_refused_and_nothing_leaves_it(spark, tmp_path, capsys, hive, value):
    from tests.test_run import assert_clean, pipe, project, write_jsonl

    root = project(tmp_path, {
        "sources/payments.yml": LEDGER_SOURCE,
        "tables/ledger.sql": "select merchant, txn_ref, amount, ts from {{ source('payments') }}\n",
        "tables/ledger.yml": f"tables:\n  ledger:\n    key: [txn_ref]\n    partition_by: [merchant]\n    hive_style_partitioning: {str(hive).lower()}\n",
    })
    write_jsonl(root / "data/payments/1.json", [
        {"merchant": "Café Zoë", "txn_ref": "T-1", "amount": "12.50", "ts": 1_700_000_000_123},
        {"merchant": value, "txn_ref": "T-2", "amount": "3.10", "ts": 1_700_000_000_456},
    ])
    code, out, err = pipe(capsys, root, "run")
    text = out + err
    # pipe's tables URL-encode partition values ('/' is %2F), so only a bare value that is '..'
    # or starts with '.hoodie' is no folder of the table ('..%2Fx' is a plain folder name);
    # hive style, `merchant=..` is a plain folder name
    unsafe = not hive and (value == ".." or value.startswith(".hoodie"))
    if unsafe:
        assert code != 0, text
        assert_clean(out, err)
        path = value.replace("/", "%2F")
        assert "table ledger" in text and "cannot be a folder of the table" in text and repr(path) in text, text
        assert '"T-2"' in text, text  # the record
        assert _completed(root) == []
    else:
        assert code == 0, text
        rows = pa.Table.from_batches(hudi.HudiTableBuilder.from_base_uri(str(root / "lake/ledger")).build().read()).to_pylist()
        assert sorted((r["txn_ref"], r["merchant"]) for r in rows) == [("T-1", "Café Zoë"), ("T-2", value)]
    table = root / "lake/ledger"
    written = [p for p in tmp_path.rglob("*") if p.is_file() and (p.suffix == ".parquet" or ".log." in p.name or p.name == ".hoodie_partition_metadata")]
    assert all(p.is_relative_to(table) and not p.is_relative_to(table / ".hoodie") for p in written), written
    assert not [p for p in tmp_path.rglob("*") if p.name in ("b", "x", "etc") and not p.is_relative_to(table)]


@pytest.mark.parametrize("hive", [False, True], ids=["bare-values", "hive-style"])
def test_raw_partition_values_nest_folders_as_in_hudi_but_never_leave_the_table(spark, tmp_path, hive):
    """A table whose hoodie.properties does not URL-encode partition paths (Java's default)
    takes a value as it is: a '/' nests folders, as Java writes it; a value whose folders would
    leave the table or enter .hoodie is refused, naming it, and nothing is written."""
    path = tmp_path / "t"
    table = Table.create(spark, str(path), TableConfig(name="t", record_key_fields=("id",), partition_fields=("a",), precombine_field="ts",
                                                      hive_style=hive, url_encode=False))
    table.write(spark.createDataFrame([(1, "EU/west", "x", 1, "v1")], SCHEMA), "upsert")
    assert (path / ("a=EU" if hive else "EU") / "west").is_dir()
    assert stored(table, "v") == [("1", "a=EU/west" if hive else "EU/west", "v1")]
    assert hudi_keys(str(path)) == ["1"]
    for value in ["a/../../b", "a//b", "EU/.hoodie", "EU/..", *([] if hive else ["/etc", "..", "../x", ".hoodie"])]:
        instants = sorted(os.listdir(path / ".hoodie"))
        with pytest.raises(Exception) as info:
            table.write(spark.createDataFrame([(2, value, "x", 2, "v2")], SCHEMA).coalesce(1), "upsert")
        shown = f"a={value}" if hive else value
        assert f"partition path {shown!r}" in str(info.value) and "cannot be a folder of the table" in str(info.value), value
        assert '"id": 2' in str(info.value)
        assert [f for f in sorted(os.listdir(path / ".hoodie")) if f.endswith(".commit")] == [f for f in instants if f.endswith(".commit")]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and (p.suffix == ".parquet" or p.name == ".hoodie_partition_metadata")]
    assert all(p.is_relative_to(path) and not p.is_relative_to(path / ".hoodie") for p in written), written
    assert not (tmp_path / "b").exists() and not (path / "b").exists()
    assert stored(Table.open(spark, str(path)), "v") == [("1", "a=EU/west" if hive else "EU/west", "v1")]
