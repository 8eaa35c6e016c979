"""HFile (version 3), the file format of Hudi's metadata table: its base files (`*.hfile`) and
the content of its log files' HFILE data blocks. Written as Hudi's writers write it
(HoodieAvroHFileWriter, HoodieHFileDataBlock) and read as both Hudi's native Java reader
(hudi-io HFileReaderImpl) and hudi-rs read it:

    data blocks   "DATABLK*"  sorted cells: i32 key length, i32 value length, key, value, one 0 byte (MVCC)
    meta blocks   "METABLKc"  named values (a base file's "bloomFilter")
    root index    "IDXROOT2"  one entry per data block: i64 offset, i32 on-disk size, VInt length, first key
    meta index    "IDXROOT2"  one entry per meta block: i64 offset, i32 on-disk size, VInt length, name
    file info     "FILEINF2"  "PBUF" + a length-delimited protobuf map (hfile.LASTKEY, schema, ...)
    trailer       "TRABLK\"$" the last 4096 bytes: a length-delimited protobuf, then the version 3

Every block has the 33-byte header (magic, on-disk size without header, uncompressed size, the
previous block's offset, checksum type, bytes per checksum, on-disk size with header) and is
compressed with the file's codec (GZ, one gzip member, as Hudi writes by default; or NONE); the
checksum area is zeros of type NULL, as Hudi's native writer leaves it, sized as the readers
size it (their count includes the area itself). A cell's key is Hudi's record key (the row; no
family, no qualifier, the latest timestamp, type Put); readers compare rows only.

Blocks are cut at 64 KiB of cells: Java 1.1's reader skips a block's last cell when it is no
longer than the block's checksum area, which a block of this size can never have."""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field

DATA, META, ROOT_INDEX, FILE_INFO, TRAILER = b"DATABLK*", b"METABLKc", b"IDXROOT2", b"FILEINF2", b'TRABLK"$'
HEADER = 33
TRAILER_SIZE = 4096
BYTES_PER_CHECKSUM = 16384
GZ, NONE = 1, 2
BLOCK_SIZE = 64 * 1024
# gzip's fastest level: a block of record-index entries compresses 5x faster than at level 9
# (0.3 ms against 1.7), 9% larger, and decompresses as fast (readers do not care which level)
GZ_LEVEL = 1
# a lookup finds a block's rows by their keys' bytes (one scan of the block for the rows it
# holds, in order); after this many rows it lacks (a scan each), the rest of the block is
# walked cell by cell instead, when twice as many rows are still to find. A 64 KiB block of
# record-index entries holds about 1,000 cells: walking them costs about as much as 16
# scans (0.5 ms against 30 us a scan).
FIND_MISSES = 4
COMPARATOR = "org.apache.hudi.io.storage.HoodieHBaseKVComparator"
_LATEST = 0x7FFFFFFFFFFFFFFF
_PUT = 4
_KEY_TAIL = b"\x00" + struct.pack(">q", _LATEST) + bytes([_PUT])  # no family, no qualifier, the latest timestamp, Put


class HFileError(ValueError):
    """Bytes that are not an HFile this module reads (another writer's file, or damaged)."""


# --- encodings ------------------------------------------------------------------------------

def _vint(n: int) -> bytes:
    """Hadoop WritableUtils VLong of a non-negative n (what both readers decode index lengths with)."""
    if n < 0:
        raise ValueError("negative length")
    if n <= 127:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([(-112 - len(body)) & 0xFF]) + body


def _read_vint(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos] - 256 if data[pos] > 127 else data[pos]
    if first >= -112:
        return first, pos + 1
    if first < -120:
        raise HFileError("a negative length in an HFile index")
    size = -112 - first
    return int.from_bytes(data[pos + 1:pos + 1 + size], "big"), pos + 1 + size


def _pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_pb_varint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise HFileError("a truncated protobuf varint")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, pos


