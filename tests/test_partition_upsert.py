"""Upserts and deletes with `index: partition` settled in one task per partition
(runtime/table/partition_upsert.py) write exactly what the general path (dedupe and lookup
joins in Spark) writes: the same rows, as hudi-rs reads them, the same counts and the same
file groups per partition, on copy-on-write and merge-on-read tables. So do global-index
upserts whose keys cannot be in another partition (writer._keys_stay_put)."""

from __future__ import annotations

import hudi
import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig
from runtime.table import partition_upsert, writer
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ

SCHEMA = "id long, region string, ts long, v string"
DELETES = "id long, region string, ts long, v string, _hoodie_is_deleted boolean"


def hudi_rows(path) -> list[tuple]:
    batches = hudi.HudiTableBuilder.from_base_uri(str(path)).build().read()
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    # NaN as text: it is unequal to itself
    return sorted((r["id"], r["region"], "NaN" if r["ts"] != r["ts"] else r["ts"], r["v"], r["_hoodie_partition_path"]) for r in rows)


def groups_per_partition(table) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in table.view().latest_slices():
        out[s.partition] = out.get(s.partition, 0) + 1
    return out


@pytest.fixture()
def spy(monkeypatch):
    """Counts the writes that took the partition-task path."""
    calls = []
    real = writer._upsert_by_partition

    def counted(*args, **kwargs):
        calls.append(args[1].config.name)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "_upsert_by_partition", counted)
    return calls


class Pair:
    """Two identical tables: one written by the general path, one by partition tasks."""

    def __init__(self, spark, tmp_path, monkeypatch, table_type, index="partition", **options):
        self.spark, self.monkeypatch, self.options, self.index = spark, monkeypatch, options, index
        config = dict(record_key_fields=("id",), partition_fields=("region",), precombine_field="ts", table_type=table_type)
        self.general = Table.create(spark, str(tmp_path / "general"), TableConfig(name="general", **config))
        self.tasks = Table.create(spark, str(tmp_path / "tasks"), TableConfig(name="tasks", **config))

    def write(self, rows, schema=SCHEMA, operation="upsert"):
        df = self.spark.createDataFrame(rows, schema)
        with self.monkeypatch.context() as m:
            m.setattr(partition_upsert, "PARTITION_TASK_ROWS", 0)  # no partition fits: the general path
            a = self.general.write(df, operation, index=self.index, **self.options)
        b = self.tasks.write(df, operation, index=self.index, **self.options)
        assert (b.inserts, b.updates, b.deletes) == (a.inserts, a.updates, a.deletes)
        assert hudi_rows(self.tasks.storage.full_path("")) == hudi_rows(self.general.storage.full_path(""))
        assert groups_per_partition(self.tasks) == groups_per_partition(self.general)
        return b

    def rows(self):
        return hudi_rows(self.tasks.storage.full_path(""))


