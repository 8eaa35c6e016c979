"""The bloom filter and record-key range of a base file, kept in its Parquet footer as Hudi's
writers keep them (HoodieBloomFilterWriteSupport): Java's BLOOM and GLOBAL_BLOOM indexes read
them to find which files may hold a key, and fail on a base file without them.

The filter is Hudi's HoodieDynamicBoundedBloomFilter (type DYNAMIC_V0, Java's default) built
with Java's defaults, hashed and serialised bit for bit as Java does (Hadoop's Bloom filter,
MurmurHash 2), so Java's BloomFilterFactory.fromString reads it back. Hashing is vectorised
with numpy: keys of one byte length are hashed together, 30 hash functions at a time."""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from typing import Iterator

import numpy as np

# footer keys (HoodieBloomFilterWriteSupport, HoodieAvroWriteSupport)
BLOOM_FILTER_KEY = "org.apache.hudi.bloomfilter"
OLD_BLOOM_FILTER_KEY = "com.uber.hoodie.bloomfilter"
TYPE_CODE_KEY = "hoodie_bloom_filter_type_code"
MIN_RECORD_KEY = "hoodie_min_record_key"
MAX_RECORD_KEY = "hoodie_max_record_key"

SIMPLE = "SIMPLE"
DYNAMIC_V0 = "DYNAMIC_V0"

# Java's write defaults: hoodie.index.bloom.num_entries, hoodie.index.bloom.fpp,
# hoodie.bloom.index.filter.dynamic.max.entries, hoodie.bloom.index.filter.type
NUM_ENTRIES = 60000
FPP = 0.000000001
DYNAMIC_MAX_ENTRIES = 100000

MURMUR_HASH = 1  # org.apache.hudi.common.util.hash.Hash.MURMUR_HASH
_VERSION = -1  # InternalFilter's serialisation version
_M = np.uint32(0x5BD1E995)


def bit_size(num_entries: int, fpp: float) -> int:
    """BloomFilterUtils.getBitSize."""
    return int(math.ceil(num_entries * (-math.log(fpp) / (math.log(2) * math.log(2)))))


def num_hashes(bits: int, num_entries: int) -> int:
    """BloomFilterUtils.getNumHashes."""
    return int(math.ceil(math.log(2) * bits / num_entries))


