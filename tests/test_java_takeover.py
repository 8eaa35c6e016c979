"""pipe takes over tables that Apache Hudi's own Java code wrote (issue 20 part 3; the interop
audit's "Cases to cover", 4): Java Hudi 0.15.0 (tests/java_hudi, fixture java_hudi_015) writes a
table with a feature of its own, pipe reads it, and then writes on, or refuses to. After each
step pipe's reader, hudi-rs and Java read the same rows, meta columns included, each key once.
Run alone with `pytest tests/test_java_takeover.py` (marker java_hudi)."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pytest

from runtime.table import Table
from runtime.table import logfile
from runtime.table.errors import TableError
from tests.java_hudi.client import hudi_rs, pipe_read, rows

pytestmark = [pytest.mark.java_hudi, pytest.mark.spark]

BASE_MS = 1_732_000_000_000  # epoch millis, Nov 2024
BASE_AT = dt.datetime(2024, 11, 19, 7, 6, 40, tzinfo=dt.timezone.utc)
REGIONS = ["EU/West", "US:East", "k=v", "New York", "ap south 1"]
META = ["_hoodie_commit_time", "_hoodie_record_key", "_hoodie_partition_path"]
DATA = ["id", "region", "ts", "event_ms", "amount", "at", "v"]

# the precombine field `ts` in each type a user orders by, as Arrow and Spark SQL types, and its
# value for row i of write `version` (larger versions order later)
ORDERING = {
    "int": (pa.int32(), "int", lambda i, version: version * 100_000 + i),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamp",
                  lambda i, version: BASE_AT + dt.timedelta(hours=version, milliseconds=i)),
    "string": (pa.string(), "string", lambda i, version: f"2024-11-{10 + version:02d}T07:00:{i % 60:02d}.{i:06d}"),
    "double": (pa.float64(), "double", lambda i, version: version + i / 1e6),
    "bigint": (pa.int64(), "bigint", lambda i, version: BASE_MS + version * 100_000 + i),
}


def events(ids, version: int, ordering: str = "bigint", deleted=lambda i: False, region=lambda i: REGIONS[i % len(REGIONS)]) -> pa.Table:
    """Rows users have: epoch-millis bigints, timestamps, decimals, partition values with / : =
    and spaces; `_hoodie_is_deleted` marks the rows a batch deletes."""
    ids = list(ids)
    arrow_type, _, value = ORDERING[ordering]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "region": pa.array([region(i) for i in ids], pa.string()),
        "ts": pa.array([value(i, version) for i in ids], arrow_type),
        "event_ms": pa.array([BASE_MS + version * 1000 + i for i in ids], pa.int64()),
        "amount": pa.array([decimal.Decimal(f"{(i * 37 + version) % 100000}.{i % 100:02d}") for i in ids], pa.decimal128(12, 2)),
        "at": pa.array([BASE_AT + dt.timedelta(seconds=i * 7 + version) for i in ids], pa.timestamp("us", tz="UTC")),
        "v": pa.array([f"v{version}-{i}" for i in ids], pa.string()),
        "_hoodie_is_deleted": pa.array([bool(deleted(i)) for i in ids], pa.bool_()),
    })


def sql_schema(ordering: str = "bigint") -> str:
    return (f"id bigint, region string, ts {ORDERING[ordering][1]}, event_ms bigint, amount decimal(12,2), at timestamp, "
            "v string, _hoodie_is_deleted boolean")


def java_opts(table_type: str, operation: str = "upsert", **extra) -> dict:
    """A Java Spark user's write options: key id, hive-style URL-encoded partitions by region,
    precombine ts; Java's defaults (metadata table on, SIMPLE index) for the rest."""
    opts = {"hoodie.table.name": "events", "hoodie.datasource.write.operation": operation,
            "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
            "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
            "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true"}
    opts.update(extra)
    return opts