def counted_writes(pair, spy):
    """A write into `pair`, and the list it fills: per write, 1 when the partition tasks took it."""
    took = []

    def write(rows, schema=SCHEMA, operation="upsert"):
        before = len(spy)
        result = pair.write(rows, schema, operation)
        took.append(len(spy) - before)
        return result

    return write, took


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_partition_tasks_write_what_the_general_path_writes(spark, tmp_path, monkeypatch, spy, table_type):
    pair = Pair(spark, tmp_path, monkeypatch, table_type)
    # a batch with duplicates: the largest ts wins, a tie goes to the later row, null ts loses
    first = pair.write([(1, "EU", 5, "a"), (1, "EU", 7, "a-later"), (1, "EU", 7, "a-tie-later"), (2, "EU", None, "b-null"),
                        (2, "EU", 1, "b"), (3, "US", 4, "c"), (4, None, 1, "d"), (5, "US", None, "e-null-only")])
    assert (first.inserts, first.updates, first.deletes) == (5, 0, 0)
    assert pair.rows() == [(1, "EU", 7, "a-tie-later", "region=EU"), (2, "EU", 1, "b", "region=EU"), (3, "US", 4, "c", "region=US"),
                           (4, None, 1, "d", "region=__HIVE_DEFAULT_PARTITION__"), (5, "US", None, "e-null-only", "region=US")]
    # stale (smaller ts) and null-ts rows lose to stored ones; equal ts wins; a new key inserts;
    # the same key in another partition is another row under the partition index
    second = pair.write([(1, "EU", 6, "a-stale"), (2, "EU", 1, "b-equal"), (3, "US", None, "c-null"), (5, "US", 3, "e-over-null"),
                         (6, "EU", 1, "f"), (1, "US", 1, "a-in-us")])
    assert (second.inserts, second.updates, second.deletes) == (2, 2, 0)
    assert pair.rows() == [(1, "EU", 7, "a-tie-later", "region=EU"), (1, "US", 1, "a-in-us", "region=US"), (2, "EU", 1, "b-equal", "region=EU"),
                           (3, "US", 4, "c", "region=US"), (4, None, 1, "d", "region=__HIVE_DEFAULT_PARTITION__"),
                           (5, "US", 3, "e-over-null", "region=US"), (6, "EU", 1, "f", "region=EU")]
    # deletes as rows: a stale delete is ignored, a delete of an unknown key does nothing
    third = pair.write([(2, "EU", 9, None, True), (3, "US", 0, None, True), (99, "EU", 1, None, True), (6, "EU", 2, "f2", False)], DELETES)
    assert (third.inserts, third.updates, third.deletes) == (0, 1, 1)
    # the delete operation, by key and partition; deleting a group's last row
    pair.write([(4, None), (1, "US"), (6, "US")], "id long, region string", operation="delete")
    assert pair.rows() == [(1, "EU", 7, "a-tie-later", "region=EU"), (3, "US", 4, "c", "region=US"), (5, "US", 3, "e-over-null", "region=US"),
                           (6, "EU", 2, "f2", "region=EU")]
    assert len(spy) == 4


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
@pytest.mark.parametrize("written_by", ["partition tasks", "write tasks"])
def test_partition_tasks_fill_small_files_then_open_groups_like_the_general_path(spark, tmp_path, monkeypatch, spy, table_type, written_by):
    """Partition tasks write the groups they touched themselves (on local[2], a batch of one
    partition on two threads); on a cluster with fewer partitions than cores they hand the
    rows to write tasks after a shuffle by file id instead. Both write what the general path
    writes."""
    if written_by == "write tasks":
        monkeypatch.setattr(writer, "_partition_tasks", lambda spark, partitions: (partitions, None))
    # about 40 rows a file: inserts fill the small file first, then new groups open
    pair = Pair(spark, tmp_path, monkeypatch, table_type, max_file_size=40 * 64, small_file_limit=30 * 64, record_size_estimate=64)
    pair.write([(i, "EU", 1, f"v{i}") for i in range(10)])
    pair.write([(i, "EU", 1, f"v{i}") for i in range(10, 130)] + [(i, "US", 1, "u") for i in range(5)])
    pair.write([(i, "EU", 2, f"w{i}") for i in range(0, 130, 7)] + [(i, "EU", 2, "new") for i in range(500, 560)])
    assert len(pair.rows()) == 130 + 5 + 60
    assert groups_per_partition(pair.tasks)["region=EU"] > 2
    assert len(spy) == 3


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_global_upsert_whose_keys_stay_put_is_decided_in_partition_tasks(spark, tmp_path, monkeypatch, spy, table_type):
    """The global index (pipe's default) in a table partitioned by day whose keys grow: when the
    batch's key range in each partition meets no other partition's range nor any stored file of
    another partition, no key can be stored elsewhere, and partition tasks decide the batch with
    the general path's rows, counts and groups. A batch that moves a key, or whose partitions'
    ranges interleave, goes the general way. Merge-on-read slices with log files that took no
    new key (pipe's, as Java's bloom and simple indexes write them) keep every key in their base
    file's footer. Each key stays once in the table."""
    pair = Pair(spark, tmp_path, monkeypatch, table_type, index="global")
    write, took = counted_writes(pair, spy)

    def day(d, ns, ts=1, v="v"):
        return [(d * 100_000 + n, f"d{d}", ts, f"{v}{n}") for n in ns]

    first = write(day(1, range(1000)) + day(2, range(1000)))
    assert (first.inserts, first.updates) == (2000, 0)
    # updates of day 2 (every fifth one stale: older than stored), new keys of day 3
    second = write([(k, r, 0 if k % 5 == 0 else 2, v) for k, r, _, v in day(2, range(500), v="u")] + day(3, range(1000)))
    assert (second.inserts, second.updates) == (1000, 400)
    # deletes as rows in day 1, new keys of day 4
    third = write([(k, r, 5, None, True) for k, r, _, _ in day(1, range(100))] + [(k, r, 1, v, False) for k, r, _, v in day(4, range(300))],
                  DELETES)
    assert (third.inserts, third.deletes) == (300, 100)
    # key 100500 of day 1 comes in under day 3: a move (day 3's range now meets day 1's file)
    fourth = write([(100_500, "d3", 9, "moved")] + day(3, range(0, 1000, 10), ts=3, v="w"))
    assert (fourth.inserts, fourth.updates, fourth.deletes) == (1, 100, 1)
    # days 5 and 6 interleave: keys 500050..500099 arrive under both, the larger ts wins, once
    fifth = write(day(5, range(100), ts=1) + [(500_000 + n, "d6", 2, f"six{n}") for n in range(50, 150)])
    assert fifth.inserts == 150
    # after the move, day 3's file spans days 1 to 3; updates of day 4 and new keys of day 7 meet none of them
    sixth = write(day(4, range(0, 300, 3), ts=4, v="x") + day(7, range(200)))
    assert (sixth.inserts, sixth.updates) == (200, 100)
    pair.write([(400_000 + n, "d4") for n in range(0, 300, 2)], "id long, region string", operation="delete")
    rows = pair.rows()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == 2000 + 1000 - 100 + 300 + 150 + 200 - 150
    assert [r for r in rows if r[0] == 100_500] == [(100_500, "d3", 9, "moved", "region=d3")]
    assert {r[1] for r in rows if 500_050 <= r[0] < 500_100} == {"d6"}
    # (merge-on-read: day 2's updates went to a log file, which took no new key, so the base
    # file's footer still names every key of its slice)
    assert took == [1, 1, 1, 0, 0, 1]


