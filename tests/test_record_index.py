"""The metadata table's record index (runtime/table/record_index.py; issue 42 part 2): pipe keeps
a Java table's `record_index` in step with its upserts, inserts and deletes, and its global-index
lookup reads only the file groups the index names. After every round the index holds exactly the
table's keys with the partition and file group each is in (checked against hudi-rs's read of the
meta columns), and Java Hudi, whose RECORD_INDEX trusts the index to find a key, writes on
without ever storing a key twice. Run alone with `pytest tests/test_record_index.py`."""

from __future__ import annotations

import collections
from pathlib import Path

import pyarrow as pa
import pytest

from runtime.storage import StorageSpec, open_storage
from runtime.table import Table
from runtime.table import record_index as ri
from runtime.table.metadata_table import MetadataTable
from runtime.table.timeline import COMMIT, Timeline
from tests.java_hudi.client import hudi_rs
from tests.test_java_takeover import Expected, all_agree, events, java_opts, pipe_df

pytestmark = [pytest.mark.java_hudi, pytest.mark.spark]

RECORD_INDEX = {"hoodie.metadata.enable": "true", "hoodie.metadata.record.index.enable": "true",
                "hoodie.index.type": "RECORD_INDEX", "hoodie.record.index.update.partition.path": "true"}


# --- the format, on values alone ---------------------------------------------------------------

def test_keys_hash_to_the_file_group_javas_string_hashcode_gives():
    """Java's String.hashCode over UTF-16 code units, 32-bit: values computed by hand from its
    definition (s[0]*31^(n-1) + ... + s[n-1]), accents and a character past U+FFFF included."""
    def java_hash(s: str) -> int:
        h = 0
        units = s.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
        return h - (1 << 32) if h >= 1 << 31 else h

    keys = ["", "a", "105", "order-000000001234", "id:17,region:EU/West", "Zoë's café", "emoji \U0001F600 key", "x" * 200,
            "polygenelubricants"]  # the last hashes to Integer.MIN_VALUE, whose abs stays negative in Java
    assert java_hash("polygenelubricants") == -(1 << 31)
    assert [int(h) for h in ri.java_hashes(keys)] == [java_hash(k) for k in keys]
    # a task's Arrow column (a slice of a larger array), ASCII keys of many lengths hashed a
    # length at once among others hashed one by one
    import random

    import pyarrow as pa

    rnd = random.Random(7)
    many = keys + [f"{rnd.choice(['order-', 'Zoë-', ''])}{rnd.randrange(10 ** rnd.randrange(1, 14))}" for _ in range(3_000)]
    column = pa.array(["before"] * 5 + many)[5:]
    assert [int(h) for h in ri.java_hashes(column)] == [java_hash(k) for k in many]
    def java_abs(h: int) -> int:
        return h if h == -(1 << 31) else abs(h)

    def java_rem(a: int, n: int) -> int:  # Java's %: the sign of the dividend
        return a - n * int(a / n)

    for n in (1, 7, 10, 64):
        assert [int(g) for g in ri.file_groups_of(keys, n)] == [abs(java_rem(java_abs(java_hash(k)), n)) for k in keys]


def test_tasks_put_keys_in_the_groups_javas_hash_gives(spark):
    """with_group asks the executors' JVM for String.hashCode: the same groups as the Python
    reference above, for accents, a character past U+FFFF, Integer.MIN_VALUE's key and
    thousands of keys of many lengths, at several group counts."""
    import random

    rnd = random.Random(11)
    keys = ["", "a", "Zoë's café", "emoji \U0001F600 key", "polygenelubricants", "x" * 300] + \
        [f"{rnd.choice(['order-', 'Zoë-', 'id:'])}{rnd.randrange(10 ** rnd.randrange(1, 14))}" for _ in range(4_000)]
    df = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "i long, _k string")
    for n in (1, 10, 37):
        got = {r[0]: r[1] for r in ri.with_group(spark, df, "_k", n).select("i", "_pipe_ri_group").collect()}
        assert [got[i] for i in range(len(keys))] == [int(g) for g in ri.file_groups_of(keys, n)], n