class Expected:
    """What a user should see: id -> the row's data values, kept as batches are written."""

    def __init__(self):
        self.rows: dict[int, tuple] = {}

    def apply(self, batch: pa.Table, delete_all: bool = False, delete_when=lambda r: False) -> None:
        for r in batch.to_pylist():
            if delete_all or r["_hoodie_is_deleted"] or delete_when(r):
                self.rows.pop(r["id"], None)
            else:
                self.rows[r["id"]] = tuple(rows(pa.Table.from_pylist([r], schema=batch.schema), DATA)[0])


def pipe_df(spark, batch: pa.Table, ordering: str = "bigint"):
    return spark.createDataFrame(batch.to_pylist(), sql_schema(ordering))


def all_agree(spark, path: Path, java, expected: Expected, hudi_rs_reads: bool = True) -> list[tuple]:
    """pipe's reader, hudi-rs and Java read the same rows (meta columns included), each key
    once, and the data is `expected`. Returns pipe's rows."""
    cols = META + DATA
    mine = rows(pipe_read(Table.open(spark, str(path))), cols)
    keys = [r[1] for r in mine]
    assert len(keys) == len(set(keys)), "a key twice in pipe's read"
    assert {r[3]: r[3:] for r in mine} == expected.rows
    assert rows(java.read(path), cols) == mine, "Java"
    if hudi_rs_reads:
        assert rows(hudi_rs(path), cols) == mine, "hudi-rs"
    return mine


# --- 1. Java merge-on-read tables with typed deletes, on each precombine type ---------------------------

def delete_wrappers(path: Path) -> dict[str, int]:
    """The ordering-value wrappers of every delete in the table's delete blocks: kind -> count."""
    kinds: dict[str, int] = {}
    for log in path.rglob(".*.log.*"):
        if ".hoodie" in log.relative_to(path).parts or logfile.parse_name(log.name) is None:  # the metadata table, .crc files
            continue
        for block in logfile.read_blocks(log.read_bytes(), str(log)):
            if block.type == logfile.DELETE:
                for d in logfile.delete_records(block):
                    kind = f"{d.ordering.type}(0)" if d.ordering == logfile.NATURAL_ORDER else d.ordering.type
                    kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@pytest.mark.parametrize("ordering", ["int", "timestamp", "string", "double"])
def test_pipe_takes_over_java_typed_deletes_on_each_precombine_type(spark, tmp_path, java_hudi_015, ordering):
    """Java 0.15 writes a merge-on-read table (Avro log blocks), upserts with
    `_hoodie_is_deleted` on some keys and runs a `delete` batch: its delete blocks carry
    ordering values of the precombine field's type (IntWrapper, TimestampMicrosWrapper,
    StringWrapper, DoubleWrapper). pipe, hudi-rs and Java read the same rows. pipe then upserts
    (with `_hoodie_is_deleted` and `delete_when` deletes) and compacts; all agree again."""
    path = tmp_path / "events"
    opts = java_opts("MERGE_ON_READ")
    expected = Expected()
    first = events(range(2000), 1, ordering)
    java_hudi_015.write(path, first, opts)
    expected.apply(first)
    change = events(range(0, 2000, 3), 2, ordering, deleted=lambda i: i % 4 == 0)
    java_hudi_015.write(path, change, opts)
    expected.apply(change)
    gone = events(range(1, 2000, 11), 3, ordering)
    java_hudi_015.write(path, gone, java_opts("MERGE_ON_READ", "delete"))
    expected.apply(gone, delete_all=True)
    # `_hoodie_is_deleted` rows carry the precombine value in its own wrapper (a timestamp as its
    # epoch micros, a LongWrapper); the `delete` operation writes IntWrapper(0), "natural order"
    typed = logfile.ordering_kind(ORDERING[ordering][0])
    wrappers = delete_wrappers(path)
    assert set(wrappers) == {typed, "int(0)"} and wrappers[typed] == len(range(0, 2000, 12)), wrappers
    all_agree(spark, path, java_hudi_015, expected)

    table = Table.open(spark, str(path))
    mine = events(list(range(2, 2000, 7)) + list(range(2000, 2100)), 4, ordering, deleted=lambda i: i % 5 == 0)
    table.write(pipe_df(spark, mine, ordering), "upsert")
    expected.apply(mine)
    more = events(range(5, 2000, 13), 5, ordering)
    table.write(pipe_df(spark, more, ordering), "upsert", delete_when="id % 2 = 0")
    expected.apply(more, delete_when=lambda r: r["id"] % 2 == 0)
    all_agree(spark, path, java_hudi_015, expected)
    assert Table.open(spark, str(path)).compact() is not None
    all_agree(spark, path, java_hudi_015, expected)


