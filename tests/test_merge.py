"""Merge-on-read file slices: which log files a slice has, and how its base rows and log blocks
merge (HUDI_FORMAT 6.4, 6.5). Log files are built with logfile.py's encoders on disk; the merge
runs as it does in a Spark task, without Spark."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.storage import StorageSpec, open_storage
from runtime.table import logfile as L
from runtime.table.config import APPEND_ONLY, COMMIT_TIME, EVENT_TIME
from runtime.table.errors import TableError
from runtime.table.layout import FileSystemView, InstantValidity
from runtime.table.merge import MergeSpec, merge_slice
from runtime.table.timeline import Timeline

FID = "0f0f0f0f-1111-2222-3333-444444444444-0"
BASE = "20260101000000000"
C1, C2, C3, C4 = "20260101000000100", "20260101000000200", "20260101000000300", "20260101000000400"
SCHEMA = pa.schema([(c, pa.string()) for c in ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key",
                                                "_hoodie_partition_path", "_hoodie_file_name")] + [("v", pa.string()), ("ts", pa.int64())])
SCHEMA_JSON = '{"type":"record","name":"t_record","fields":[{"name":"v","type":["null","string"]},{"name":"ts","type":["null","long"]}]}'


def rows(instant: str, *versions: tuple[str, str, int | None]) -> pa.Table:
    """(key, value, ordering) rows written at `instant`."""
    n = len(versions)
    return pa.Table.from_pylist([
        {"_hoodie_commit_time": instant, "_hoodie_commit_seqno": f"{instant}_0_{i}", "_hoodie_record_key": k,
         "_hoodie_partition_path": "p", "_hoodie_file_name": FID, "v": v, "ts": ts}
        for i, (k, v, ts) in enumerate(versions)
    ], schema=SCHEMA) if n else SCHEMA.empty_table()


def write_base(root, table: pa.Table) -> str:
    path = f"p/{FID}_0-1-1_{BASE}.parquet"
    (root / "p").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / path)
    return path


def write_log(root, version: int, *blocks: L.Block) -> str:
    path = f"p/.{FID}_{BASE}.log.{version}_0-1-1"
    (root / "p").mkdir(parents=True, exist_ok=True)
    (root / path).write_bytes(b"".join(L.encode_block(b) for b in blocks))
    return path


def update(instant: str, *versions) -> L.Block:
    return L.parquet_block(instant, SCHEMA_JSON, rows(instant, *versions))


def merged(root, base: str | None, logs: list[str], mode: str = EVENT_TIME, committed=(BASE, C1, C2, C3, C4),
           since: str | None = None, until: str | None = None) -> dict[str, tuple[str, str]]:
    """key -> (value, commit time) of the merged slice."""
    spec = MergeSpec(str(root), (), SCHEMA, mode, "ts", InstantValidity(frozenset(committed), first_active=BASE), since, until)
    out = {}
    for batch in merge_slice(spec, open_storage(StorageSpec(str(root))), base, logs):
        assert batch.schema == SCHEMA
        for r in batch.to_pylist():
            assert r["_hoodie_record_key"] not in out, "a key came out twice"
            out[r["_hoodie_record_key"]] = (r["v"], r["_hoodie_commit_time"])
    return out


# --- ordering of updates ----------------------------------------------------------------------


def test_event_time_ignores_a_later_update_with_a_lower_ordering_value(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 10), ("b", "base", 10)))
    log = write_log(tmp_path, 1, update(C1, ("a", "lower", 9), ("b", "higher", 11)))
    assert merged(tmp_path, base, [log]) == {"a": ("base", BASE), "b": ("higher", C1)}


def test_event_time_tie_goes_to_the_later_block(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 10)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "first", 20))), write_log(tmp_path, 2, update(C2, ("a", "second", 20)))]
    assert merged(tmp_path, base, logs) == {"a": ("second", C2)}


def test_commit_time_lets_the_later_write_win_whatever_its_ordering_value(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 10)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "first", 30))), write_log(tmp_path, 2, update(C2, ("a", "second", 1)))]
    assert merged(tmp_path, base, logs, mode=COMMIT_TIME) == {"a": ("second", C2)}
    assert merged(tmp_path, base, logs, mode=EVENT_TIME) == {"a": ("first", C1)}


def test_log_rows_of_new_keys_are_added_and_untouched_base_rows_stay(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1), ("b", "base", 1)))
    log = write_log(tmp_path, 1, update(C1, ("c", "new", 1)))
    assert merged(tmp_path, base, [log]) == {"a": ("base", BASE), "b": ("base", BASE), "c": ("new", C1)}


def test_a_log_only_slice_merges_its_blocks(tmp_path):
    log = write_log(tmp_path, 1, update(C1, ("a", "first", 1)), update(C2, ("a", "second", 2), ("b", "other", 1)))
    assert merged(tmp_path, None, [log]) == {"a": ("second", C2), "b": ("other", C2)}


# --- deletes --------------------------------------------------------------------------------


def deletes(instant: str, *records: tuple[str, L.OrderingValue | None]) -> L.Block:
    return L.delete_block(instant, [(k, "p", v) for k, v in records])


def test_delete_without_ordering_value_deletes_by_commit_time(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 100), ("b", "base", 100)))
    log = write_log(tmp_path, 1, deletes(C1, ("a", None)))
    assert merged(tmp_path, base, [log]) == {"b": ("base", BASE)}


def test_delete_with_an_ordering_value_of_the_fields_type_is_compared(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("low", "base", 5), ("equal", "base", 7), ("high", "base", 9)))
    log = write_log(tmp_path, 1, deletes(C1, *((k, L.OrderingValue("long", 7)) for k in ("low", "equal", "high"))))
    assert merged(tmp_path, base, [log]) == {"high": ("base", BASE)}
    assert merged(tmp_path, base, [log], mode=COMMIT_TIME) == {}


def test_javas_default_ordering_value_deletes_whatever_the_field_type(tmp_path):
    # Spark SQL DELETE and DeleteRecord.create(key) write IntWrapper(0); ts here is a long
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1_700_000_000_000)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "newer", 1_700_000_000_005))), write_log(tmp_path, 2, deletes(C2, ("a", L.NATURAL_ORDER)))]
    assert merged(tmp_path, base, logs) == {}
    assert merged(tmp_path, base, logs[:1]) == {"a": ("newer", C1)}


def test_a_delete_whose_value_is_of_another_class_deletes_regardless(tmp_path):
    # Java compares only values of the same class (ReflectionUtils.isSameClass): a DoubleWrapper
    # or an IntWrapper on a long field is never compared, so it deletes
    for other in (L.OrderingValue("double", 2.5), L.OrderingValue("int", 3), L.OrderingValue("string", "1")):
        logs = [write_log(tmp_path, 1, update(C1, ("a", "newer", 1_700_000_000_005))), write_log(tmp_path, 2, deletes(C2, ("a", other)))]
        assert merged(tmp_path, None, logs) == {}, other


def test_a_long_zero_is_compared_like_any_long(tmp_path):
    # only Integer 0 means "natural order" to Java; a LongWrapper(0) is older than any positive ts
    logs = [write_log(tmp_path, 1, update(C1, ("a", "newer", 5))), write_log(tmp_path, 2, deletes(C2, ("a", L.OrderingValue("long", 0))))]
    assert merged(tmp_path, None, logs) == {"a": ("newer", C1)}


def test_a_write_after_a_delete_brings_the_key_back(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 5)))
    logs = [write_log(tmp_path, 1, deletes(C1, ("a", None))), write_log(tmp_path, 2, update(C2, ("a", "again", 1)))]
    assert merged(tmp_path, base, logs) == {"a": ("again", C2)}


# --- which blocks count ---------------------------------------------------------------------


def test_a_block_of_an_instant_that_never_completed_is_ignored(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "failed", 2))), write_log(tmp_path, 2, update(C2, ("b", "later", 1)))]
    assert merged(tmp_path, base, logs, committed=(BASE, C2)) == {"a": ("base", BASE), "b": ("later", C2)}
    assert merged(tmp_path, base, logs, committed=(BASE, C1, C2))["a"] == ("failed", C1)


def test_a_rollback_block_hides_the_blocks_of_its_target(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "rolled back", 2))),
            write_log(tmp_path, 2, L.rollback_block(C2, C1)),
            write_log(tmp_path, 3, update(C3, ("b", "later", 1)))]
    # even were the target's instant completed, the rollback hides it
    assert merged(tmp_path, base, logs, committed=(BASE, C1, C2, C3)) == {"a": ("base", BASE), "b": ("later", C3)}
    assert merged(tmp_path, base, [logs[0], logs[2]], committed=(BASE, C1, C2, C3))["a"] == ("rolled back", C1)


def test_time_travel_ignores_blocks_after_the_instant(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1)))
    log = write_log(tmp_path, 1, update(C1, ("a", "one", 2)), update(C2, ("a", "two", 3)))
    assert merged(tmp_path, base, [log], until=C1) == {"a": ("one", C1)}
    assert merged(tmp_path, base, [log], until=BASE) == {"a": ("base", BASE)}


def test_incremental_returns_the_latest_state_of_keys_changed_in_the_range_and_no_deleted_key(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1), ("b", "base", 1), ("c", "base", 1)))
    logs = [write_log(tmp_path, 1, update(C1, ("a", "before range", 2))),
            write_log(tmp_path, 2, update(C2, ("b", "in range", 2), ("d", "new", 1))),
            write_log(tmp_path, 3, deletes(C3, ("c", None), ("d", None))),
            write_log(tmp_path, 4, update(C4, ("b", "after range", 3)))]
    assert merged(tmp_path, base, logs, since=C1, until=C3) == {"b": ("in range", C2)}
    assert merged(tmp_path, base, logs, since=C1) == {"b": ("after range", C4)}


def test_without_meta_fields_rows_are_appended_not_merged(tmp_path):
    no_meta = rows(BASE, ("a", "base", 1)).drop_columns([f.name for f in SCHEMA if f.name.startswith("_hoodie")])
    base = write_base(tmp_path, no_meta)  # as Spark writes them: no meta column to filter or merge on
    log = write_log(tmp_path, 1, update(C1, ("a", "log", 2)), update(C2, ("a", "later", 3)))
    valid = InstantValidity(frozenset((BASE, C1, C2)), first_active=BASE)
    storage = open_storage(StorageSpec(str(tmp_path)))
    for until, expected in ((None, ["base", "later", "log"]), (C1, ["base", "log"])):
        spec = MergeSpec(str(tmp_path), (), SCHEMA, APPEND_ONLY, None, valid, until=until)
        assert sorted(r["v"] for b in merge_slice(spec, storage, base, [log]) for r in b.to_pylist()) == expected


def test_a_torn_block_is_skipped_and_the_blocks_around_it_count(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1), ("b", "base", 1), ("c", "base", 1)))
    blocks = [L.encode_block(b) for b in (update(C1, ("a", "one", 2)), update(C2, ("b", "torn", 2)), update(C3, ("c", "three", 2)))]
    log = write_log(tmp_path, 1)
    (tmp_path / log).write_bytes(blocks[0] + blocks[1][:len(blocks[1]) // 2] + blocks[2])  # an append that died, then another
    assert merged(tmp_path, base, [log]) == {"a": ("one", C1), "b": ("base", BASE), "c": ("three", C3)}
    (tmp_path / log).write_bytes(blocks[0] + blocks[1] + blocks[2][:-5])  # the last block cut short
    assert merged(tmp_path, base, [log]) == {"a": ("one", C1), "b": ("torn", C2), "c": ("base", BASE)}


def test_a_file_that_is_no_log_file_is_refused_with_its_path(tmp_path):
    base = write_base(tmp_path, rows(BASE, ("a", "base", 1)))
    log = write_log(tmp_path, 1, update(C1, ("a", "x", 2)))
    (tmp_path / log).write_bytes(b"PAR1" + (tmp_path / log).read_bytes())
    with pytest.raises(TableError, match=rf"damaged log file {log}: no block magic at byte 0; restore the file") as err:
        merged(tmp_path, base, [log])
    assert "roll back" in err.value.hint


# --- log files in the file-system view ------------------------------------------------------


def timeline_with(root, *instants: tuple[str, str]) -> Timeline:
    """A timeline of completed (instant, action) pairs; `action.requested` for a pending one."""
    (root / ".hoodie").mkdir(parents=True, exist_ok=True)
    for time, action in instants:
        (root / ".hoodie" / f"{time}.{action}").write_bytes(b"{}")
    return Timeline.load(open_storage(StorageSpec(str(root))))


def test_view_attaches_log_files_to_the_slice_of_their_base_instant(tmp_path):
    write_base(tmp_path, rows(BASE))
    logs = [write_log(tmp_path, 2, update(C2)), write_log(tmp_path, 1, update(C1))]
    (tmp_path / "p" / f".{logs[0].rsplit('/', 1)[1]}.0a1b2c.tmp").write_bytes(b"partial")  # a writer's hidden temp file
    view = FileSystemView.load(open_storage(StorageSpec(str(tmp_path))), timeline_with(tmp_path, (BASE, "deltacommit"), (C1, "deltacommit"), (C2, "deltacommit")))
    (sl,) = view.latest_slices()
    assert (sl.base_file.instant, sl.base_instant, sl.has_logs) == (BASE, BASE, True)
    assert [(lf.path, lf.version, lf.file_id, lf.base_instant) for lf in sl.log_files] == [(logs[1], 1, FID, BASE), (logs[0], 2, FID, BASE)]


def test_view_keeps_log_only_groups_and_logs_named_with_a_pending_compaction(tmp_path):
    write_log(tmp_path, 1, update(C1))  # named with BASE: a log-only group
    pending = f"p/.{FID.replace('0f0f', 'abab')}_{C2}.log.1_0-1-1"  # Java names logs with a pending compaction
    (tmp_path / pending).write_bytes(L.encode_block(update(C3)))
    (tmp_path / f"p/.{FID.replace('0f0f', 'cdcd')}_{C4}.log.1_0-1-1").write_bytes(L.encode_block(update(C4)))  # of no valid instant
    storage = open_storage(StorageSpec(str(tmp_path)))
    view = FileSystemView.load(storage, timeline_with(tmp_path, (BASE, "deltacommit"), (C1, "deltacommit"), (C2, "compaction.requested"), (C3, "deltacommit")))
    (sl, under) = view.latest_slices()
    assert (sl.file_id, sl.base_file, sl.base_instant, len(sl.log_files), sl.pending_compaction) == (FID, None, BASE, 1, None)
    assert (under.base_file, under.base_instant, [lf.path for lf in under.log_files], under.pending_compaction) == (None, C2, [pending], C2)
    assert view.latest_slices(as_of="20251231000000000") == []


def test_a_damaged_log_file_found_in_a_spark_task_is_reported_without_the_traceback(spark, tmp_path):
    import zipfile

    from runtime.errors import spark_message
    from runtime.table import Table
    from tests.conftest import REPO

    with zipfile.ZipFile(REPO.parent / "shared" / "fixtures" / "hudi" / "mor_parquet_v6_nonpartitioned.zip") as z:
        z.extractall(tmp_path)
    (log,) = (tmp_path / "v6_nonpartitioned").glob(".*.log.*")
    log.write_bytes(b"\0" * 6 + log.read_bytes())
    with pytest.raises(Exception) as err:
        Table.open(spark, str(tmp_path / "v6_nonpartitioned")).read().collect()
    message = spark_message(err.value)
    assert message.startswith(f"table at {tmp_path / 'v6_nonpartitioned'}: damaged log file {log.name}: no block magic at byte 0")
    assert "Traceback" not in message and "roll back" in message


# --- Java-written deletes on every precombine type ---------------------------------------------

UTC = __import__("datetime").timezone.utc
_dt = __import__("datetime")
_dec = __import__("decimal")
FEB, JAN, MAR = (_dt.datetime(2024, m, 1, tzinfo=UTC) for m in (2, 1, 3))
MICROS = lambda t: int(t.timestamp()) * 1_000_000  # noqa: E731

# (precombine type, the stored version's value, the delete's wrapped value, does the row stay?)
# What Java's HoodieMergedLogRecordScanner.processNextDeletedRecord decides for a delete that
# follows that version in the log: the stored version stays only if the delete's value is not
# Integer 0, is of the stored value's class (a timestamp is stored as its epoch micros, a Long)
# and is smaller.
JAVA_DELETES = [
    (pa.int64(), 1_700_000_000_005, L.OrderingValue("long", 1_700_000_000_001), True),
    (pa.int64(), 1_700_000_000_005, L.OrderingValue("long", 1_700_000_000_005), False),
    (pa.int64(), 1_700_000_000_005, L.OrderingValue("long", 1_700_000_000_009), False),
    (pa.int64(), 1_700_000_000_005, L.OrderingValue("int", 0), False),
    (pa.int64(), 1_700_000_000_005, L.OrderingValue("long", 0), True),
    (pa.int32(), 7, L.OrderingValue("int", 3), True),
    (pa.int32(), 7, L.OrderingValue("int", 0), False),
    (pa.int32(), 7, L.OrderingValue("long", 3), False),
    (pa.timestamp("us", tz="UTC"), FEB, L.OrderingValue("long", MICROS(JAN)), True),
    (pa.timestamp("us", tz="UTC"), FEB, L.OrderingValue("long", MICROS(MAR)), False),
    (pa.timestamp("us", tz="UTC"), FEB, L.OrderingValue("timestamp-micros", JAN), False),  # an Instant is no Long
    (pa.timestamp("us", tz="UTC"), FEB, L.OrderingValue("int", 0), False),
    (pa.float64(), 2.5, L.OrderingValue("double", 1.5), True),
    (pa.float64(), 2.5, L.OrderingValue("double", 3.5), False),
    (pa.float64(), 2.5, L.OrderingValue("float", 1.5), False),
    (pa.string(), "2024-02-01", L.OrderingValue("string", "2024-01-01"), True),
    (pa.string(), "2024-02-01", L.OrderingValue("string", "2024-03-01"), False),
    (pa.string(), "2024-02-01", L.OrderingValue("int", 0), False),
]


@pytest.mark.parametrize("arrow_type, stored, delete, stays", JAVA_DELETES,
                         ids=[f"{t}-{d.type}-{i}" for i, (t, _, d, _) in enumerate(JAVA_DELETES)])
def test_java_written_deletes_follow_javas_rule_for_every_precombine_type(tmp_path, arrow_type, stored, delete, stays):
    schema = SCHEMA.set(SCHEMA.get_field_index("ts"), pa.field("ts", arrow_type))
    version = pa.Table.from_pylist([{"_hoodie_commit_time": C1, "_hoodie_commit_seqno": f"{C1}_0_0", "_hoodie_record_key": "a",
                                     "_hoodie_partition_path": "p", "_hoodie_file_name": FID, "v": "stored", "ts": stored}], schema=schema)
    log = write_log(tmp_path, 1, L.parquet_block(C1, SCHEMA_JSON, version), deletes(C2, ("a", delete)))
    spec = MergeSpec(str(tmp_path), (), schema, EVENT_TIME, "ts", InstantValidity(frozenset((C1, C2)), first_active=C1))
    out = [r["v"] for b in merge_slice(spec, open_storage(StorageSpec(str(tmp_path))), None, [log]) for r in b.to_pylist()]
    assert out == (["stored"] if stays else [])