def test_locations_encode_as_java_encodes_them():
    """A UUID file id with its -N index round-trips through the two longs; a bare UUID (Hudi
    0.x's older ids) and any other id (encoding 1, as text) too."""
    for fid in ("4f6d1c1e-95bd-4b5e-9a2c-0d9f3f1b2a7c-0", "ffffffff-ffff-ffff-ffff-ffffffffffff-12", "00000000-0000-0000-0000-000000000000",
                "00000001-5a1b-4c3d-8e9f-0a1b2c3d4e5f-0", "my-own-file-group"):
        for version in (6, 9):
            info = ri.location_info("region=EU%2FWest", fid, 1796519541830, version)
            assert ri.location_of(info) == ("region=EU%2FWest", fid)
            assert info["fileIdEncoding"] == (1 if fid == "my-own-file-group" else 0)
            assert ("position" in info) == (version >= 8)


def test_entries_are_written_byte_for_byte_as_fastavro_writes_them():
    """record_index.encode_entry (hand-written for speed) against fastavro with the version's
    HoodieMetadataRecord schema, for both encodings, large and negative longs, accents."""
    import io

    import fastavro

    from runtime.table.metadata_table import record_schema

    for version in (6, 8, 9):
        _, parsed = record_schema(version)
        for partition, fid, ms in (("region=EU%2FWest", "4f6d1c1e-95bd-4b5e-9a2c-0d9f3f1b2a7c-0", 1796519541830),
                                   ("São Paulo/é", "ffffffff-ffff-ffff-ffff-ffffffffffff-123", 0),
                                   ("", "00000000-0000-0000-0000-000000000000", -1), ("d=1", "not-a-uuid-file", 253402300799999)):
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, ri._record(ri.location_info(partition, fid, ms, version), version))
            assert ri.encode_entry(partition, fid, ms, version) == buf.getvalue(), (version, fid)
            assert ri.location_of(fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), parsed)["recordIndexMetadata"]) == (partition, fid)



def test_a_lookup_finds_the_same_cells_however_many_rows_a_block_holds():
    """hfile.read with rows finds a few rows of a block by their bytes and walks the cells of
    a block many rows fall in: both give exactly the cells a full read holds for those rows,
    over many blocks, with keys of several lengths, accents, and rows the file does not hold.
    A damaged cell is an HFileError either way, never a wrong answer."""
    import random

    from runtime.table import hfile

    rnd = random.Random(42)
    keys = sorted({f"{rnd.choice(['order-', 'Zoë-', 'k'])}{rnd.randrange(10 ** rnd.randrange(3, 12)):d}".encode("utf-8") for _ in range(20_000)})
    cells = [(k, ri.encode_entry("day=2026-01-0%d" % (i % 7), f"4f6d1c1e-95bd-4b5e-9a2c-0d9f3f1b2a{i % 99:02d}-0", 1796519541830 + i, 9))
             for i, k in enumerate(keys)]
    data = hfile.write(cells, {"schema": b"{}"})
    full = dict(hfile.read(data).cells)
    assert len(full) == len(keys)
    absent = [f"absent-{i}".encode() for i in range(300)]
    fetched = []

    def fetch(start: int, end: int) -> bytes:  # a stored file read in ranges, as Storage.read_range
        fetched.append(end - start)
        return data[start:end]

    # (rows the file lacks between rows it holds: a block's search turns to walking its cells
    # from the last row found)
    between = [k + b"~" for k in rnd.sample(keys, 3_000)] + rnd.sample(keys, 3_000)
    for wanted in (rnd.sample(keys, 15), rnd.sample(keys, 4_000), keys, rnd.sample(keys, 2_000) + absent, keys[9_000:9_050], between):
        rows = sorted(wanted)
        for found in (hfile.read(data, rows).cells, hfile.read_stored(fetch, len(data), rows).cells):
            assert dict(found) == {r: full[r] for r in rows if r in full}
            assert len(found) == len({r for r in rows if r in full})
    # 50 neighbouring keys: the trailer, the index and a block or two are read, not the file
    fetched.clear()
    hfile.read_stored(fetch, len(data), sorted(keys[9_000:9_050]))
    assert sum(fetched) < len(data) / 10 and len(fetched) <= 4, (sum(fetched), len(data), fetched)
    # a cell whose row length runs past its block: damaged, said so
    broken = bytearray(hfile.write(cells[:50], {"schema": b"{}"}, codec=hfile.NONE))
    at = broken.index(hfile.DATA) + hfile.HEADER
    broken[at + 8:at + 10] = (0x7FFF).to_bytes(2, "big")
    for rows in (None, sorted(k for k, _ in cells[:50])):
        with pytest.raises(hfile.HFileError, match="damaged"):
            hfile.read(bytes(broken), rows)