# --- 2. an archived Java timeline -----------------------------------------------------------------

def write_history(java, path: Path, table_type: str, commits: int, expected: Expected, **extra) -> None:
    """A first write of 1500 keys, then `commits - 1` Java upserts of a slice of them and 20 new
    keys each."""
    first = events(range(1500), 1)
    java.write(path, first, java_opts(table_type, **extra))
    expected.apply(first)
    for version in range(2, commits + 1):
        batch = events(list(range(version, 1500, 9)) + list(range(1500 + version * 20, 1520 + version * 20)), version)
        java.write(path, batch, java_opts(table_type, **extra))
        expected.apply(batch)


def completed_writes(path: Path) -> list[str]:
    return sorted(p.name.split(".")[0] for p in (path / ".hoodie").iterdir()
                  if p.name.endswith((".commit", ".deltacommit", ".replacecommit")))


def test_pipe_takes_over_a_java_table_whose_timeline_java_archived(spark, tmp_path, java_hudi_015):
    """Java 0.15 writes 8 commits with aggressive archival (keep 2 to 3 commits, clean retaining
    1), so .hoodie/archived/ holds Java's archive, with its metadata table (which pipe retires). pipe reads
    the snapshot and an incremental range of the active timeline as Java and hudi-rs do, upserts,
    runs its own clean and archive; then Java reads and writes again, and all agree."""
    path = tmp_path / "events"
    archival = {"hoodie.keep.min.commits": "2", "hoodie.keep.max.commits": "3", "hoodie.cleaner.commits.retained": "1",
                "hoodie.metadata.enable": "true", "hoodie.metadata.compact.max.delta.commits": "2"}
    expected = Expected()
    write_history(java_hudi_015, path, "COPY_ON_WRITE", 8, expected, **archival)
    assert list((path / ".hoodie" / "archived").glob(".commits_.archive*")), "Java archived nothing"
    writes = completed_writes(path)
    assert len(writes) <= 4, writes
    all_agree(spark, path, java_hudi_015, expected)
    cols = META + DATA
    begin, end = writes[-2], writes[-1]
    table = Table.open(spark, str(path))
    changes = rows(pipe_read(table, since=begin, until=end), cols)
    assert len(changes) == len(range(8, 1500, 9)) + 20
    assert rows(hudi_rs(path, since=begin, until=end), cols) == changes, "hudi-rs incremental"
    assert rows(java_hudi_015.read(path, query="incremental", begin=begin, end=end), cols) == changes, "Java incremental"

    for version in (9, 10, 11):
        batch = events(range(version, 1500, 13), version, deleted=lambda i: i % 10 == 0)
        table.write(pipe_df(spark, batch), "upsert")
        expected.apply(batch)
    table.clean(retain=1)
    archived = table.archive(min_instants=2, max_instants=3)
    assert archived, "pipe archived nothing"
    all_agree(spark, path, java_hudi_015, expected)

    batch = events(list(range(12, 1500, 17)) + list(range(3000, 3050)), 12)
    java_hudi_015.write(path, batch, java_opts("COPY_ON_WRITE", **archival))
    expected.apply(batch)
    all_agree(spark, path, java_hudi_015, expected)


# --- 3. Java clustering ----------------------------------------------------------------------------

NEW_FILE_GROUPS = {"hoodie.parquet.small.file.limit": "0"}  # every Java insert makes new file groups to cluster