def test_a_global_upsert_whose_keys_the_bloom_filters_keep_in_place_is_decided_in_partition_tasks(spark, tmp_path, monkeypatch, spy):
    """Keys numbered across partitions (part = id % 4, as many tables are): by their text every
    file's key range spans every partition's batch, so only the files' bloom filters can show
    that no key of the batch is stored in another partition. Such a batch (updates, stale rows,
    deletes, new keys, thousands of rows, round after round) is decided in partition tasks;
    one that moves a key goes the general way, which the asked filters still prune. Each key
    stays once, and both paths write the same rows."""
    from runtime.table import bloom_index

    asked = []
    real = bloom_index.crossing_candidates

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        asked.append((*out, kwargs.get("one_task")))
        return out

    monkeypatch.setattr(bloom_index, "crossing_candidates", counted)
    pair = Pair(spark, tmp_path, monkeypatch, COPY_ON_WRITE, index="global")
    write, took = counted_writes(pair, spy)

    def part(i):
        return f"p{i % 4}"

    write([(i, part(i), 1, f"v{i}") for i in range(4000)])
    for round_ in range(2, 5):  # updates (every third one stale), new keys, all in p1 or p2
        rows = [(i, part(i), round_ if i % 3 else 0, f"r{round_}-{i}") for i in range(1, 4000, 4)]
        rows += [(i, part(i), round_, f"r{round_}-{i}") for i in range(2, 4000, 8)]
        rows += [(10_000 * round_ + i, part(i), round_, "new") for i in range(1, 400, 4)]
        result = write(rows)
        fresh = sum(1 for i in range(1, 4000, 4) if i % 3) + 500  # the stale rows change nothing
        assert (result.inserts, result.updates) == (100, fresh)
    # deletes as rows in p3
    result = write([(i, part(i), 9, None, True) for i in range(3, 600, 4)], DELETES)
    assert result.deletes == 150
    # a new key comes in both p1 and p2: the shuffle by key sees it, and it is inserted once
    monkeypatch.setattr(bloom_index, "ONE_TASK_KEYS", 0)  # (as a batch of more than 10,000 keys)
    result = write([(90_001, "p1", 1, "a"), (90_001, "p2", 2, "b")] + [(i, part(i), 8, "u") for i in range(1, 200, 4)])
    assert (result.inserts, result.updates) == (1, 50)
    monkeypatch.undo()
    monkeypatch.setattr(bloom_index, "crossing_candidates", counted)
    # and in the one task that asks a small batch's keys (no shuffle)
    result = write([(90_002, "p2", 2, "b"), (90_002, "p1", 1, "a")] + [(i, part(i), 8, "u") for i in range(1, 200, 4)])
    assert (result.inserts, result.updates) == (1, 50)
    # key 5 (stored in p1) comes in under p2: its file's filter says it may move
    result = write([(5, "p2", 9, "moved")] + [(i, part(i), 9, "w") for i in range(2, 200, 4)])
    assert (result.inserts, result.updates, result.deletes) == (1, 50, 1)
    assert took == [0, 1, 1, 1, 1, 0, 0, 0]  # (the first write, into an empty table, goes the general way)
    assert len(asked) == 7 and all(crossing == set() and not twice for _, crossing, twice, _ in asked[:4])
    assert asked[4][2] and not asked[4][1] and asked[5][2] and not asked[5][1] and asked[6][1] and not asked[6][2]
    assert [one_task for *_, one_task in asked] == [True] * 4 + [False] + [True] * 2
    # the general way read only the files the filters named: those of p1 and p2
    assert {p for p, _ in asked[-1][0]} == {"region=p1", "region=p2"}
    rows = pair.rows()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == 4000 + 300 - 150 + 2
    assert [r for r in rows if r[0] == 90_001] == [(90_001, "p2", 2, "b", "region=p2")]
    assert [r for r in rows if r[0] == 90_002] == [(90_002, "p2", 2, "b", "region=p2")]
    assert [r for r in rows if r[0] == 5] == [(5, "p2", 9, "moved", "region=p2")]
    # (201 % 3 == 0: stale in every round)
    assert [r for r in rows if r[0] in (1, 201, 205)] == [(1, "p1", 8, "u", "region=p1"), (201, "p1", 1, "v201", "region=p1"), (205, "p1", 4, "r4-205", "region=p1")]
    assert not [r for r in rows if r[0] in (3, 7, 599)]  # deleted