# --- against Java ------------------------------------------------------------------------------

def index_of(path: Path, version: int) -> dict[str, tuple[str, str]]:
    storage = open_storage(StorageSpec(str(path), ()))
    spec = MetadataTable(storage, version).record_index_spec(Timeline.load(storage, 2 if version >= 8 else 1))
    assert spec is not None, "no record index pipe can read"
    return ri.read_all(spec)


def table_locations(path: Path) -> dict[str, tuple[str, str]]:
    """Every key of the table with its partition and file group, as hudi-rs reads them."""
    t = hudi_rs(path)
    return {k: (p, f.split("_", 1)[0]) for k, p, f in zip(t["_hoodie_record_key"].to_pylist(), t["_hoodie_partition_path"].to_pylist(),
                                                        t["_hoodie_file_name"].to_pylist())}


def assert_index_exact(path: Path, version: int) -> dict[str, tuple[str, str]]:
    index, table = index_of(path, version), table_locations(path)
    wrong = {k: (index.get(k), table.get(k)) for k in set(index) | set(table) if index.get(k) != table.get(k)}
    assert not wrong, f"{len(wrong)} keys where the record index and the table differ, e.g. {list(wrong.items())[:3]}"
    props = (path / ".hoodie" / "hoodie.properties").read_text()
    assert "record_index" in [p.strip() for line in props.splitlines() if line.startswith("hoodie.table.metadata.partitions=")
                              for p in line.split("=", 1)[1].split(",")]
    return index


def _compactions(path: Path, version: int) -> int:
    """The metadata table's completed compactions (commit instants on its active timeline)."""
    return len(MetadataTable(open_storage(StorageSpec(str(path), ())), version).timeline().completed((COMMIT,)))


def record_index_logs(path: Path) -> list[Path]:
    return sorted(p for p in (path / ".hoodie" / "metadata" / "record_index").iterdir() if ".log." in p.name and not p.name.endswith(".crc"))


CASES = [("java_hudi_015", "COPY_ON_WRITE", 6), ("java_hudi_015", "MERGE_ON_READ", 6),
         ("java_hudi_11", "COPY_ON_WRITE", 9), ("java_hudi_11", "MERGE_ON_READ", 9)]