@dataclass
class BloomFilter:
    """A SIMPLE (one bit vector) or DYNAMIC_V0 (rows of bit vectors, each of `row_entries`
    keys, bounded by `max_entries`) Hudi bloom filter."""

    type_code: str
    vector_size: int
    hash_count: int
    # (rows, bytes): each row's bits packed as InternalBloomFilter.write writes them, bit i
    # being bit i % 8 (least significant first) of byte i // 8; a writer keeps one per open file
    bits: np.ndarray
    row_entries: int = 0  # DYNAMIC_V0: keys per row (nr)
    max_entries: int = 0  # DYNAMIC_V0: rows are added up to this many keys (maxNr)
    added: int = 0  # keys added so far

    @classmethod
    def create(cls, type_code: str = DYNAMIC_V0, num_entries: int = NUM_ENTRIES, fpp: float = FPP,
               max_entries: int = DYNAMIC_MAX_ENTRIES) -> BloomFilter:
        """BloomFilterFactory.createBloomFilter (Java's defaults unless given)."""
        size = bit_size(num_entries, fpp)
        dynamic = type_code == DYNAMIC_V0
        return cls(type_code, size, num_hashes(size, num_entries), np.zeros((1, (size + 7) // 8), dtype=np.uint8),
                   num_entries if dynamic else 0, max_entries if dynamic else 0)

    def add(self, keys) -> None:
        """Adds the keys of a pyarrow string array, in order (which row of a dynamic filter
        a key goes to depends on how many came before it)."""
        n = len(keys)
        if not n:
            return
        base = None
        if self.type_code == DYNAMIC_V0:
            row = self._rows_of(np.arange(self.added, self.added + n, dtype=np.int64))
            rows = int(row.max()) + 1
            if rows > len(self.bits):
                self.bits = np.concatenate([self.bits, np.zeros((rows - len(self.bits), self.bits.shape[1]), dtype=np.uint8)])
            if rows > 1:
                base = row * self.vector_size
        self.added += n
        if n * self.hash_count * 8 < self.bits.size:  # a few keys: their bits are set in place
            rows_at = 0 if base is None else base // self.vector_size
            for which, positions in _bit_positions(keys, self.hash_count, self.vector_size):
                np.bitwise_or.at(self.bits, (rows_at if base is None else rows_at[which], positions >> 3),
                                 np.left_shift(1, positions & 7).astype(np.uint8))
            return
        unpacked = np.unpackbits(self.bits, axis=1, count=self.vector_size, bitorder="little")
        flat = unpacked.reshape(-1)
        for which, positions in _bit_positions(keys, self.hash_count, self.vector_size):
            flat[positions if base is None else base[which] + positions] = 1
        self.bits = np.packbits(unpacked, axis=1, bitorder="little")

    def full_rows(self) -> int:
        """A dynamic filter's rows once max_entries is reached."""
        return max(1, -(-self.max_entries // self.row_entries))

    def _rows_of(self, index):
        """The row InternalDynamicBloomFilter.add puts the key with this (0-based) index in: a
        row per `row_entries` keys while rows * row_entries < max_entries; past the last row's
        end, key number rows * row_entries goes to row 0, and the next ones to every row in
        turn starting again from row 0."""
        nr = self.row_entries
        full = self.full_rows()
        end = full * nr
        return np.where(index < end, index // nr, np.where(index == end, 0, (index - end - 1) % full))

    def might_contain(self, key: str) -> bool:
        """BloomFilter.mightContain."""
        import pyarrow as pa

        return bool(self.might_contain_keys(pa.array([key], pa.string()))[0])

    def might_contain_keys(self, keys):
        """mightContain of each key of a pyarrow string array: every bit of the key is set in
        one of the filter's rows."""
        return self.might_contain_at(key_positions(keys, self.hash_count, self.vector_size))

    def might_contain_at(self, positions):
        """might_contain_keys of keys given by their bit positions (key_positions, for this
        filter's hash_count and vector_size): the keys left after each hash are the only ones
        looked up for the next, so a key not in the filter costs about two lookups per row."""
        n = positions.shape[1]
        found = np.zeros(n, dtype=bool)
        for row in self.bits:
            alive = np.arange(n)
            for hashed in positions:
                at = hashed[alive]
                alive = alive[((row[at >> 3] >> (at & 7).astype(np.uint8)) & 1).astype(bool)]
                if not len(alive):
                    break
            found[alive] = True
        return found

    def serialize_to_string(self) -> str:
        """SimpleBloomFilter / HoodieDynamicBoundedBloomFilter.serializeToString: the filter
        written as a Hadoop Writable, in base64."""
        header = struct.pack(">iibi", _VERSION, self.hash_count, MURMUR_HASH, self.vector_size)
        if self.type_code != DYNAMIC_V0:
            return base64.b64encode(header + self.bits[0].tobytes()).decode("ascii")
        current = self.added - (len(self.bits) - 1) * self.row_entries
        out = [header, struct.pack(">iii", self.row_entries, current, len(self.bits))]
        for row in self.bits:
            out += [header, row.tobytes()]
        return base64.b64encode(b"".join(out)).decode("ascii")

    @classmethod
    def from_string(cls, text: str, type_code: str = SIMPLE) -> BloomFilter:
        """BloomFilterFactory.fromString: a footer's filter, of the type its type-code entry
        names (SIMPLE when the footer has none)."""
        data = base64.b64decode(text)

        def header(at: int) -> tuple[int, int, int]:
            version, hashes, hash_type, size = struct.unpack_from(">iibi", data, at)
            if version != _VERSION or hash_type != MURMUR_HASH:
                raise ValueError(f"unsupported bloom filter (version {version}, hash type {hash_type})")
            return hashes, size, at + 13

        def row(at: int, size: int):
            n = (size + 7) // 8
            return np.frombuffer(data, dtype=np.uint8, count=n, offset=at).copy(), at + n

        hashes, size, at = header(0)
        if type_code.upper() != DYNAMIC_V0:
            bits, _ = row(at, size)
            return cls(SIMPLE, size, hashes, bits[None, :], added=0)
        nr, current, count = struct.unpack_from(">iii", data, at)
        at += 12
        rows = []
        for _ in range(count):
            _, _, at = header(at)
            bits, at = row(at, size)
            rows.append(bits)
        # maxNr is not serialised (Java's deserialised filter has 0 too): such a filter is for lookups
        return cls(DYNAMIC_V0, size, hashes, np.stack(rows), nr, 0, (count - 1) * nr + current)


_CHUNK = 1 << 16  # keys hashed together: their arrays stay in the CPU's cache


def key_positions(keys, hash_count: int, vector_size: int):
    """The bit positions of each key of a pyarrow string array: an int64 array (hash_count,
    keys), the same for every filter of these parameters (Java's defaults for all of a table's)."""
    out = np.empty((hash_count, len(keys)), dtype=np.int64)
    group, j = None, 0
    for which, positions in _bit_positions(keys, hash_count, vector_size):
        if which is not group:  # the hashes of one group of keys come in order
            group, j = which, 0
        out[j, which] = positions
        j += 1
    return out


def _bit_positions(keys, hash_count: int, vector_size: int) -> Iterator:
    """(indices into `keys`, bit positions) for each of the hash_count hashes of those keys,
    as Hudi's HashFunction.hash gives them: MurmurHash 2 of the key's UTF-8 bytes, each hash
    seeded with the previous one, the bit being |hash % vector_size| in Java's signed
    arithmetic. Keys are taken a chunk at a time, those of one byte length together."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not (pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type)):
        keys = pc.cast(keys, pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    if keys.null_count:
        raise ValueError("a record key is null")
    wide = pa.types.is_large_binary(keys.type)
    buffers = keys.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32, count=len(keys) + 1,
                            offset=keys.offset * (8 if wide else 4)).astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    if len(keys) and not lengths.min():
        raise ValueError("a record key is empty")  # Java refuses them too ("key length must be > 0")
    for start in range(0, len(keys), _CHUNK):
        chunk = lengths[start:start + _CHUNK]
        sizes = np.unique(chunk)
        for length in sizes:
            length = int(length)
            if len(sizes) == 1:  # one length: the chunk's bytes are already a (keys, length) block
                which = np.arange(start, start + len(chunk))
                rows = data[offsets[start]:offsets[start] + len(chunk) * length].reshape(len(chunk), length)
            else:
                which = start + np.flatnonzero(chunk == length)
                rows = data[offsets[which][:, None] + np.arange(length)]
            for positions in _murmur_positions(rows, length, hash_count, vector_size):
                yield which, positions


def _murmur_positions(rows, length: int, hash_count: int, vector_size: int) -> Iterator:
    """Hudi's MurmurHash.hash (Hadoop's MurmurHash 2) of keys of one byte length, chained
    hash_count times: the bit positions of each hash in turn. The mixing of the four-byte
    blocks does not depend on the seed, so it is done once for all hashes."""
    n = len(rows)
    m, size = _M, np.uint32(vector_size)
    with np.errstate(over="ignore"):
        blocks = length // 4
        # (blocks, keys), always a copy: `rows` may be the Arrow array's own memory
        k = np.array(rows[:, : blocks * 4], dtype=np.uint8, order="C", copy=True).view("<u4").T.copy()
        k *= m
        k ^= k >> np.uint32(24)
        k *= m
        left = length - blocks * 4
        # the last `left` bytes, the last one lowest (Hadoop's order, not the reference
        # MurmurHash2's); Java's bytes are signed, so each is sign-extended before the shift
        tail = np.zeros(n, dtype=np.uint32)
        for i in range(left):
            shift = 8 * (left - 1 - i)
            tail ^= (rows[:, length - left + i].view(np.int8).astype(np.int32) << shift).view(np.uint32)
        h = np.zeros(n, dtype=np.uint32)
        t = np.empty(n, dtype=np.uint32)
        for _ in range(hash_count):
            h ^= np.uint32(length)  # the seed is the previous hash
            for b in range(blocks):
                h *= m
                h ^= k[b]
            if left:
                h ^= tail
                h *= m
            np.right_shift(h, np.uint32(13), out=t)
            h ^= t
            h *= m
            np.right_shift(h, np.uint32(15), out=t)
            h ^= t
            # Math.abs(hash % size) on Java ints: the remainder of the magnitude
            magnitude = np.where(h >> np.uint32(31) != 0, np.negative(h), h)
            yield (magnitude % size).astype(np.int64)


def utf16_min_max(keys) -> tuple[str, str] | tuple[None, None]:
    """The least and greatest of a pyarrow string array in Java's String.compareTo order
    (UTF-16 code units). It is code point order unless a key holds a character past U+FFFF
    (four UTF-8 bytes), whose surrogates sort below U+E000..U+FFFF: then keys are compared as
    UTF-16."""
    import pyarrow.compute as pc

    if not len(keys):
        return None, None
    astral = pc.any(pc.match_substring_regex(keys, "[\U00010000-\U0010FFFF]")).as_py()
    if not astral:
        mm = pc.min_max(keys)
        return mm["min"].as_py(), mm["max"].as_py()
    values = keys.to_pylist()
    return min(values, key=utf16), max(values, key=utf16)


def utf16(text: str) -> bytes:
    """A key in Java's String order: its UTF-16BE bytes compare as Java compares strings."""
    return text.encode("utf-16-be", "surrogatepass")


class BloomFilterWriteSupport:
    """HoodieBloomFilterWriteSupport for one base file: its keys go in (add_keys, in the
    order the rows are written), its footer entries come out (finalize_metadata)."""

    def __init__(self):
        self.filter = BloomFilter.create()
        self.min_key: str | None = None
        self.max_key: str | None = None
        self.continued = False  # the filter is the stored file's: add_keys takes key ranges only

    def continue_from(self, footer: dict | None, rows: int) -> bool:
        """Starts from the filter of the base file being rewritten (its footer's key-value
        metadata, and its number of rows) when it is the filter this writer would build for
        those rows: Java's defaults, one key per row. A rewrite that keeps every stored key
        (updates and inserts, nothing deleted) then hashes only its new keys (add_new_keys)
        instead of every row again. The filter holds every key of the new file; when each
        stored key is in it once and the inserts are new keys (as pipe's writes make them),
        it is bit for bit the filter built from the new file's keys in their order, the
        stored rows kept in their order and the inserts after them. Returns whether it went
        on; otherwise nothing changes."""
        try:
            stored = footer_bloom_filter(footer or {})
        except (ValueError, struct.error):
            return False  # unreadable: the new file's filter is built from its rows
        fresh = self.filter
        if stored is None or (stored.type_code, stored.vector_size, stored.hash_count, stored.row_entries, stored.added) != (
                fresh.type_code, fresh.vector_size, fresh.hash_count, fresh.row_entries, rows) or not rows:
            return False
        if len(stored.bits) != min(fresh.full_rows(), -(-rows // fresh.row_entries)):  # its rows as this writer's bound makes them
            return False
        stored.max_entries = fresh.max_entries  # not serialised: the writer's bound
        self.filter, self.continued = stored, True
        return True

    def add_new_keys(self, keys) -> None:
        """Keys a continued filter does not hold yet (a rewrite's inserts)."""
        if len(keys):
            self.filter.add(keys)

    def add_keys(self, keys) -> None:
        if not len(keys):
            return
        if not self.continued:
            self.filter.add(keys)
        low, high = utf16_min_max(keys)
        if self.min_key is None or utf16(low) < utf16(self.min_key):
            self.min_key = low
        if self.max_key is None or utf16(high) > utf16(self.max_key):
            self.max_key = high

    def finalize_metadata(self) -> dict[str, str]:
        meta = {BLOOM_FILTER_KEY: self.filter.serialize_to_string()}
        if "DYNAMIC" in self.filter.type_code:  # Java names the type only for dynamic filters
            meta[TYPE_CODE_KEY] = self.filter.type_code
        if self.min_key is not None:
            meta[MIN_RECORD_KEY] = self.min_key
            meta[MAX_RECORD_KEY] = self.max_key
        return meta


def footer_bytes(num_keys: int) -> int:
    """About how many bytes the bloom filter adds to the footer of a base file of `num_keys`
    keys (Java's defaults, as pipe and Java write them): a write's bytes per record are
    estimated without it, or every small file would look like large records."""
    bits = bit_size(NUM_ENTRIES, FPP)
    rows = min(max(1, -(-DYNAMIC_MAX_ENTRIES // NUM_ENTRIES)), max(1, -(-num_keys // NUM_ENTRIES)))
    raw = 13 + 12 + rows * (13 + (bits + 7) // 8)
    return 4 * -(-raw // 3)


def footer_metadata(metadata: dict | None) -> dict[str, str]:
    """A base file's footer key-value metadata (bytes or str keys and values) as text."""
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in (metadata or {}).items()}


def footer_bloom_filter(metadata: dict) -> BloomFilter | None:
    """The bloom filter of a base file's footer key-value metadata (bytes or str keys), as
    ParquetUtils.readBloomFilterFromMetadata finds it; None without one."""
    meta = footer_metadata(metadata)
    text = meta.get(BLOOM_FILTER_KEY) or meta.get(OLD_BLOOM_FILTER_KEY)
    if text is None:
        return None
    return BloomFilter.from_string(text, meta.get(TYPE_CODE_KEY, SIMPLE))