def test_a_bloom_filters_false_positive_is_checked_against_the_files_keys(spark, tmp_path, monkeypatch, spy):
    """Hudi's bloom filters answer yes for keys they do not hold far more often than their
    nominal rate (1 in 10^9) when keys differ in a few digits. A batch whose new key is such a
    false positive for another partition's file still stays in partition tasks: the crossing
    task reads that file's keys (bloom_index._stored_keys) and finds the key is not there."""
    import pyarrow.parquet as pq

    from runtime.table.bloom import footer_bloom_filter, key_positions

    pair = Pair(spark, tmp_path, monkeypatch, COPY_ON_WRITE, index="global")
    write, took = counted_writes(pair, spy)
    # 50,000 keys in region a (2, 22, 42, ...), 3,000 in region b (3, 23, 43, ...)
    write([(i, "a", 1, f"v{i}") for i in range(2, 1_000_000, 20)] + [(i, "b", 1, f"v{i}") for i in range(3, 60_000, 20)])
    a_file = next(s for s in pair.tasks.view().latest_slices() if s.partition == "region=a").base_file
    bloom = footer_bloom_filter(pq.read_metadata(pair.tasks.storage.full_path(a_file.path)).metadata)
    others = pa.array([str(i) for i in range(60_003, 3_000_000, 10)])  # keys in no file
    hits = bloom.might_contain_at(key_positions(others, bloom.hash_count, bloom.vector_size))
    assert hits.sum() >= 1  # (a few of these 294,000)
    fake = int(others[int(hits.nonzero()[0][0])].as_py())  # the first false positive of region a's filter
    result = write([(fake, "b", 2, "false positive")] + [(i, "b", 2, "u") for i in range(3, 20_003, 20)])
    assert (result.inserts, result.updates) == (1, 1000)
    assert took == [0, 1]
    rows = pair.rows()
    assert len(rows) == 53_001 and [r for r in rows if r[0] == fake] == [(fake, "b", 2, "false positive", "region=b")]