# (version 6's copy-on-write case is left out: the index's upkeep does not depend on the table
# type, version 6's index format is kept by the merge-on-read case, and a copy-on-write table of
# version 6 keeping its record index round after round is test_a_project_table_with_index_record_...)
@pytest.mark.parametrize("java_fixture,table_type,version", CASES[1:], ids=[f"{c[2]}-{c[1].split('_')[0].lower()}" for c in CASES[1:]])
def test_pipe_keeps_a_java_record_index_in_step(spark, tmp_path, request, monkeypatch, java_fixture, table_type, version):
    """Java writes with RECORD_INDEX; pipe writes five rounds of updates, inserts, deletes,
    moves to another partition and keys deleted then written again (upsert, insert and delete
    operations), each checked: the record index equals the table's keys and places, pipe's
    lookup read fewer file groups than the table has once it is large, and all readers agree.
    pipe compacts the metadata table every 4 deltacommits here (Java's default is 10), so that
    its nine writes compact it twice, record index and all. Then Java upserts again through the
    index (compacting at its own 10): no key twice, and the index still exact."""
    from runtime.table import metadata_table

    monkeypatch.setattr(metadata_table, "COMPACT_AFTER", 4)
    java = request.getfixturevalue(java_fixture)
    path = tmp_path / "events"
    expected = Expected()
    first = events(range(3000), 1)
    java.write(path, first, java_opts(table_type, **RECORD_INDEX))
    expected.apply(first)
    assert_index_exact(path, version)

    table = Table.open(spark, str(path))
    logs_before = len(record_index_logs(path))
    looked_up: list[int] = []  # how many file groups each lookup named
    real_lookup, real_placed = ri.lookup, ri.placed
    monkeypatch.setattr(ri, "lookup", lambda *a: looked_up.append(len(found := real_lookup(*a))) or found)
    # (an upsert or delete asks where its keys are and whether they stay in their partitions)
    monkeypatch.setattr(ri, "placed", lambda *a: looked_up.append(len((found := real_placed(*a))[0])) or found)
    compactions = []
    for round_ in range(2, 7):
        base = 3000 + (round_ - 2) * 400
        ids = (list(range(round_, 3000, 37)) + list(range(base, base + 400))  # updates spread over the table, new keys
               + list(range(round_ * 5, round_ * 5 + 60, 3)))  # keys deleted in an earlier round come back
        moved = set(range(round_ + 1, 3000, 211))  # a partition change: the key moves to another file group
        batch = events(ids + sorted(moved), round_, deleted=lambda i, r=round_: i % 13 == r and i < 3000,
                       region=lambda i, r=round_, m=moved: "moved/" + str(r % 3) if i in m else ["EU/West", "US:East", "k=v", "New York", "ap south 1"][i % 5])
        table.write(pipe_df(spark, batch), "upsert")
        expected.apply(batch)
        index = assert_index_exact(path, version)
        assert len(index) == len(expected.rows)
        if round_ % 3 == 0:  # a plain delete by key, and an insert of new keys
            gone = events(range(round_ * 100, round_ * 100 + 40), round_ + 100)
            table.write(pipe_df(spark, gone), "delete")
            expected.apply(gone, delete_all=True)
            new = events(range(100_000 + round_ * 50, 100_000 + round_ * 50 + 50), round_)
            table.write(pipe_df(spark, new), "insert")
            expected.apply(new)
            assert_index_exact(path, version)
        compactions.append(_compactions(path, version))
    assert len(record_index_logs(path)) > logs_before, "pipe wrote no record index log"
    groups = len({(p, f) for p, f in table_locations(path).values()})
    # every upsert and delete asked the index (an insert looks nothing up); a delete of 40 neighbouring keys named few groups
    assert len(looked_up) == 7 and 0 < min(looked_up) < groups, (looked_up, groups)
    # nine deltacommits: pipe compacted the metadata table twice, the record index's groups with it
    assert compactions[-1] >= compactions[0] + 2, compactions
    compacted = sorted((path / ".hoodie" / "metadata" / "record_index").glob("record-index-*.hfile"))
    assert {p.name.split("_", 1)[0] for p in compacted} == {ri.file_group_id(i) for i in range(10)}
    all_agree(spark, path, java, expected)

    back = events(list(range(0, 3000, 7)) + list(range(200_000, 200_100)), 50, region=lambda i: "back")
    java.write(path, back, java_opts(table_type, **RECORD_INDEX))
    expected.apply(back)
    all_agree(spark, path, java, expected)
    assert_index_exact(path, version)


@pytest.mark.parametrize("java_fixture,table_type,version,written_by", [(*CASES[1], "write tasks"), (*CASES[3], "partition tasks")],
                         ids=["6-merge-write tasks", "9-merge-partition tasks"])