def _pb_fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: varints and length-delimited bytes only."""
    out, pos = [], 0
    while pos < len(data):
        tag, pos = _read_pb_varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_pb_varint(data, pos)
        elif wire == 2:
            size, pos = _read_pb_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        else:
            raise HFileError(f"protobuf wire type {wire} in an HFile")
        out.append((number, value))
    return out


def _pb_bytes(number: int, value: bytes) -> bytes:
    return _pb_varint(number << 3 | 2) + _pb_varint(len(value)) + value


def _pb_uint(number: int, value: int) -> bytes:
    return _pb_varint(number << 3) + _pb_varint(value & 0xFFFFFFFFFFFFFFFF)


# --- writing --------------------------------------------------------------------------------

def _checksum_chunks(stored: int) -> int:
    """How many 4-byte checksums follow `stored` payload bytes: the readers count them with the
    area itself included, ceil((33 + stored + 4n) / 16384) = n."""
    n = -(-(HEADER + stored) // BYTES_PER_CHECKSUM)
    while -(-(HEADER + stored + 4 * n) // BYTES_PER_CHECKSUM) > n:
        n += 1
    return n


def _block(magic: bytes, payload: bytes, codec: int, prev_offset: int = -1) -> bytes:
    stored = gzip.compress(payload, compresslevel=GZ_LEVEL, mtime=0) if codec == GZ else payload
    area = 4 * _checksum_chunks(len(stored))
    header = magic + struct.pack(">iiqbii", len(stored) + area, len(payload), prev_offset, 0, BYTES_PER_CHECKSUM, HEADER + len(stored))
    return header + stored + bytes(area)


def write(cells: list[tuple[bytes, bytes]], file_info: dict[str, bytes] | None = None,
          meta: dict[str, bytes] | None = None, codec: int = GZ, created_ms: int = 0) -> bytes:
    """An HFile of `cells` ((row, value), sorted by row bytes, no row twice), with the `file_info`
    entries (besides HFile's own) and the named `meta` blocks."""
    for (a, _), (b, _) in zip(cells, cells[1:]):
        if not a < b:
            raise ValueError(f"HFile cells must be sorted with no key twice: {a!r} then {b!r}")
    out = bytearray()
    index, block, size, prev = [], bytearray(), 0, -1
    first = None

    def flush():
        nonlocal block, size, prev, first
        if block:
            data = _block(DATA, bytes(block), codec, prev)
            index.append((len(out), len(data), first))
            prev = len(out)
            out.extend(data)
        block, size, first = bytearray(), 0, None

    rows_total = values_total = 0
    lengths = struct.Struct(">iih").pack
    for row, value in cells:
        if len(row) > 32767:
            raise ValueError(f"an HFile row key is at most 32767 bytes, not {len(row)}")
        klen, vlen = len(row) + 2 + len(_KEY_TAIL), len(value)
        rows_total += len(row)
        values_total += vlen
        if block and size + klen + vlen + 9 > BLOCK_SIZE:
            flush()
        if first is None:
            first = row
        block += lengths(klen, vlen, len(row))
        block += row
        block += _KEY_TAIL
        block += value
        block += b"\x00"
        size += klen + vlen + 9
    flush()
    last_data = index[-1][0] if index else -1
    metas = []
    for name, value in sorted((meta or {}).items()):
        data = _block(META, value, codec)
        metas.append((len(out), len(data), name.encode("utf-8")))
        out.extend(data)
    load_on_open = len(out)
    root = b"".join(struct.pack(">qi", off, size) + _vint(len(k) + 2) + struct.pack(">h", len(k)) + k for off, size, k in index)
    out.extend(_block(ROOT_INDEX, root, codec))
    out.extend(_block(ROOT_INDEX, b"".join(struct.pack(">qi", off, size) + _vint(len(n)) + n for off, size, n in metas), codec))
    info = {"KEY_VALUE_VERSION": struct.pack(">i", 1), "MAX_MEMSTORE_TS_KEY": struct.pack(">q", 0),
            "hfile.AVG_KEY_LEN": struct.pack(">i", rows_total // len(cells) if cells else 0),
            "hfile.AVG_VALUE_LEN": struct.pack(">i", values_total // len(cells) if cells else 0),
            "hfile.CREATE_TIME_TS": struct.pack(">q", created_ms)}
    if cells:
        info["hfile.LASTKEY"] = struct.pack(">h", len(cells[-1][0])) + cells[-1][0]
    info.update(file_info or {})
    proto = b"".join(_pb_bytes(1, _pb_bytes(1, k.encode("utf-8")) + _pb_bytes(2, v)) for k, v in sorted(info.items()))
    file_info_offset = len(out)
    out.extend(_block(FILE_INFO, b"PBUF" + _pb_varint(len(proto)) + proto, codec))
    trailer = (_pb_uint(1, file_info_offset) + _pb_uint(2, load_on_open) + _pb_uint(3, len(root))
               + _pb_uint(4, rows_total + values_total) + _pb_uint(5, len(index)) + _pb_uint(6, len(metas))
               + _pb_uint(7, len(cells)) + _pb_uint(8, 1) + _pb_uint(9, 0 if index else -1) + _pb_uint(10, last_data)
               + _pb_bytes(11, COMPARATOR.encode("ascii")) + _pb_uint(12, codec))
    body = TRAILER + _pb_varint(len(trailer)) + trailer
    out.extend(body + bytes(TRAILER_SIZE - 4 - len(body)) + bytes([3, 0, 0, 3]))
    return bytes(out)


# --- reading --------------------------------------------------------------------------------

@dataclass
class HFile:
    cells: list[tuple[bytes, bytes]] = field(default_factory=list)  # (row, value), in file order
    file_info: dict[str, bytes] = field(default_factory=dict)
    meta: dict[str, bytes] = field(default_factory=dict)


def _read_block(data: bytes, offset: int, codec: int, magic: bytes) -> tuple[bytes, int]:
    """The payload of the block at `offset` and where the next one starts."""
    if data[offset:offset + 8] != magic:
        raise HFileError(f"expected an HFile {magic.decode()} block at offset {offset}, found {data[offset:offset + 8]!r}")
    on_disk, uncompressed = struct.unpack(">ii", data[offset + 8:offset + 16])
    bpc = struct.unpack(">i", data[offset + 25:offset + 29])[0]
    if on_disk < 0 or uncompressed < 0 or bpc <= 0 or offset + HEADER + on_disk > len(data):
        raise HFileError(f"the HFile block at offset {offset} has impossible sizes")
    area = 4 * -(-(HEADER + on_disk) // bpc)
    stored = data[offset + HEADER:offset + HEADER + on_disk - area] if codec == GZ else data[offset + HEADER:offset + HEADER + uncompressed]
    try:
        payload = zlib.decompressobj(wbits=31).decompress(stored) if codec == GZ else stored
    except zlib.error as exc:
        raise HFileError(f"the HFile block at offset {offset} does not decompress ({exc})") from None
    if len(payload) != uncompressed:
        raise HFileError(f"the HFile block at offset {offset} holds {len(payload)} bytes, not {uncompressed}")
    return payload, offset + HEADER + on_disk



def _ours(block: bytes) -> bool:
    """Whether the block's first cell has the key layout `write` gives every cell (a row and
    _KEY_TAIL): then a row's cell is found by its key's bytes."""
    if len(block) < 10:
        return False
    klen = struct.unpack(">i", block[:4])[0]
    rlen = struct.unpack(">h", block[8:10])[0]
    return klen == rlen + 2 + len(_KEY_TAIL) and block[10 + rlen:8 + klen] == _KEY_TAIL


def _find_cells(block: bytes, rows: list[bytes], offset: int) -> list[tuple[bytes, bytes]]:
    """The cells of `rows` in a block of `write`'s layout, each found by bytes.find of its whole
    key (a match is taken only where the cell's own lengths frame it). The cells are in row
    order, so each row is looked for after the cell of the row before it that was found: the
    rows the block holds cost one scan of it together, and each row it lacks a scan from there.
    After FIND_MISSES rows it lacks, with twice as many still to find, the rest of the block is
    walked cell by cell instead."""
    found = []
    start, misses = 0, 0
    rows = sorted(rows)
    for i, row in enumerate(rows):
        key = struct.pack(">h", len(row)) + row + _KEY_TAIL
        at = block.find(key, start)
        while at >= 8:
            klen, vlen = struct.unpack(">ii", block[at - 8:at])
            if klen == len(key) and vlen >= 0 and at + klen + vlen < len(block) + 1:
                found.append((row, block[at + klen:at + klen + vlen]))
                start = at + klen + vlen + 1  # the next cell (after the value, a memstore-ts byte)
                break
            at = block.find(key, at + 1)
        else:
            misses += 1
            if misses >= FIND_MISSES and len(rows) - i - 1 >= 2 * FIND_MISSES:
                found.extend(_walk_cells(block, start, set(rows[i + 1:]), offset))
                break
    return found


def _walk_cells(block: bytes, at: int, wanted: set[bytes] | None, offset: int) -> list[tuple[bytes, bytes]]:
    """The cells of a data block from `at` (a cell's start) on, each read by its lengths (only
    those of `wanted` rows, when given); `offset`: the block's, for the error."""
    out = []
    unpack = _CELL.unpack_from
    end = len(block)
    while at < end:
        if at + 10 > end:
            raise HFileError(f"a damaged cell in the HFile data block at offset {offset}")
        klen, vlen, rlen = unpack(block, at)
        if rlen < 0 or klen < rlen + 2 or vlen < 0 or at + 9 + klen + vlen > end:
            raise HFileError(f"a damaged cell in the HFile data block at offset {offset}")
        row = block[at + 10:at + 10 + rlen]
        if wanted is None or row in wanted:
            out.append((row, block[at + 8 + klen:at + 8 + klen + vlen]))
        at += 9 + klen + vlen
    return out


_CELL = struct.Struct(">iih")


class _Ranges:
    """A stored HFile read in ranges (Storage.read_range): its slices are taken from the ranges
    fetched so far; a slice none holds is fetched on its own."""

    def __init__(self, fetch, size: int):
        self.fetch, self.size = fetch, size
        self.parts: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return self.size

    def load(self, start: int, end: int) -> None:
        start, end = max(0, start), min(self.size, end)
        if start < end:
            self.parts.append((start, self.fetch(start, end)))

    def __getitem__(self, key):
        if isinstance(key, int):
            return self[key:key + 1 if key != -1 else None][0]
        start, stop, _ = key.indices(self.size)
        for at, part in self.parts:
            if at <= start and stop <= at + len(part):
                return part[start - at:stop - at]
        self.load(start, stop)
        return self.parts[-1][1] if self.parts and self.parts[-1][0] == start else b""


# wanted data blocks closer than this are fetched in one range (a stored file: fewer requests)
RANGE_GAP = 1 << 20


def read_stored(fetch, size: int, rows: list[bytes]) -> HFile:
    """read(..., rows) of a stored HFile of `size` bytes, fetching only its trailer, its index
    and file info, and the data blocks that may hold `rows` (`fetch(start, end)`: the bytes
    [start, end), as Storage.read_range), as Hudi's readers seek."""
    return read(_Ranges(fetch, size), rows)


def read(data: bytes, rows: list[bytes] | None = None) -> HFile:
    """Every cell, the file info and the meta blocks of an HFile (HFileError if it is not one).
    `rows` (sorted): only the cells with those rows, from only the data blocks that may hold
    them (the root index names each block's first row), as a reader looking keys up does;
    the meta blocks (a base file's bloom filter) are then not read."""
    ranged = isinstance(data, _Ranges)
    if ranged:
        data.load(data.size - TRAILER_SIZE, data.size)
    if len(data) < TRAILER_SIZE or data[-TRAILER_SIZE:-TRAILER_SIZE + 8] != TRAILER or data[-3:] != b"\x00\x00\x03":
        raise HFileError("not an HFile of version 3 (no trailer)")
    size, pos = _read_pb_varint(data, len(data) - TRAILER_SIZE + 8)
    trailer = dict(_pb_fields(data[pos:pos + size]))
    codec = trailer.get(12, NONE)
    if codec not in (GZ, NONE):
        raise HFileError(f"HFile compression codec {codec} is not read (only GZ and NONE, as Hudi's readers)")
    if trailer.get(8, 1) != 1:
        raise HFileError("a multi-level HFile index is not read")
    offset = trailer.get(2)
    if not isinstance(offset, int) or not 0 <= offset < len(data):
        raise HFileError("the HFile trailer has no load-on-open offset")
    if ranged:  # the root index, the meta index and the file info, up to the trailer
        data.load(offset, data.size - TRAILER_SIZE)
    root, offset = _read_block(data, offset, codec, ROOT_INDEX)
    metas, offset = _read_block(data, offset, codec, ROOT_INDEX)
    info_payload, _ = _read_block(data, offset, codec, FILE_INFO)
    out = HFile()
    if info_payload[:4] != b"PBUF":
        raise HFileError("the HFile file info does not start with PBUF")
    size, pos = _read_pb_varint(info_payload, 4)
    for number, pair in _pb_fields(info_payload[pos:pos + size]):
        kv = dict(_pb_fields(pair)) if number == 1 and isinstance(pair, bytes) else {}
        if isinstance(kv.get(1), bytes) and isinstance(kv.get(2), bytes):
            out.file_info[kv[1].decode("utf-8", "replace")] = kv[2]
    pos = 0
    for _ in range(trailer.get(6, 0) if rows is None else 0):
        off, _size = struct.unpack(">qi", metas[pos:pos + 12])
        n, pos = _read_vint(metas, pos + 12)
        name, pos = metas[pos:pos + n].decode("utf-8", "replace"), pos + n
        out.meta[name] = _read_block(data, off, codec, META)[0]
    pos = 0
    blocks = []  # (offset, first row)
    sizes = {}  # offset -> the block's size on disk, with its header
    for _ in range(trailer.get(5, 0)):
        off, sizes_on_disk = struct.unpack(">qi", root[pos:pos + 12])
        n, pos = _read_vint(root, pos + 12)
        entry = root[pos:pos + n]
        pos += n
        first = entry[2:2 + struct.unpack(">h", entry[:2])[0]] if len(entry) >= 2 else b""
        blocks.append((off, first))
        sizes[off] = sizes_on_disk
    wanted = None
    per_block: dict[int, list[bytes]] = {}  # block offset -> the rows it may hold
    if rows is not None:
        import bisect

        firsts = [f for _, f in blocks]
        wanted = set(rows)
        for r in wanted:
            i = bisect.bisect_right(firsts, r) - 1
            if i >= 0:
                per_block.setdefault(blocks[i][0], []).append(r)
        blocks = [b for b in blocks if b[0] in per_block]
    if ranged:  # the blocks to read, in as few ranges as their gaps allow
        run = None
        for off, _ in sorted(blocks):
            end = off + max(sizes[off], HEADER)
            if run is not None and off - run[1] <= RANGE_GAP:
                run = (run[0], max(run[1], end))
                continue
            if run is not None:
                data.load(*run)
            run = (off, end)
        if run is not None:
            data.load(*run)
    for off, _ in blocks:
        block, _ = _read_block(data, off, codec, DATA)
        if wanted is not None and _ours(block):
            out.cells.extend(_find_cells(block, per_block[off], off))  # (a lookup's rows: found by their keys' bytes)
        else:
            out.cells.extend(_walk_cells(block, 0, wanted, off))
    if wanted is None and len(out.cells) != trailer.get(7, 0):
        raise HFileError(f"the HFile holds {len(out.cells)} cells, its trailer says {trailer.get(7, 0)}")
    return out