def test_log_files_that_took_new_keys_send_a_global_upsert_the_general_way(spark, tmp_path, monkeypatch, spy):
    """A merge-on-read slice whose log files took new keys (Java's indexes that index logs and
    Flink write them; their deltacommit's write stats say so) has keys its base file's footer
    does not hold: a global upsert must look them up as readers see them, the general way.
    Here another writer's deltacommit is stood for by raising numInserts in pipe's own stats."""
    import json

    from runtime.table.timeline import Timeline

    pair = Pair(spark, tmp_path, monkeypatch, MERGE_ON_READ, index="global")
    write, took = counted_writes(pair, spy)

    write([(i, f"p{i % 4}", 1, f"v{i}") for i in range(2000)])
    write([(i, f"p{i % 4}", 2, f"u{i}") for i in range(1, 2000, 4)])  # updates of p1: a log file per group
    write([(i, f"p{i % 4}", 3, f"w{i}") for i in range(2, 2000, 4)])  # their logs took no new key: partition tasks
    assert took == [0, 1, 1]
    for table in (pair.general, pair.tasks):
        timeline = Timeline.load(table.storage)
        latest = timeline.completed(("deltacommit",))[-1]
        path = table.storage.full_path(timeline.path(latest))
        meta = json.loads(open(path).read())
        logs = [st for stats in meta["partitionToWriteStats"].values() for st in stats if ".log." in st["path"]]
        assert logs
        for st in logs:
            st["numInserts"] = 1
        open(path, "w").write(json.dumps(meta))
    result = write([(i, f"p{i % 4}", 4, f"x{i}") for i in range(2, 2000, 8)])
    assert took == [0, 1, 1, 0] and result.updates == 250
    assert len({r[0] for r in pair.rows()}) == len(pair.rows()) == 2000