def test_upserts_whose_keys_stay_in_their_partitions_are_decided_in_partition_tasks_through_the_index(
        spark, tmp_path, request, monkeypatch, java_fixture, table_type, version, written_by):
    """Java writes 6,000 keys into 6 partitions of a merge-on-read table with RECORD_INDEX; pipe
    then upserts six times without moving a key: updates (some stale), new keys, deletes (`_hoodie_is_deleted`, and
    the delete operation), keys deleted in an earlier round written again, and a key coming
    twice in one batch. The record index shows no key leaves its partition, so partition tasks
    decide each write, reading the keys of the groups the index names only; the keys they
    insert and delete are the index's changes: after every round the index is exact. A batch
    that moves a key goes the general way. Java then upserts through the index. (`write tasks`:
    as on a cluster with fewer partitions than cores, the partition tasks hand their rows to
    write tasks, and the index's changes come from those rows; and the index is asked with
    the batch's keys shuffled by index file group, as a batch of over
    bloom_index.ONE_TASK_KEYS keys is, instead of in one task.)"""
    from runtime.table import bloom_index, writer

    if written_by == "write tasks":
        monkeypatch.setattr(writer, "_partition_tasks", lambda spark, partitions: (partitions, None))
        monkeypatch.setattr(bloom_index, "ONE_TASK_KEYS", 0)

    java = request.getfixturevalue(java_fixture)
    path = tmp_path / "events"
    expected = Expected()
    region = lambda i: f"day {i % 6}"  # noqa: E731
    first = events(range(6000), 1, region=region)
    java.write(path, first, java_opts(table_type, **RECORD_INDEX))
    expected.apply(first)
    taken: list = []  # the groups the index named, per write partition tasks took
    real = writer._upsert_by_partition
    monkeypatch.setattr(writer, "_upsert_by_partition", lambda *a, **k: taken.append(a[-1]) or real(*a, **k))
    table = Table.open(spark, str(path))
    for r in range(2, 8):
        days = {r % 6, (r + 1) % 6}  # two partitions of six
        ids = ([i for i in range(r * 7, 6000, 37) if i % 6 in days] + [i for i in range(10_000 + r * 300, 10_600 + r * 300) if i % 6 in days]
               + [i for i in range(r * 11 - 20, r * 11) if i % 6 in days])  # (keys deleted in an earlier round come back)
        batch = events(ids, r, region=region, deleted=lambda i, r=r: i % 17 == r)
        twice = events([ids[0], ids[0]], r, region=region)  # the same key again: the later row wins
        stale = events([ids[1]], 0, region=region)  # older than the batch's row of the key: ignored
        places = table_locations(path)
        named = {places[str(i)] for i in ids if str(i) in places}
        before = len(taken)
        table.write(pipe_df(spark, pa.concat_tables([batch, twice, stale])), "upsert")
        expected.apply(pa.concat_tables([batch, twice]))
        assert len(taken) == before + 1, f"round {r}: the upsert went the general way"
        assert taken[-1] == named and {p for p, _ in named} == {f"region=day {d}" for d in days}, (taken[-1], named)
        assert_index_exact(path, version)
        if r % 3 == 0:  # the delete operation, of keys in one partition
            gone = events([i for i in range(r * 50, r * 50 + 60) if i % 6 == 0], r + 100, region=region)
            table.write(pipe_df(spark, gone), "delete")
            expected.apply(gone, delete_all=True)
            assert len(taken) == before + 2
            assert_index_exact(path, version)
    took = len(taken)
    logs = set(record_index_logs(path))
    stored = table_locations(path)
    updates = events([i for i in range(0, 6000, 50) if str(i) in stored], 30, region=region)
    table.write(pipe_df(spark, updates), "upsert")
    expected.apply(updates)
    assert len(taken) == took + 1 and not set(record_index_logs(path)) - logs, "updates in place wrote an index log"
    assert_index_exact(path, version)
    took = len(taken)
    moved = events([5, 6, 20_000], 20, region=lambda i: "elsewhere")
    table.write(pipe_df(spark, moved), "upsert")
    expected.apply(moved)
    assert len(taken) == took, "a batch moving keys took partition tasks"
    assert_index_exact(path, version)
    all_agree(spark, path, java, expected)
    back = events(list(range(0, 6000, 13)) + list(range(50_000, 50_100)), 50, region=region)
    java.write(path, back, java_opts(table_type, **RECORD_INDEX))
    expected.apply(back)
    all_agree(spark, path, java, expected)
    assert_index_exact(path, version)


def test_lookup_reads_only_the_file_groups_the_index_names(spark, tmp_path, java_hudi_11):
    """A table of 40 file groups; a batch updating keys of two of them: the record index names
    exactly those two (the lookup reads nothing else), and keys the table lacks name none."""
    path = tmp_path / "wide"
    first = events(range(4000), 1, region=lambda i: f"day {i % 40:02d}")
    java_hudi_11.write(path, first, java_opts("COPY_ON_WRITE", **RECORD_INDEX))
    storage = open_storage(StorageSpec(str(path), ()))
    spec = MetadataTable(storage, 9).record_index_spec(Timeline.load(storage, 2))
    places = table_locations(path)
    assert len(set(places.values())) == 40
    wanted = [k for day in ("03", "17") for k in [k for k, (p, _) in places.items() if p == f"region=day {day}"][:25]]
    found = ri.lookup(spark, spec, spark.createDataFrame([(k,) for k in wanted + ["no-such-key", "999999"]], "_k string"))
    assert found == {places[k] for k in wanted} and len(found) == 2
    assert ri.lookup(spark, spec, spark.createDataFrame([("nope",)], "_k string")) == set()


