"""Which stored base files a batch's keys can be in, by the record-key range in each base
file's footer (hoodie_min_record_key / hoodie_max_record_key, which pipe and Java's writers
put there): Hudi's BLOOM and GLOBAL_BLOOM indexes' range pruning
(hoodie.bloom.index.prune.by.ranges), done by pipe's own lookup before it reads stored keys.

The batch's range comes from the aggregate the writer runs over the batch anyway (its count
and null checks), so pruning costs no Spark job: the driver compares a few strings per file.
Key order is Java's String.compareTo (UTF-16 code units), as the footers are written: the
batch's least and greatest keys are taken over their UTF-16BE bytes.

A footer is read once per process (a base file never changes under its name): locally from
the file's tail, on object stores by two ranged reads, several files at once. A file whose
footer has no range (another writer's, or unreadable) is always read."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from runtime.table.bloom import MAX_RECORD_KEY, MIN_RECORD_KEY
from runtime.table.layout import FileSlice

_CACHE_SIZE = 200_000  # base files: two short strings each
_cache: OrderedDict[tuple[str, int], tuple[bytes, bytes] | None] = OrderedDict()
_lock = threading.Lock()
_NO_RANGE = object()


def utf16(text: str) -> bytes:
    """A key in Java's String order: its UTF-16BE bytes compare as Java compares strings."""
    return text.encode("utf-16-be", "surrogatepass")


def batch_range_columns(F, key):
    """Spark aggregates of the batch's least and greatest key in Java's order (binary)."""
    encoded = F.encode(key, "UTF-16BE")
    return F.min(encoded), F.max(encoded)


def footer_range(metadata: dict | None) -> tuple[bytes, bytes] | None:
    """The key range of a footer's key-value metadata (bytes or str keys), in Java's order."""
    meta = {(k.decode() if isinstance(k, bytes) else k): v for k, v in (metadata or {}).items()}
    lo, hi = meta.get(MIN_RECORD_KEY), meta.get(MAX_RECORD_KEY)
    if lo is None or hi is None:
        return None
    lo, hi = (v.decode() if isinstance(v, bytes) else v for v in (lo, hi))
    return utf16(lo), utf16(hi)


def _read_range(storage, s: FileSlice):
    import pyarrow as pa

    from runtime.table.files import parquet_footer

    try:
        return footer_range(parquet_footer(storage, s.base_file.path, s.base_file.size).metadata)
    except (OSError, ValueError, UnicodeError, pa.ArrowException):  # unreadable: prunes nothing; the scan says what is wrong
        return None


def key_ranges(storage, slices: list[FileSlice]) -> dict[tuple[str, str], tuple[bytes, bytes] | None]:
    """(partition, file id) -> the key range of its base file (None: unknown), for slices
    with a base file."""
    keyed = {(s.partition, s.file_id): (storage.full_path(s.base_file.path), s.base_file.size) for s in slices if s.base_file is not None}
    found: dict[tuple[str, str], tuple[bytes, bytes] | None] = {}
    missing = []
    with _lock:
        for s in slices:
            if s.base_file is None:
                continue
            at = keyed[(s.partition, s.file_id)]
            hit = _cache.get(at, _NO_RANGE)
            if hit is _NO_RANGE:
                missing.append(s)
            else:
                _cache.move_to_end(at)
                found[(s.partition, s.file_id)] = hit
    if missing:
        if len(missing) == 1:
            read = [_read_range(storage, missing[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                read = list(pool.map(lambda s: _read_range(storage, s), missing))
        with _lock:
            for s, r in zip(missing, read):
                found[(s.partition, s.file_id)] = r
                _cache[keyed[(s.partition, s.file_id)]] = r
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return found


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
