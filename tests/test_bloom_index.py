"""The lookup's range pruning (runtime/table/bloom_index.py): an upsert or delete reads the
stored keys only of base files whose footer key range meets the batch's, as Hudi's BLOOM index
prunes by ranges. Checked on real tables: the ranges read back from the footers are the files'
real least and greatest keys in Java's order, the files kept are those a batch can touch, and
many rounds of updates, inserts and deletes over many file groups read back (hudi-rs and
pipe's reader) as a model of the table says, with keys whose UTF-16 and code point orders
differ."""

from __future__ import annotations

import random

import pyarrow.parquet as pq
import pytest

from runtime.table import bloom_index
from tests.test_table_engine import assert_rows, hudi_rows, make_table

pytestmark = pytest.mark.spark

SQL = "id string, region string, ts bigint, v string"


def _batch_range(keys):
    encoded = [bloom_index.utf16(k) for k in keys]
    return min(encoded), max(encoded)


def _slices(table):
    return table.view().latest_slices()


def test_footer_ranges_are_the_files_keys_and_prune_keeps_the_files_a_batch_can_touch(spark, tmp_path):
    table, path = make_table(spark, tmp_path, "ranges", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")
    # four file groups in one partition, keys k000..k399 in four disjoint ranges, then a group
    # whose keys mix characters whose UTF-16 and code point orders differ
    for part in range(4):
        batch = [(f"k{i:03d}", "EU", 1, "a") for i in range(part * 100, part * 100 + 100)]
        table.write(spark.createDataFrame(batch, SQL), "insert", small_file_limit=0)
    odd = ["\U0001F600a", "\U0001F600m", "\uFF01z"]  # in Java's order 😀a < 😀m < ！z (U+D83D < U+FF01)
    table.write(spark.createDataFrame([(k, "EU", 1, "b") for k in odd], SQL), "insert", small_file_limit=0)
    slices = _slices(table)
    assert len(slices) == 5
    # the ranges the writes' stats rows gave the driver, then the footers' own: both the files' keys'
    remembered = bloom_index.key_ranges(table.storage, slices)
    full_paths = {(table.storage.full_path(s.base_file.path), s.base_file.size) for s in slices}
    assert full_paths <= set(bloom_index._cache)  # seeded by the writes: no footer read yet
    for k in full_paths:
        del bloom_index._cache[k]
    from_footers = bloom_index.key_ranges(table.storage, slices)
    for s in slices:
        keys = pq.read_table(path / s.base_file.path, columns=["_hoodie_record_key"]).column(0).to_pylist()
        lo, hi = from_footers[(s.partition, s.file_id)]
        assert (lo, hi) == _batch_range(keys)  # the footer's range is the file's own, in Java's order
        assert remembered[(s.partition, s.file_id)] == (lo, hi)
    odd_file = next(s.file_id for s in slices if s.base_file.path and "\U0001F600a" in
                    pq.read_table(path / s.base_file.path, columns=["_hoodie_record_key"]).column(0).to_pylist())

    def kept(keys):
        return {s.file_id for s in bloom_index.prune(table.storage, slices, {None: _batch_range(keys)})}

    by_first_key = {}
    for s in slices:
        first = pq.read_table(path / s.base_file.path, columns=["_hoodie_record_key"]).column(0).to_pylist()[0]
        by_first_key[first[:2]] = s.file_id
    assert kept(["k150", "k160"]) == {by_first_key["k1"]}
    assert kept(["k199", "k200"]) == {by_first_key["k1"], by_first_key["k2"]}
    assert kept(["k9999"]) == set()  # past every range: a new key, no file read
    # 😀m lies inside the odd file's range only in Java's (UTF-16) order: kept
    assert kept(["\U0001F600m"]) == {odd_file}
    # a partition-scoped lookup prunes each partition by that partition's range; a partition
    # without batch keys reads nothing
    assert {s.file_id for s in bloom_index.prune(table.storage, slices, {"region=EU": _batch_range(["k050"])})} == {by_first_key["k0"]}
    assert bloom_index.prune(table.storage, slices, {"region=US": _batch_range(["k050"])}) == []

    # the upserts themselves: the odd key is updated where it is, not inserted a second time
    table.write(spark.createDataFrame([("\U0001F600m", "EU", 2, "updated"), ("k150", "EU", 2, "updated")], SQL), "upsert")
    expected = {f"k{i:03d}": "a" for i in range(400)} | {k: "b" for k in odd} | {"\U0001F600m": "updated", "k150": "updated"}
    assert_rows(table, path, [{"id": k, "v": v} for k, v in expected.items()])


@pytest.mark.parametrize("table_type,index,keys", [("COPY_ON_WRITE", "global", ("id",)), ("MERGE_ON_READ", "partition", ("id", "region"))])
def test_ten_rounds_over_many_file_groups_read_back_as_the_model_says(spark, tmp_path, table_type, index, keys):
    """Ten rounds of updates across old and new file groups, new keys past every range,
    deletes, and a key moving partition (global index), with small file groups so that most
    files fall outside each batch's range."""
    table, path = make_table(spark, tmp_path, f"rounds_{table_type.lower()}", record_key_fields=keys, partition_fields=("region",),
                             precombine_field="ts", table_type=table_type)
    rnd = random.Random(7)
    model: dict[tuple[str, str], tuple[str, int, str]] = {}  # (id, region) -> (region, ts, v)
    next_id = 0

    def key(id_, region):
        return (id_, region) if index == "partition" else (id_, "")

    opts = {"index": index, "small_file_limit": 0}
    for rnd_no in range(1, 11):
        batch = []
        for _ in range(60):  # new keys, time-ordered as ids from a sequence are, with accents and quotes
            id_ = f"order-{next_id:06d}-é'\""
            next_id += 1
            region = rnd.choice(["EU", "US"])
            batch.append((id_, region, rnd_no * 10, f"new {rnd_no}"))
        stored = sorted(model)
        # odd rounds update and delete recent keys only (most files lie outside the batch's
        # range), even rounds the oldest keys and a few at random (the range spans every file)
        pool = stored[-40:] if rnd_no % 2 else stored[:40] + rnd.sample(stored, min(5, len(stored)))
        for k in rnd.sample(sorted(set(pool)), min(15, len(set(pool)))):
            region, _, _ = model[k]
            moved = "US" if region == "EU" else "EU"
            to = moved if index == "global" and rnd.random() < 0.2 else region
            batch.append((k[0], to, rnd_no * 10 + 1, f"update {rnd_no}"))
        deletes = rnd.sample(sorted(set(pool) - {key(b[0], b[1]) for b in batch}), min(5, len(stored)))
        if rnd_no % 2 and rnd_no >= 5:  # the round exercises pruning: some base files cannot hold its keys
            slices = _slices(table)
            ranges = {}
            for id_, region, *_ in batch:
                ranges.setdefault(f"region={region}" if index == "partition" else None, []).append(
                    f"id:{id_},region:{region}" if len(keys) == 2 else id_)
            ranges = {p: _batch_range(ks) for p, ks in ranges.items()}
            kept = bloom_index.prune(table.storage, slices, ranges)
            assert all(s in kept for s in slices if s.has_logs)  # a slice with logs is always read
            plain = [s for s in slices if not s.has_logs]
            assert len([s for s in kept if not s.has_logs]) < len(plain), (len(slices), len(plain))  # some base files are not read
        table.write(spark.createDataFrame(batch, SQL), "upsert", **opts)
        for id_, region, ts, v in batch:
            model[key(id_, region)] = (region, ts, v)
        if deletes:
            table.write(spark.createDataFrame([(k[0], model[k][0], rnd_no * 10 + 2, "gone") for k in deletes], SQL), "delete", **opts)
            for k in deletes:
                del model[k]
        expected = [{"id": k[0], "region": r, "ts": ts, "v": v} for k, (r, ts, v) in model.items()]
        if rnd_no in (1, 5, 10):
            assert_rows(table, path, expected)
        else:
            assert sorted(r["id"] + r["region"] for r in hudi_rows(path, ["id", "region"])) == sorted(e["id"] + e["region"] for e in expected)
    assert len({s.file_id for s in _slices(table)}) >= 10
    assert len(model) == 10 * 60 - 9 * 5


def test_bloom_filters_leave_out_the_files_that_hold_none_of_the_batchs_keys(spark, tmp_path, monkeypatch):
    """Random keys (hashes): every file's range spans the key space, so only the bloom filters
    tell the files apart. With the check on for files of any size, a batch's keys lead to the
    files that hold them, new keys to none, and upserts and deletes read back right."""
    import hashlib

    monkeypatch.setattr(bloom_index, "BLOOM_CHECK_BYTES", 0)
    table, path = make_table(spark, tmp_path, "blooms", record_key_fields=("id",), partition_fields=("region",), precombine_field="ts")

    def key(i):
        return hashlib.sha256(str(i).encode()).hexdigest()[:20] + "-é"

    groups = []
    for g in range(4):
        ids = range(g * 200, g * 200 + 200)
        table.write(spark.createDataFrame([(key(i), "EU" if i % 2 else "US", 1, f"v{i}") for i in ids], SQL), "insert", small_file_limit=0)
        groups.append(ids)
    slices = _slices(table)
    assert len(slices) == 8  # four inserts, two partitions each
    assert len(bloom_index.prune(table.storage, slices, {None: _batch_range([key(i) for i in groups[2][:50]])})) == 8  # ranges overlap

    def where(ids, scoped=False):
        rows = [(key(i), f"region={'EU' if i % 2 else 'US'}") for i in ids]
        probe = spark.createDataFrame(rows, "_k string, _p string")
        if not scoped:
            probe = probe.select("_k")
        kept = bloom_index.bloom_candidates(probe, table.storage, slices, scoped)
        holders = set()
        for s in kept:
            keys = set(pq.read_table(path / s.base_file.path, columns=["_hoodie_record_key"]).column(0).to_pylist())
            holders.add(tuple(sorted(i for i in range(800) if key(i) in keys))[:1])
        return {(s.partition, s.file_id) for s in kept}, holders

    files_of = {}
    for s in slices:
        keys = set(pq.read_table(path / s.base_file.path, columns=["_hoodie_record_key"]).column(0).to_pylist())
        files_of[(s.partition, s.file_id)] = {i for i in range(800) if key(i) in keys}
    kept, _ = where(list(groups[2][:50]))
    assert kept == {f for f, ids in files_of.items() if ids & set(groups[2][:50])}
    assert len(kept) == 2  # the third insert's two files (both partitions)
    kept, _ = where([5000, 5001, 5002])
    assert kept == set()  # new keys: no file read
    kept, _ = where([3, 5, 7], scoped=True)  # odd ids: EU only
    assert kept == {f for f, ids in files_of.items() if ids & {3, 5, 7}} and all(p == "region=EU" for p, _ in kept)

    # upserts and deletes with the check in the lookup
    expected = {key(i): ("EU" if i % 2 else "US", f"v{i}") for i in range(800)}
    for round_ in range(1, 4):
        ids = list(groups[round_][:30]) + list(range(1000 * round_, 1000 * round_ + 20))
        table.write(spark.createDataFrame([(key(i), "EU" if i % 2 else "US", 1 + round_, f"r{round_}-{i}") for i in ids], SQL), "upsert")
        expected.update({key(i): ("EU" if i % 2 else "US", f"r{round_}-{i}") for i in ids})
        gone = list(groups[0][round_ * 10: round_ * 10 + 5])
        table.write(spark.createDataFrame([(key(i), "EU" if i % 2 else "US", 9, "x") for i in gone], SQL), "delete")
        for i in gone:
            expected.pop(key(i))
    assert_rows(table, path, [{"id": k, "region": r, "v": v} for k, (r, v) in expected.items()])
    assert len({r["id"] for r in hudi_rows(path, ["id"])}) == len(expected)