def test_operations_the_index_does_not_follow_drop_it_and_java_builds_it_again(spark, tmp_path, java_hudi_11):
    """A bulk_insert or an insert_overwrite moves keys pipe does not name one by one: the write
    drops the record index (properties first, then its folder), as Java drops a disabled index,
    and Java's next RECORD_INDEX write builds it again from the table."""
    path = tmp_path / "events"
    expected = Expected()
    first = events(range(1000), 1)
    java_hudi_11.write(path, first, java_opts("MERGE_ON_READ", **RECORD_INDEX))
    expected.apply(first)
    more = events(range(5000, 5300), 2)
    Table.open(spark, str(path)).write(pipe_df(spark, more), "bulk_insert")
    expected.apply(more)
    assert not (path / ".hoodie" / "metadata" / "record_index").exists() or not record_index_logs(path)
    assert "record_index" not in (path / ".hoodie" / "hoodie.properties").read_text()
    back = events(range(0, 6000, 5), 3)
    java_hudi_11.write(path, back, java_opts("MERGE_ON_READ", **RECORD_INDEX))
    expected.apply(back)
    all_agree(spark, path, java_hudi_11, expected)
    assert_index_exact(path, 9)


def test_a_failed_write_leaves_no_record_index_log_behind(spark, tmp_path, java_hudi_11, monkeypatch):
    """A write that fails after the record index's logs are written (before the data commit):
    its rollback deletes them with its metadata deltacommit; the index stays exact."""
    from runtime.table import services

    path = tmp_path / "events"
    expected = Expected()
    first = events(range(800), 1)
    java_hudi_11.write(path, first, java_opts("COPY_ON_WRITE", **RECORD_INDEX))
    expected.apply(first)
    before = set(record_index_logs(path))

    def boom(point: str) -> None:
        if point == "metadata_table_before_commit":
            raise RuntimeError("killed")

    monkeypatch.setattr(services, "fault", boom)
    with pytest.raises(RuntimeError, match="killed"):
        Table.open(spark, str(path)).write(pipe_df(spark, events(range(700, 900), 2)), "upsert")
    monkeypatch.undo()
    Table.open(spark, str(path)).rollback_pending()
    assert set(record_index_logs(path)) == before
    assert_index_exact(path, 9)
    batch = events(range(700, 900), 3)
    Table.open(spark, str(path)).write(pipe_df(spark, batch), "upsert")
    expected.apply(batch)
    assert_index_exact(path, 9)
    all_agree(spark, path, java_hudi_11, expected)


def test_index_groups_hold_only_keys_hashed_to_them(tmp_path):
    """Sanity of the grouping on many keys: the keys spread over every group."""
    keys = [f"order-{i:012d}" for i in range(20_000)]
    counts = collections.Counter(int(g) for g in ri.file_groups_of(keys, 10))
    assert set(counts) == set(range(10)) and min(counts.values()) > 1000


# --- pipe's own tables: `index: record` ---------------------------------------------------------

PROJECT = {
    "sources/raw.yml": """
        sources:
          raw:
            kind: files
            path: data/raw
            format: json
            schema: "order_id STRING, region STRING, ts BIGINT, amount DECIMAL(12,2), note STRING, deleted BOOLEAN"
        """,
    "tables/orders.yml": """
        tables:
          orders:
            type: {type}
            key: [order_id, region]
            precombine: ts
            partition_by: [region]
            index: record
            table_version: {version}
            delete_when: deleted
            small_file_limit: 0
        """,
    "tables/orders.sql": "select * from {{ source('raw') }}",
}


