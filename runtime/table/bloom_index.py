"""Which stored base files a batch's keys can be in, by the record-key range and the bloom
filter in each base file's footer (hoodie_min_record_key / hoodie_max_record_key and
org.apache.hudi.bloomfilter, which pipe and Java's writers put there): Hudi's BLOOM and
GLOBAL_BLOOM indexes' pruning (hoodie.bloom.index.prune.by.ranges, then the filters), done by
pipe's own lookup before it reads stored keys.

The batch's range comes from the aggregate the writer runs over the batch anyway (its count
and null checks), so pruning costs no Spark job: the driver compares a few strings per file.
Key order is Java's String.compareTo (UTF-16 code units), as the footers are written: the
batch's least and greatest keys are taken over their UTF-16BE bytes.

A footer is read once per process (a base file never changes under its name): locally from
the file's tail, on object stores by two ranged reads, several files at once. A file whose
footer has no range (another writer's, or unreadable) is always read.

The bloom filters are asked in Spark tasks, over the batch's keys (bloom_candidates), when the
files left after range pruning are large enough to pay for the job; the tasks keep the filters
they read for their next tasks. Only file ids reach the driver."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from runtime.table.bloom import (
    MAX_RECORD_KEY,
    MIN_RECORD_KEY,
    footer_bloom_filter,
    footer_metadata,
    key_positions,
    utf16,
)
from runtime.table.layout import FileSlice

_CACHE_SIZE = 200_000  # base files: two short strings each
_cache: OrderedDict[tuple[str, int], tuple[bytes, bytes] | None] = OrderedDict()
_lock = threading.Lock()


def batch_range_columns(F, key):
    """Spark aggregates of the batch's least and greatest key in Java's order (binary)."""
    encoded = F.encode(key, "UTF-16BE")
    return F.min(encoded), F.max(encoded)


def footer_range(metadata: dict | None) -> tuple[bytes, bytes] | None:
    """The key range of a footer's key-value metadata (bytes or str keys), in Java's order."""
    meta = footer_metadata(metadata)
    lo, hi = meta.get(MIN_RECORD_KEY), meta.get(MAX_RECORD_KEY)
    return None if lo is None or hi is None else (utf16(lo), utf16(hi))


def _footer(storage, path: str, size: int) -> dict | None:
    """A base file's footer key-value metadata; None when it cannot be read (then it prunes
    nothing, and the scan says what is wrong)."""
    import pyarrow as pa

    from runtime.table.files import parquet_footer

    try:
        return parquet_footer(storage, path, size).metadata or {}
    except (OSError, ValueError, UnicodeError, pa.ArrowException):
        return None


def key_ranges(storage, slices: list[FileSlice]) -> dict[tuple[str, str], tuple[bytes, bytes] | None]:
    """(partition, file id) -> the key range of its base file (None: unknown), for slices
    with a base file."""
    based = {(s.partition, s.file_id): s.base_file for s in slices if s.base_file is not None}
    at = {k: (storage.full_path(f.path), f.size) for k, f in based.items()}
    found: dict[tuple[str, str], tuple[bytes, bytes] | None] = {}
    with _lock:
        for k in based:
            if at[k] in _cache:
                _cache.move_to_end(at[k])
                found[k] = _cache[at[k]]
    missing = [k for k in based if k not in found]
    if missing:
        def read(k):
            meta = _footer(storage, based[k].path, based[k].size)
            return footer_range(meta) if meta is not None else None

        with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
            ranges = list(pool.map(read, missing))
        found.update(zip(missing, ranges))
        _store({at[k]: r for k, r in zip(missing, ranges)})
    return found


def remember(storage, written) -> None:
    """Keeps the key ranges of the base files a write just made (its stats rows: path, size,
    min_key, max_key; files.STATS_SCHEMA; a log file's row has no range), so that the next
    lookups need not read their footers."""
    _store({(storage.full_path(r["path"]), r["size"]): (utf16(r["min_key"]), utf16(r["max_key"]))
            for r in written if r["min_key"] is not None and r["max_key"] is not None})


def _store(ranges: dict) -> None:
    """Puts (full path, size) -> range entries in the bounded cache."""
    with _lock:
        _cache.update(ranges)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)


def prune(storage, slices: list[FileSlice], batch_ranges: dict[str | None, tuple[bytes, bytes] | None]) -> list[FileSlice]:
    """The slices whose base file's key range meets the batch's. `batch_ranges`: partition ->
    the batch's (least, greatest) key there, or {None: range} for a global lookup; a range of
    None means no keys. Slices without a base file, or with log files (whose keys another
    writer may have put outside the base file's range), are kept."""
    candidates = [s for s in slices if s.base_file is not None and not s.has_logs]
    if not candidates:
        return slices
    ranges = key_ranges(storage, candidates)
    kept = []
    for s in slices:
        if s.base_file is None or s.has_logs:
            kept.append(s)
            continue
        batch = batch_ranges.get(None if None in batch_ranges else s.partition)
        if batch is None:
            continue  # no key of the batch is in this partition
        stored = ranges.get((s.partition, s.file_id))
        if stored is None or (batch[0] <= stored[1] and stored[0] <= batch[1]):
            kept.append(s)
    return kept


# --- the bloom filters: which candidate files may hold one of the batch's keys ------------------

# A lookup whose candidate base files (after range pruning) hold at least this many bytes asks
# their bloom filters first, in one Spark job over the batch's keys, which of them may hold a key:
# below it, reading the files' keys costs less than the job. Measured on 2 cores (bench/RESULTS.md,
# java-1m): a 10,000-row upsert of one partition's keys into 1M rows (70 MB, 20 files) with the
# global index took 1.22 s asking the filters against 1.36 s reading every file's keys, and a
# 100-row upsert the same either way
BLOOM_CHECK_BYTES = 64 * 1024 * 1024

# A batch of at most this many keys asks the bloom filters whether its keys may cross
# partitions in one task (crossing_candidates): one task sees every key, so no shuffle by key
# is needed to find one coming in two partitions, and the check is one Spark job, not two. Its
# hashing takes about 0.06 CPU s per 10,000 keys and file asked.
ONE_TASK_KEYS = 10_000
_FILTERS_BYTES = 256 * 1024 * 1024  # bloom filters a Python worker keeps between tasks
_filters: OrderedDict[tuple[str, int], object] = OrderedDict()
_filters_bytes = [0]


@dataclass(frozen=True)
class BloomCheck:
    """What the tasks of a bloom check need, picklable: the storage, and the candidate files
    as (partition, file id, path, size)."""

    storage_uri: str
    storage_options: tuple
    files: tuple[tuple[str, str, str, int], ...]
    partition_scoped: bool  # keys are matched to files of their own partition only


def bloom_candidates(probe, storage, slices: list[FileSlice], partition_scoped: bool) -> list[FileSlice]:
    """The slices a lookup must read: of the base-only slices, those whose footer bloom filter
    may hold one of the keys of `probe` (a DataFrame of `_k`, the keys, and with
    `partition_scoped`, `_p`, their partition paths); the others are kept. Runs when the base
    files hold at least BLOOM_CHECK_BYTES: only file ids come back to the driver."""
    files = [s for s in slices if s.base_file is not None and not s.has_logs]
    if len(files) < 2 or sum(s.base_file.size for s in files) < BLOOM_CHECK_BYTES:
        return slices
    check = BloomCheck(storage.spec.uri, tuple(storage.spec.options),
                       tuple((s.partition, s.file_id, s.base_file.path, s.base_file.size) for s in files), partition_scoped)
    # each task yields its distinct candidates (at most tasks x files rows): no shuffle for a distinct
    hits = probe.mapInArrow(lambda batches: bloom_task(check, batches), "partition string, file_id string").collect()
    maybe = {(p, f) for p, f in hits}
    return [s for s in slices if s.base_file is None or s.has_logs or (s.partition, s.file_id) in maybe]


def bloom_task(check: BloomCheck, batches):
    """The function given to mapInArrow: batches of keys in; out, each candidate file one of
    them may be in (a file without a readable filter may hold any)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime.storage import StorageSpec, open_storage

    storage = open_storage(StorageSpec(check.storage_uri, check.storage_options))
    found: set[tuple[str, str]] = set()
    for batch in batches:
        keys = batch.column("_k")
        positions: dict = {}  # (partition, hash count, vector size) -> the keys' bit positions, hashed once for all files
        for partition, file_id, path, size in check.files:
            if (partition, file_id) in found:
                continue
            bloom = _worker_filter(storage, path, size)
            if bloom is None:
                found.add((partition, file_id))
                continue
            at = (partition if check.partition_scoped else None, bloom.hash_count, bloom.vector_size)
            if at not in positions:
                mine = keys.filter(pc.equal(batch.column("_p"), partition)) if check.partition_scoped else keys
                positions[at] = key_positions(pc.drop_null(mine).cast(pa.string()), bloom.hash_count, bloom.vector_size)
            if positions[at].shape[1] and bool(np.any(bloom.might_contain_at(positions[at]))):
                found.add((partition, file_id))
    if found:
        rows = sorted(found)
        yield pa.RecordBatch.from_arrays([pa.array([p for p, _ in rows], pa.string()), pa.array([f for _, f in rows], pa.string())],
                                         names=["partition", "file_id"])


def crossing_candidates(probe, storage, slices: list[FileSlice], by_key: bool = False, one_task: bool = False) \
        -> tuple[set[tuple[str, str]], set[tuple[str, str]], bool]:
    """For a global lookup whose batch brings each key to a partition (`probe`: `_k`, the keys,
    and `_p`, the partition each goes to), of the `slices` with a base file (whose log files,
    if any, hold no key their base file does not: the caller knows): the (partition, file id)
    whose bloom filter may hold one of the keys, those whose filter may hold a key the batch
    brings to another partition (so that key may move), and, with `by_key` (the batch's keys
    are shuffled by key first, unless `one_task` says `probe` is one Spark partition already),
    whether a key comes in two partitions of the batch. One Spark job (two with the shuffle),
    whatever the files' size; only file ids reach the driver."""
    files = [s for s in slices if s.base_file is not None]
    check = BloomCheck(storage.spec.uri, tuple(storage.spec.options),
                       tuple((s.partition, s.file_id, s.base_file.path, s.base_file.size) for s in files), False)
    if not files and not by_key:
        return set(), set(), False
    if by_key and not one_task:
        from runtime.spark import api as spark_api

        probe = probe.repartition(max(1, spark_api.default_parallelism(probe.sparkSession)), "_k")
    hits = probe.mapInArrow(lambda batches: crossing_task(check, by_key, batches), "partition string, file_id string, crossing boolean").collect()
    maybe = {(p, f) for p, f, _ in hits if f is not None}
    return maybe, {(p, f) for p, f, crossing in hits if crossing and f is not None}, any(f is None for _, f, _ in hits)


def crossing_task(check: BloomCheck, by_key: bool, batches):
    """The function given to mapInArrow by crossing_candidates: the task's keys and their
    partitions in (a small batch's share: taken together); out, each candidate file one of them
    may be in, whether a key going to another partition than the file's may be, and with
    `by_key` (all rows of a key in this task) a row of nulls when a key comes in two partitions."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from runtime.storage import StorageSpec, open_storage

    batches = list(batches)
    if not batches:
        return
    rows = pa.Table.from_batches(batches).combine_chunks()
    keys, parts = rows.column("_k").cast(pa.string()), pc.fill_null(rows.column("_p").cast(pa.string()), "")
    out = []
    if by_key and len(rows):
        pairs = pa.table({"k": keys, "p": parts}).group_by("k").aggregate([("p", "count_distinct")])
        if pc.max(pairs.column("p_count_distinct")).as_py() > 1:
            out.append((None, None, True))
    storage = open_storage(StorageSpec(check.storage_uri, check.storage_options))
    valid = pc.is_valid(keys).to_numpy(zero_copy_only=False)
    hashed = pc.fill_null(keys, "")  # a null key matches no file: masked by `valid`
    positions: dict = {}  # (hash count, vector size) -> the keys' bit positions, hashed once for all files
    verified = 0
    for partition, file_id, path, size in check.files:
        bloom = _worker_filter(storage, path, size)
        if bloom is None:
            out.append((partition, file_id, True))
            continue
        at = (bloom.hash_count, bloom.vector_size)
        if at not in positions:
            positions[at] = key_positions(hashed, *at)
        hit = bloom.might_contain_at(positions[at]) & valid if len(hashed) else np.zeros(0, dtype=bool)
        if hit.any():
            moving = hit & pc.not_equal(parts, partition).to_numpy(zero_copy_only=False)
            crossing = bool(moving.any())
            if crossing and verified < VERIFY_FILES:
                # a filter's false positives are far more frequent than its nominal rate for
                # keys that differ in a few characters (numbers): the file's keys say for sure,
                # as Java's bloom index checks its candidates (HoodieKeyLookupHandle)
                verified += 1
                stored = _stored_keys(storage, path, size)
                if stored is not None:
                    crossing = bool(pc.any(pc.is_in(hashed.filter(pa.array(moving)), value_set=stored)).as_py())
            out.append((partition, file_id, crossing))
    if out:
        yield pa.RecordBatch.from_arrays([pa.array([r[0] for r in out], pa.string()), pa.array([r[1] for r in out], pa.string()),
                                          pa.array([r[2] for r in out], pa.bool_())], names=["partition", "file_id", "crossing"])


# A crossing task reads the keys of at most this many files whose bloom filters say a key going
# to another partition may be in them (each a column of a base file); more, and the batch goes
# the general way, whose lookup reads the keys of every candidate file anyway
VERIFY_FILES = 16


def _stored_keys(storage, path: str, size: int):
    """The record keys of a base file (its `_hoodie_record_key` column only, ranged reads on
    S3), or None when it cannot be read (the bloom filter's answer stands)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from runtime.storage import RangedFile

    try:
        source = storage.full_path(path) if hasattr(storage, "root") else RangedFile(storage, path, size)
        return pq.read_table(source, columns=["_hoodie_record_key"]).column(0).combine_chunks().cast(pa.string())
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None


def _worker_filter(storage, path: str, size: int):
    """The bloom filter of a base file's footer (None: none, or unreadable), kept by the worker
    process for its next tasks (a base file never changes under its name)."""
    at = (storage.full_path(path), size)
    with _lock:
        if at in _filters:
            _filters.move_to_end(at)
            return _filters[at]
    meta = _footer(storage, path, size)
    bloom = footer_bloom_filter(meta) if meta is not None else None
    with _lock:
        _filters[at] = bloom
        _filters_bytes[0] += bloom.bits.nbytes if bloom is not None else 0
        while _filters_bytes[0] > _FILTERS_BYTES and len(_filters) > 1:
            _, old = _filters.popitem(last=False)
            _filters_bytes[0] -= old.bits.nbytes if old is not None else 0
    return bloom