def test_pipe_writes_on_after_java_inline_clustering(spark, tmp_path, java_hudi_015):
    """Java 0.15 clusters a copy-on-write table inline (a completed replacecommit that replaces
    the small file groups of three inserts); pipe reads what Java and hudi-rs read, upserts, and
    Java reads and upserts after it."""
    path = tmp_path / "events"
    expected = Expected()
    cluster = dict(NEW_FILE_GROUPS, **{"hoodie.clustering.inline": "true", "hoodie.clustering.inline.max.commits": "3"})
    for version, ids in ((1, range(0, 1200)), (2, range(1200, 2400)), (3, range(2400, 3000))):
        batch = events(ids, version)
        java_hudi_015.write(path, batch, java_opts("COPY_ON_WRITE", "insert", **cluster))
        expected.apply(batch)
    assert list((path / ".hoodie").glob("*.replacecommit")), "Java did not cluster"
    all_agree(spark, path, java_hudi_015, expected)
    batch = events(list(range(0, 3000, 7)) + list(range(3000, 3100)), 4, deleted=lambda i: i % 49 == 0)
    Table.open(spark, str(path)).write(pipe_df(spark, batch), "upsert")
    expected.apply(batch)
    all_agree(spark, path, java_hudi_015, expected)
    batch = events(range(1, 3100, 11), 5)
    java_hudi_015.write(path, batch, java_opts("COPY_ON_WRITE"))
    expected.apply(batch)
    all_agree(spark, path, java_hudi_015, expected)


def test_pipe_refuses_to_write_under_a_clustering_java_scheduled_until_java_runs_it(spark, tmp_path, java_hudi_015):
    """A clustering Java 0.15 only scheduled (`.replacecommit.requested` with a CLUSTER plan):
    pipe reads the table as Java and hudi-rs do, and refuses to write with a message naming the
    pending clustering, changing no file (it neither rolls the plan back nor retires the
    metadata table). Java then executes the plan (CALL run_clustering) and pipe writes."""
    path = tmp_path / "events"
    expected = Expected()
    for version, ids in ((1, range(0, 1500)), (2, range(1500, 3000))):
        batch = events(ids, version)
        java_hudi_015.write(path, batch, java_opts("COPY_ON_WRITE", "insert", **NEW_FILE_GROUPS))
        expected.apply(batch)
    java_hudi_015.sql(f"CALL run_clustering(path => '{path}', op => 'schedule')")
    pending = sorted(p.name for p in (path / ".hoodie").glob("*.replacecommit.requested"))
    assert pending and not list((path / ".hoodie").glob("*.replacecommit")), "Java scheduled no clustering"
    all_agree(spark, path, java_hudi_015, expected)

    before = listing(path)
    batch = events(range(0, 3000, 5), 3)
    with pytest.raises(TableError, match=f"pending clustering {pending[0].split('.')[0]}") as refused:
        Table.open(spark, str(path)).write(pipe_df(spark, batch), "upsert")
    assert "HoodieClusteringJob" in refused.value.hint
    assert listing(path) == before, "pipe changed the table it refused to write"
    all_agree(spark, path, java_hudi_015, expected)

    java_hudi_015.sql(f"CALL run_clustering(path => '{path}', op => 'execute')")
    assert (path / ".hoodie" / pending[0].replace(".requested", "")).exists(), "Java did not complete its clustering"
    all_agree(spark, path, java_hudi_015, expected)
    Table.open(spark, str(path)).write(pipe_df(spark, batch), "upsert")
    expected.apply(batch)
    all_agree(spark, path, java_hudi_015, expected)


# --- 4. Java features pipe refuses to write, and the record index ----------------------------------

def listing(path: Path) -> list[tuple]:
    """Every file under the table with its size and modification time."""
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file())