@pytest.mark.parametrize("table_type,version", [("copy_on_write", 6), ("merge_on_read", 9)])
def test_a_project_table_with_index_record_builds_and_keeps_its_record_index(spark, tmp_path, capsys, java_hudi_11, table_type, version):
    """`index: record` on a composite-key table: the first run builds the metadata table and
    its record index, every run keeps it exact (updates, deletes, keys moving region, accents
    and quotes in keys, epoch-millis orderings), and Java 1.1 reads the table and writes through
    the index (RECORD_INDEX) without a key twice."""
    import random
    from decimal import Decimal

    from tests.test_run import assert_clean, pipe, project, run_results, write_jsonl

    files = {k: v.replace("{type}", table_type).replace("{version}", str(version)) for k, v in PROJECT.items()}
    root = project(tmp_path, files)
    rng = random.Random(11)
    regions = ["EU", "US", "São Paulo", "it's"]
    model: dict[tuple[str, str], dict] = {}
    for round_ in range(6):
        rows = []
        for key in rng.sample(sorted(model), k=min(len(model), 150)):
            old = model[key]
            rows.append({**old, "ts": 1_732_000_000_000 + round_ * 1000 + rng.randrange(999), "amount": f"{rng.randrange(10**7) / 100:.2f}",
                         "deleted": rng.random() < 0.15})
        for i in range(400):
            rows.append({"order_id": f"o-{round_:02d}-{i:05d}-é", "region": rng.choice(regions), "ts": 1_732_000_000_000 + round_ * 1000,
                         "amount": f"{rng.randrange(10**7) / 100:.2f}", "note": rng.choice(["a \"quote\"", None, "plain"]), "deleted": False})
        for r in rows:
            key = (r["order_id"], r["region"])
            if r["deleted"]:
                model.pop(key, None)
            else:
                model[key] = r
        write_jsonl(root / f"data/raw/round-{round_}.json", rows)
        path = root / "lake" / "orders"
        if round_ == 3:  # a full refresh replaces every file group: it drops the index, the next run builds it again
            code, out, err = pipe(capsys, root, "run", "--full-refresh")
            assert code == 0, f"round {round_}:\n{out}\n{err}"
            assert "record_index" not in (path / ".hoodie" / "hoodie.properties").read_text()
            got = {(r["order_id"], r["region"]) for r in Table.open(spark, str(path)).read(meta=False).collect()}
            assert got == set(model)
            more = [{**model[k], "ts": model[k]["ts"] + 500, "amount": "7.77"} for k in sorted(model)[:20]]
            for r in more:
                model[(r["order_id"], r["region"])] = r
            write_jsonl(root / f"data/raw/round-{round_}b.json", more)
        code, out, err = pipe(capsys, root, "run")
        assert code == 0, f"round {round_}:\n{out}\n{err}"
        assert_clean(out, err)
        assert run_results(root)["success"] is True
        index = assert_index_exact(path, version)
        assert len(index) == len(model), f"round {round_}"
        got = {(r["order_id"], r["region"]): Decimal(r["amount"]) for r in Table.open(spark, str(path)).read(meta=False).collect()}
        assert got == {k: Decimal(v["amount"]) for k, v in model.items()}, f"round {round_}"
    java_opts_ = {"hoodie.table.name": "orders", "hoodie.datasource.write.operation": "upsert",
                  "hoodie.datasource.write.table.type": table_type.upper(), "hoodie.datasource.write.recordkey.field": "order_id,region",
                  "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
                  "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.ComplexKeyGenerator", **RECORD_INDEX}
    if version < 8:
        java_opts_["hoodie.write.table.version"] = "6"
        java_opts_["hoodie.write.auto.upgrade"] = "false"
    import pyarrow as pa

    again = [dict(v, ts=v["ts"] + 10_000, amount="1.00") for v in list(model.values())[:200]]
    batch = pa.Table.from_pylist([{**r, "amount": Decimal(r["amount"])} for r in again],
                                 schema=pa.schema([("order_id", pa.string()), ("region", pa.string()), ("ts", pa.int64()),
                                                   ("amount", pa.decimal128(12, 2)), ("note", pa.string()), ("deleted", pa.bool_())]))
    java_hudi_11.write(path, batch, java_opts_)
    for r in again:
        model[(r["order_id"], r["region"])] = r
    keys = [r["_hoodie_record_key"] for r in Table.open(spark, str(path)).read().select("_hoodie_record_key").collect()]
    assert len(keys) == len(set(keys)) == len(model)
    assert_index_exact(path, version)