def test_a_partition_too_large_for_one_task_goes_the_general_way(spark, tmp_path, monkeypatch, spy):
    table = Table.create(spark, str(tmp_path / "t"), TableConfig(name="t", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts"))
    monkeypatch.setattr(partition_upsert, "PARTITION_TASK_ROWS", 3)
    table.write(spark.createDataFrame([(1, "EU", 1, "a"), (2, "US", 1, "b"), (3, "US", 1, "c")], SCHEMA), "upsert", index="partition")
    assert spy == ["t"]
    table.write(spark.createDataFrame([(i, "EU", 2, "x") for i in range(4)], SCHEMA), "upsert", index="partition")
    assert spy == ["t"]  # 4 rows in region=EU: more than a task takes
    # the global index takes the partition tasks only when no key can be in another partition:
    # key 2 may be in region=US (whose file holds keys 2 and 3), key 1 may not
    table.write(spark.createDataFrame([(2, "EU", 3, "z")], SCHEMA), "upsert")
    assert spy == ["t"]
    table.write(spark.createDataFrame([(1, "EU", 3, "y")], SCHEMA), "upsert")
    assert spy == ["t", "t"]
    # (the global upsert of key 2 also removed its region=US copy: keys are unique across the table)
    assert hudi_rows(str(tmp_path / "t")) == [(0, "EU", 2, "x", "region=EU"), (1, "EU", 3, "y", "region=EU"), (2, "EU", 3, "z", "region=EU"),
                                              (3, "EU", 2, "x", "region=EU"), (3, "US", 1, "c", "region=US")]


def test_new_file_ids_are_the_same_when_a_task_runs_again():
    a = partition_upsert.new_file_id("20260101000000000", "region=EU", 0)
    assert a == partition_upsert.new_file_id("20260101000000000", "region=EU", 0)
    assert a.endswith("-0") and len(a) == 38
    assert a != partition_upsert.new_file_id("20260101000000000", "region=EU", 1)
    assert a != partition_upsert.new_file_id("20260101000000000", "region=US", 0)


@pytest.mark.parametrize("table_type", [COPY_ON_WRITE, MERGE_ON_READ])
def test_a_nan_precombine_value_compares_as_spark_compares_it(spark, tmp_path, monkeypatch, spy, table_type):
    """Spark orders NaN above every number and equal to NaN: an incoming NaN is not older than
    a stored 5.0 or a stored NaN (Arrow's comparisons of NaN are false)."""
    pair = Pair(spark, tmp_path, monkeypatch, table_type)
    schema = "id long, region string, ts double, v string"
    pair.write([(1, "EU", 5.0, "a"), (2, "EU", float("nan"), "b"), (3, "EU", float("nan"), "c")], schema)
    second = pair.write([(1, "EU", float("nan"), "a-nan"), (2, "EU", float("nan"), "b-nan"), (3, "EU", 9.0, "c-stale")], schema)
    assert (second.inserts, second.updates, second.deletes) == (0, 2, 0)
    assert [(r[0], r[3]) for r in pair.rows()] == [(1, "a-nan"), (2, "b-nan"), (3, "c")]
    assert len(spy) == 2


def test_partition_tasks_write_on_threads_only_with_cores_to_spare():
    tasks = writer.partition_tasks
    # (tasks, groups each writes at once) for a batch of 1, 2, 3, 4 partitions on 4 cores
    assert [tasks("local[4]", 4, None, n) for n in (1, 2, 3, 4)] == [(1, 4), (2, 2), (3, 1), (4, 1)]
    # more partitions than cores, fewer than twice as many: a task per core writes its
    # partitions' groups on two threads, all at once (3 on 2 cores: not two, then one while a
    # core idles); with more, as many tasks as partitions (up to 4 per core), one group each
    assert tasks("local[2]", 2, None, 3) == (2, 2) and tasks("local[4]", 4, None, 7) == (4, 2)
    assert tasks("local[4]", 4, None, 8) == (8, 1) and tasks("local[4]", 4, None, 17) == (16, 1)
    assert tasks("local[16]", 16, None, 1) == (1, writer.MAX_GROUP_THREADS)  # several steps may run at once
    assert tasks("local[4]", 4, "1g", 1) == (1, 1) and tasks("local[2]", 2, "1g", 3) == (3, 1)  # one Python worker's memory cap for all its threads
    # a cluster: fewer tasks than cores hand their rows to write tasks all over it
    assert tasks("spark://host:7077", 64, None, 64) == (64, 1) and tasks("yarn", 64, None, 3) == (3, None)


def test_a_partition_task_writes_several_file_groups_at_once(tmp_path):
    """With cores to spare (fewer partitions in the batch than cores) a partition task writes
    its file groups on threads: every group gets its file, sequence numbers stay unique in the
    task, and a group that fails leaves no unfinished file behind once the others stop."""
    import pyarrow.parquet as pq

    from runtime.table.files import KIND, FileWriteSpec, write_groups_task

    spec = FileWriteSpec(storage_uri=str(tmp_path), storage_options=(), instant="20260101000000000", data_columns=("id", "v"), mode="groups")

    def group(n: int, first: int):
        ids = list(range(first, first + n))
        return pa.table({"id": ids, "v": [f"v{i}" for i in ids], "_hoodie_record_key": [str(i) for i in ids], KIND: ["I"] * n})

    groups = [("region=EU", f"0000000{g}-0000-0000-0000-000000000000-0", group(500, g * 1000)) for g in range(5)]
    stats = pa.Table.from_batches(list(write_groups_task(spec, iter(groups), threads=3))).to_pylist()
    assert sorted((s["file_id"], s["rows"], s["inserts"]) for s in stats) == [(fid, 500, 500) for _, fid, _ in groups]
    seqnos = []
    for s in stats:
        written = pq.read_table(tmp_path / s["path"])
        assert written.column("_hoodie_file_name").to_pylist() == [s["path"].rsplit("/", 1)[1]] * 500
        seqnos += written.column("_hoodie_commit_seqno").to_pylist()
    assert len(set(seqnos)) == 2500

    broken = tmp_path / "broken"
    spec = FileWriteSpec(storage_uri=str(broken), storage_options=(), instant="20260101000000001", data_columns=("id", "v"), mode="groups")
    bad = group(10, 0).drop_columns(["v"])  # a data column missing: the task fails
    with pytest.raises(KeyError):
        list(write_groups_task(spec, iter(groups[:2] + [("region=EU", "bad-0", bad)] + groups[2:]), threads=3))
    assert not [p.name for p in broken.rglob("*.tmp")]