REFUSED = {
    # (change data capture is written now: tests/test_cdc_tables.py; with a bucket index it stays refused)
    "cdc_bucket": ("COPY_ON_WRITE", {"hoodie.table.cdc.enabled": "true", "hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "SIMPLE",
                                     "hoodie.bucket.index.num.buckets": "4"}, "hoodie.index.type=BUCKET"),
    "bucket": ("COPY_ON_WRITE", {"hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "SIMPLE",
                                 "hoodie.bucket.index.num.buckets": "4"}, "hoodie.index.type"),
    "consistent_hashing": ("MERGE_ON_READ", {"hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "CONSISTENT_HASHING",
                                             "hoodie.bucket.index.num.buckets": "4"}, "hoodie.index.bucket.engine"),
}


@pytest.mark.parametrize("feature", list(REFUSED))
def test_pipe_refuses_to_write_java_tables_with_features_it_does_not_keep(spark, tmp_path, java_hudi_015, feature):
    """Java 0.15 writes a table with change data capture and a bucket index, a SIMPLE bucket index (its number of
    buckets not declared: tests/test_bucket_index.py writes it once it is), or a
    consistent-hashing bucket index (merge-on-read); pipe reads it as Java and hudi-rs do, and
    refuses to write with a message naming the property, leaving every file as it was."""
    table_type, extra, prop = REFUSED[feature]
    path = tmp_path / "events"
    expected = Expected()
    first = events(range(2000), 1)
    java_hudi_015.write(path, first, java_opts(table_type, **extra))
    expected.apply(first)
    change = events(list(range(0, 2000, 3)) + list(range(2000, 2100)), 2, deleted=lambda i: i % 10 == 0)
    java_hudi_015.write(path, change, java_opts(table_type, **extra))
    expected.apply(change)
    all_agree(spark, path, java_hudi_015, expected)
    before = listing(path)
    with pytest.raises(TableError, match=prop):
        Table.open(spark, str(path)).write(pipe_df(spark, events(range(0, 2000, 4), 3)), "upsert")
    assert listing(path) == before, "pipe changed the table it refused to write"
    all_agree(spark, path, java_hudi_015, expected)


def test_java_record_index_table_taken_over_by_pipe_and_back(spark, tmp_path, java_hudi_015):
    """Java 0.15 writes with its record index (hoodie.index.type=RECORD_INDEX, kept in the
    metadata table); pipe upserts, keeping the metadata table's files partition and the record
    index in step (tests/test_record_index.py checks the index entry by entry); Java upserts
    again through the record index and finds the keys pipe wrote: no key twice, and all agree."""
    path = tmp_path / "events"
    record_index = {"hoodie.metadata.enable": "true", "hoodie.metadata.record.index.enable": "true",
                    "hoodie.index.type": "RECORD_INDEX"}
    expected = Expected()
    first = events(range(2000), 1)
    java_hudi_015.write(path, first, java_opts("COPY_ON_WRITE", **record_index))
    expected.apply(first)
    change = events(list(range(0, 2000, 3)) + list(range(2000, 2100)), 2)
    java_hudi_015.write(path, change, java_opts("COPY_ON_WRITE", **record_index))
    expected.apply(change)
    assert "record_index" in (path / ".hoodie" / "hoodie.properties").read_text()
    all_agree(spark, path, java_hudi_015, expected)

    mine = events(list(range(1, 2100, 4)) + list(range(2100, 2300)), 3, deleted=lambda i: i % 12 == 1)
    Table.open(spark, str(path)).write(pipe_df(spark, mine), "upsert")
    expected.apply(mine)
    props = (path / ".hoodie" / "hoodie.properties").read_text()
    assert (path / ".hoodie" / "metadata" / "files").is_dir()
    assert [f for f in (path / ".hoodie" / "metadata" / "record_index").rglob(".record-index-*") if ".log." in f.name]
    assert "hoodie.table.metadata.partitions=files,record_index\n" in props
    all_agree(spark, path, java_hudi_015, expected)

    back = events(list(range(2100, 2300, 3)) + list(range(5, 2100, 6)) + list(range(2300, 2350)), 4)
    java_hudi_015.write(path, back, java_opts("COPY_ON_WRITE", **record_index))
    expected.apply(back)
    assert "record_index" in (path / ".hoodie" / "hoodie.properties").read_text()
    all_agree(spark, path, java_hudi_015, expected)