def test_index_record_settings_are_checked_with_their_line(tmp_path):
    """A keyless `index: record` and one with `metadata_table: false` are compile errors at their
    line; `index: record` alone turns the metadata table on in the plan's table definition."""
    from runtime.steps.write import table_config
    from compiler.api import compile_project
    from compiler.errors import ProjectError
    from tests.conftest import write_project

    def errors(yml: str) -> list[str]:
        root = write_project(tmp_path / str(abs(hash(yml))), {
            "sources/s.yml": "sources:\n  raw: {kind: files, path: data, format: json, schema: \"id BIGINT, v STRING\"}\n",
            "tables/t.yml": yml, "tables/t.sql": "select * from {{ source('raw') }}\n"})
        try:
            compile_project(root)
        except ProjectError as exc:
            return [str(d) for d in exc.diagnostics]
        return []

    got = errors("tables:\n  t:\n    index: record\n")
    assert any("t.yml:3" in e and "index: record" in e and "needs a key" in e for e in got), got
    got = errors("tables:\n  t:\n    key: [id]\n    metadata_table: false\n    index: record\n")
    assert any("t.yml:4" in e and "metadata_table: false" in e for e in got), got
    got = errors("tables:\n  t:\n    key: [id]\n    operation: insert\n    index: record\n")
    assert any("insert_duplicates drop or fail" in e for e in got), got
    assert errors("tables:\n  t:\n    key: [id]\n    operation: insert\n    insert_duplicates: drop\n    index: record\n") == []
    got = errors("tables:\n  t:\n    key: [id]\n    operation: insert_overwrite\n    index: record\n")
    assert any("t.yml:5" in e and "would drop the index" in e for e in got), got
    assert errors("tables:\n  t:\n    key: [id]\n    index: record\n") == []

    class Step:
        name = "t"

    config = {"type": "copy_on_write", "key": ["id"], "partition_by": [], "hive_style_partitioning": True, "index": "record"}
    table = table_config(Step(), config)
    assert table.metadata_table and table.record_index


def test_a_table_holding_a_key_twice_gets_no_record_index_and_says_how_to_fix_it(spark, tmp_path):
    """bulk_insert keeps a batch's copies of a key; a record index names one place per key, so
    asking for one on such a table is refused before anything is written, naming the key and
    the way out; after a full rebuild (combined by key) the index is built and exact."""
    from runtime.table import TableConfig
    from runtime.table.errors import TableError

    path = tmp_path / "twice"
    config = TableConfig("twice", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    rows = [(i, "EU" if i % 2 else "US", 1_732_000_000_000 + i, f"v{i}") for i in range(200)] + [(7, "US", 1_732_000_000_999, "copy")]
    df = spark.createDataFrame(rows, "id bigint, region string, ts bigint, v string")
    Table.create(spark, str(path), config).write(df, "bulk_insert")
    before = sorted(str(p) for p in path.rglob("*") if p.is_file())
    wanting = Table.create(spark, str(path), TableConfig("twice", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts",
                                                          metadata_table=True, record_index=True))
    with pytest.raises(TableError, match=r"key\(s\) '7' more than once") as info:
        wanting.write(spark.createDataFrame([(1, "EU", 1_732_000_001_000, "new")], "id bigint, region string, ts bigint, v string"), "upsert")
    assert "--full-refresh" in info.value.hint
    assert not [p for p in sorted(str(p) for p in path.rglob("*") if p.is_file()) if p not in before and "/metadata/" not in p
                and ".hoodie/.aux" not in p and "/.temp" not in p and "lock" not in p]
    assert len(hudi_rs(path)) == 201  # nothing written
    wanting.write(df, "insert_overwrite_table", combine_before_insert=True)
    wanting.write(spark.createDataFrame([(1, "EU", 1_732_000_001_000, "new")], "id bigint, region string, ts bigint, v string"), "upsert")
    assert len(assert_index_exact(path, 6)) == 200
