"""hoodie.properties: what a table is (name, type, keys, partitioning, merge mode), written at
creation with every key Hudi readers expect (HUDI_FORMAT.md section 1.1), in Java's
`Properties.store` encoding; which tables pipe can read and write (table version, timeline
layout, Java features it does not reproduce); and Hudi's crash-safe update of the file
(`HoodieTableConfig.modify`: a backup first, readers fall back to it)."""

from __future__ import annotations

import datetime as dt
import functools
import zlib
from dataclasses import dataclass, field, replace
from typing import Mapping

from runtime.table.errors import TableError

PROPERTIES = ".hoodie/hoodie.properties"
PROPERTIES_BACKUP = ".hoodie/hoodie.properties.backup"
METADATA_TABLE = ".hoodie/metadata"
# the table version and timeline layout pipe writes (Hudi 0.14/0.15); it reads 4 and 5 too
# (Hudi 0.11 to 0.13: the same files and timeline; see docs/tables.md)
TABLE_VERSION, TIMELINE_LAYOUT = 6, 1
READABLE_VERSIONS = (4, 5, 6)
# Hudi 1.x's versions (timeline layout 2): pipe reads their copy-on-write tables' snapshots
READABLE_1X = (8, 9)
_METADATA_PARTITIONS = ("hoodie.table.metadata.partitions", "hoodie.table.metadata.partitions.inflight")
DATABASE = "default"

COPY_ON_WRITE, MERGE_ON_READ = "COPY_ON_WRITE", "MERGE_ON_READ"
_KEYGEN = "org.apache.hudi.keygen."
# Event-time ordering: the largest precombine value wins, also against the stored row.
_EVENT_TIME_PAYLOAD = "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
_COMMIT_TIME_PAYLOAD = "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"
# Merge modes of a merge-on-read read (read_merge_mode).
COMMIT_TIME, EVENT_TIME, APPEND_ONLY = "COMMIT_TIME_ORDERING", "EVENT_TIME_ORDERING", "APPEND_ONLY"
# hoodie.record.merge.strategy.id of version 8 tables (Hudi's HoodieRecordMerger)
_EVENT_TIME_STRATEGY, _COMMIT_TIME_STRATEGY = "eeb8d96f-b1e4-49fd-bbf8-28ac514178e5", "ce9acb64-bde0-424c-9b91-f6ebba25356d"
_PAYLOAD_MODES = {_COMMIT_TIME_PAYLOAD: COMMIT_TIME, _EVENT_TIME_PAYLOAD: EVENT_TIME}


@dataclass(frozen=True)
class TableConfig:
    name: str
    table_type: str = COPY_ON_WRITE
    record_key_fields: tuple[str, ...] = ()
    partition_fields: tuple[str, ...] = ()
    precombine_field: str | None = None
    hive_style: bool = True
    url_encode: bool = True
    # as read from an existing table; pipe itself always writes meta fields and derives the class
    key_generator_class: str | None = None
    populate_meta_fields: bool = True
    metadata_partitions: str = ""  # a Java writer's metadata table, which pipe does not maintain
    payload_class: str | None = None  # hoodie.compaction.payload.class, as read
    record_merge_mode: str | None = None  # hoodie.record.merge.mode, as read
    # hoodie.table.complex.keygen.encoding: FIELD_PREFIXED (`id:1`) or VALUE_ONLY (`1`), for a
    # ComplexKeyGenerator with one key field (keygen.py); None: undeclared (found from stored keys)
    complex_key_encoding: str | None = None
    # not a property: the table's stored keys hold Spark's text of timestamps, decimals and
    # binary values (pipe's before it wrote Java's); found from a stored row (keygen.settle);
    # None: not looked at yet (Java's text is written)
    legacy_value_text: bool | None = None
    create_schema: str | None = None  # hoodie.table.create.schema: the Avro schema of the first write
    # not a property: the table version a new table is created with (6, 8 or 9); an existing
    # table's is `table_version`, as read
    create_version: int = field(default=TABLE_VERSION, compare=False)
    # pipe keeps a metadata table (its files partition) for this table, and builds one if it has none
    metadata_table: bool = field(default=False, compare=False)
    # pipe keeps a record index in the metadata table (record_index.py), and builds one if it has none
    record_index: bool = field(default=False, compare=False)
    # Hudi's simple bucket index: the number of buckets per partition (bucket_index.py); None: none
    buckets: int | None = field(default=None, compare=False)
    # not a property: the change data capture log a new table keeps (cdc_log's OP_KEY_ONLY,
    # DATA_BEFORE or DATA_BEFORE_AFTER); None: none (an existing table's is cdc_log.mode_of)
    cdc_mode: str | None = field(default=None, compare=False)
    # every property as read (None: a config pipe is about to create)
    properties: Mapping[str, str] | None = field(default=None, compare=False, repr=False)

    @property
    def is_partitioned(self) -> bool:
        return bool(self.partition_fields)

    @property
    def key_generator(self) -> str:
        if self.key_generator_class:
            return self.key_generator_class
        if not self.partition_fields:
            cls = "NonpartitionedKeyGenerator"
        elif len(self.record_key_fields) <= 1 and len(self.partition_fields) == 1:
            cls = "SimpleKeyGenerator"
        else:
            cls = "ComplexKeyGenerator"
        return _KEYGEN + cls

    @property
    def complex_single_key(self) -> bool:
        """A ComplexKeyGenerator with one record key field (whose key text Hudi versions disagree on)."""
        return self.key_generator == _KEYGEN + "ComplexKeyGenerator" and len(self.record_key_fields) == 1

    @property
    def event_time_ordering(self) -> bool:
        return self.precombine_field is not None

    def read_merge_mode(self) -> str:
        """How a merge-on-read reader orders the versions of a key (HUDI_FORMAT 6.5): COMMIT_TIME
        (the later write wins), EVENT_TIME (the larger precombine value wins; a tie goes to the
        later write) or APPEND_ONLY (no meta fields, so no key to merge on: rows are
        concatenated). An explicit hoodie.record.merge.mode decides; else the payload class;
        else event time when there is a precombine field."""
        if not self.populate_meta_fields:
            return APPEND_ONLY
        mode = (self.record_merge_mode or "").upper()
        if not mode and self.payload_class:
            mode = _PAYLOAD_MODES.get(self.payload_class, "")
            if not mode:
                raise TableError(f"table {self.name} merges its log files with payload class {self.payload_class}, "
                                 "which pipe (like hudi-rs) cannot apply",
                                 "compact the table with Hudi first, or read it with a Java Hudi reader")
        if not mode:
            mode = EVENT_TIME if self.precombine_field else COMMIT_TIME
        if mode not in (COMMIT_TIME, EVENT_TIME):
            raise TableError(f"table {self.name} declares hoodie.record.merge.mode={self.record_merge_mode}, "
                             "which pipe cannot apply (it knows COMMIT_TIME_ORDERING and EVENT_TIME_ORDERING)",
                             "compact the table with Hudi first, or read it with a Java Hudi reader")
        return EVENT_TIME if mode == EVENT_TIME and self.precombine_field else COMMIT_TIME

    @property
    def checksum(self) -> int:
        return zlib.crc32(f"{DATABASE}.{self.name}".encode("utf-8"))

    def to_properties(self, now: dt.datetime | None = None) -> str:
        now = now or dt.datetime.now(dt.timezone.utc)
        props = {
            "hoodie.table.name": self.name,
            "hoodie.database.name": DATABASE,
            "hoodie.table.type": self.table_type,
            "hoodie.table.version": "6",
            "hoodie.timeline.layout.version": "1",
            "hoodie.table.timeline.timezone": "UTC",
            "hoodie.table.base.file.format": "PARQUET",
            "hoodie.table.recordkey.fields": ",".join(self.record_key_fields),
            "hoodie.table.partition.fields": ",".join(self.partition_fields),
            "hoodie.table.keygenerator.class": self.key_generator,
            "hoodie.datasource.write.hive_style_partitioning": str(self.hive_style).lower(),
            "hoodie.datasource.write.partitionpath.urlencode": str(self.url_encode).lower(),
            "hoodie.datasource.write.drop.partition.columns": "false",
            "hoodie.populate.meta.fields": "true",
            "hoodie.archivelog.folder": "archived",
            "hoodie.compaction.payload.class": _EVENT_TIME_PAYLOAD if self.event_time_ordering else _COMMIT_TIME_PAYLOAD,
            "hoodie.record.merge.mode": "EVENT_TIME_ORDERING" if self.event_time_ordering else "COMMIT_TIME_ORDERING",
            "hoodie.table.checksum": str(self.checksum),
        }
        if self.precombine_field:
            props["hoodie.table.precombine.field"] = self.precombine_field
        if self.create_version in READABLE_1X:
            props.update(self._properties_1x())
            if self.create_version == 9:  # its ordering field names the precombine field; no payload class
                del props["hoodie.compaction.payload.class"]
                props.pop("hoodie.table.precombine.field", None)
        if self.complex_single_key:  # Java's current default text, declared for Java's validation
            props["hoodie.table.complex.keygen.encoding"] = self.complex_key_encoding or "FIELD_PREFIXED"
        if self.create_schema:
            props["hoodie.table.create.schema"] = self.create_schema
        if self.cdc_mode:
            from runtime.table import cdc_log

            props.update({cdc_log.ENABLED: "true", cdc_log.MODE: self.cdc_mode})
        if self.buckets:  # Java keeps these as write settings only: declared here for pipe's next write and for people
            from runtime.table import bucket_index

            props.update({bucket_index.INDEX_TYPE: "BUCKET", bucket_index.ENGINE: "SIMPLE", bucket_index.NUM_BUCKETS: str(self.buckets),
                          bucket_index.HASH_FIELD: ",".join(self.record_key_fields)})
        return store_properties(props, "Properties saved on " + now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z")

    def _properties_1x(self) -> dict[str, str]:
        """What a table Hudi 1.x creates at version 8 or 9 declares beyond version 6's keys
        (docs/hudi-1x-format.md 1.1): timeline layout 2 in .hoodie/timeline/, the key
        generator's type, the merge mode; version 8 keeps the precombine field, payload class and
        merge strategy, version 9 names the ordering field and drops the other two."""
        keygen = {c: t for t, c in _KEYGEN_TYPES.items()}[self.key_generator]
        props = {
            "hoodie.table.version": str(self.create_version), "hoodie.table.initial.version": str(self.create_version),
            "hoodie.timeline.layout.version": "2", "hoodie.timeline.path": "timeline", "hoodie.timeline.history.path": "history",
            "hoodie.table.keygenerator.type": keygen,
        }
        if self.create_version == 8:
            props["hoodie.record.merge.strategy.id"] = _EVENT_TIME_STRATEGY if self.event_time_ordering else _COMMIT_TIME_STRATEGY
        else:
            props["hoodie.table.format"] = "native"
            if self.precombine_field:
                props["hoodie.table.ordering.fields"] = self.precombine_field
        return props

    @classmethod
    def from_properties(cls, text: str) -> "TableConfig":
        return cls.from_properties_map(parse_properties(text))

    @classmethod
    def from_properties_map(cls, props: Mapping[str, str]) -> "TableConfig":
        split = lambda v: tuple(x for x in (v or "").split(",") if x)  # noqa: E731
        # version 9 may name it by type only (hoodie.table.keygenerator.type, Hudi's KeyGeneratorType)
        keygen = props.get("hoodie.table.keygenerator.class", "") or _KEYGEN_TYPES.get((props.get("hoodie.table.keygenerator.type") or "").strip().upper(), "")
        partitions = () if keygen.endswith("NonpartitionedKeyGenerator") else split(props.get("hoodie.table.partition.fields"))
        return cls(
            name=props["hoodie.table.name"],
            table_type={"cow": COPY_ON_WRITE, "mor": MERGE_ON_READ}.get(props["hoodie.table.type"].lower(), props["hoodie.table.type"].upper()),
            record_key_fields=split(props.get("hoodie.table.recordkey.fields")),
            partition_fields=partitions,
            # version 9 keeps it as hoodie.table.ordering.fields (a list: one field is a precombine field)
            precombine_field=props.get("hoodie.table.precombine.field") or _one_field(props.get("hoodie.table.ordering.fields")),
            hive_style=props.get("hoodie.datasource.write.hive_style_partitioning", "false") == "true",
            url_encode=props.get("hoodie.datasource.write.partitionpath.urlencode", "false") == "true",
            key_generator_class=keygen or None,
            populate_meta_fields=props.get("hoodie.populate.meta.fields", "true") == "true",
            metadata_partitions=props.get("hoodie.table.metadata.partitions", ""),
            payload_class=props.get("hoodie.compaction.payload.class") or None,
            record_merge_mode=props.get("hoodie.record.merge.mode") or None,
            complex_key_encoding=(props.get("hoodie.table.complex.keygen.encoding") or "").strip().upper() or None,
            create_schema=props.get("hoodie.table.create.schema") or None,
            buckets=_simple_buckets(props),
            properties=props,
        )

    @property
    def table_version(self) -> int:
        return _int((self.properties or {}).get("hoodie.table.version"), TABLE_VERSION)

    @property
    def timeline_layout(self) -> int:
        """1: instants in .hoodie/ (versions 4 to 6); 2: in .hoodie/timeline/ (Hudi 1.x's versions 8 and 9)."""
        return _int((self.properties or {}).get("hoodie.timeline.layout.version"), 2 if self.table_version >= 8 else TIMELINE_LAYOUT)

    @property
    def has_metadata_table(self) -> bool:
        """A Java writer's metadata table (Hudi's default since 0.11), complete or being built."""
        return any((self.properties or {}).get(k) for k in _METADATA_PARTITIONS) or bool(self.metadata_partitions)

    def unreadable_reason(self, storage) -> str | None:
        """Why pipe cannot read this table (a table version or timeline layout it does not
        know, or a Java feature that changes what the files mean), or None. `storage` is
        the table's, for the folders some features leave under .hoodie."""
        props = self.properties or {}
        version = self.table_version
        layout = _int(props.get("hoodie.timeline.layout.version"), TIMELINE_LAYOUT)
        # Hudi 1.x keeps the timeline of version 8+ tables in .hoodie/<hoodie.timeline.path>; for a
        # version 6 table it reads .hoodie/ whatever that property says, and its downgrade to
        # version 6 leaves the property and an empty .hoodie/timeline/history/ behind. Only
        # instant files there mean the timeline moved, unless each is a copy of an instant still
        # in .hoodie/ (what `pipe migrate` writes before its commit point: upgrade_downgrade.py).
        moved = _timeline_moved(storage) and "timeline"
        if version in READABLE_1X and layout == 2:  # Hudi 1.x: its tables' snapshots are read
            folder = (props.get("hoodie.timeline.path") or "timeline").strip()
            if folder != "timeline":
                return (f"its timeline is in .hoodie/{folder}/ (hoodie.timeline.path), not Hudi's default .hoodie/timeline/, "
                        "which is where pipe reads a Hudi 1.x table's instants")
        elif version > TABLE_VERSION or layout != TIMELINE_LAYOUT or moved:
            how = f"table version {version}" + (f" (hoodie.table.version={version}, upgraded by Hudi 1.x)" if version >= 8 else "")
            how += f" with timeline layout {layout}" if layout != TIMELINE_LAYOUT else ""
            how += f", its timeline in .hoodie/{moved}/ (Hudi 1.x's place)" if moved else ""
            return (f"it is Hudi {how}; pipe reads and writes version 6 with timeline layout 1 (Hudi 0.14/0.15), and "
                    "versions 8 and 9 with layout 2 (Hudi 1.x). "
                    "Downgrade it with Hudi 1.x (hudi-cli `downgrade table --toVersion SIX`, or Spark SQL "
                    "`CALL downgrade_table(table => '...', to_version => 'SIX')`), and keep Hudi 1.x writers on it at "
                    "hoodie.write.table.version=6 with hoodie.write.auto.upgrade=false")
        if version not in READABLE_VERSIONS and version not in READABLE_1X:
            return (f"it is Hudi table version {version} (Hudi 0.10 or older); pipe reads versions 4 to 6: "
                    "upgrade it by writing to it once with Hudi 0.14 or 0.15")
        if props.get("hoodie.bootstrap.base.path"):
            return (f"it is a metadata-only bootstrap of {props['hoodie.bootstrap.base.path']} (hoodie.bootstrap.base.path): "
                    "its base files hold only keys, the data stays in the source files, which pipe does not join")
        fmt = (props.get("hoodie.table.base.file.format") or props.get("hoodie.table.ro.file.format") or "PARQUET").upper()
        if fmt != "PARQUET":
            return f"its base files are {fmt} (hoodie.table.base.file.format); pipe reads and writes Parquet only"
        if props.get("hoodie.datasource.write.drop.partition.columns", "false").lower() == "true":
            return ("its files leave out the partition columns (hoodie.datasource.write.drop.partition.columns=true), "
                    "which pipe would read as missing")
        if [f for f in storage.list_files(".hoodie/.schema", recursive=True) if not f.path.endswith("/.keep")]:
            return ("it uses Hudi's schema-on-read evolution (.hoodie/.schema/): columns renamed or dropped that way "
                    "match by id, not by name, which pipe does not do")
        return None

    def unchangeable_reason(self, storage=None) -> str | None:
        """Why pipe must change no file of this table, neither by a write nor by a service
        (compact, clean, archive, savepoint, restore, rollback): a table version it only
        reads, or a Java feature whose files pipe would not keep in step. None otherwise. A
        metadata table is not a reason: it is retired first (Table.retire_metadata_table)."""
        if storage is not None:
            unreadable = self.unreadable_reason(storage)
            if unreadable:
                return unreadable
        props = self.properties or {}
        ordering = [f for f in (props.get("hoodie.table.ordering.fields") or "").split(",") if f.strip()]
        if self.table_version in READABLE_1X and len(ordering) > 1:
            return (f"it orders the versions of a key by several fields (hoodie.table.ordering.fields={','.join(ordering)}), "
                    "which pipe's writer does not compare")
        if self.table_version != TABLE_VERSION and self.table_version not in READABLE_1X:
            return (f"it is Hudi table version {self.table_version}, which pipe reads but does not write (it writes version 6): "
                    "upgrade it by writing to it once with Hudi 0.14 or 0.15")
        if props.get("hoodie.table.cdc.enabled", "false").lower() == "true":  # pipe writes its .cdc files (cdc_log.py)
            from runtime.table import cdc_log

            try:
                cdc_log.mode_of(props)
            except ValueError as exc:
                return f"it keeps a change data capture log in a mode pipe does not know: {exc}"
            if (props.get("hoodie.index.type") or "").upper() == "BUCKET":
                return ("it keeps a change data capture log (hoodie.table.cdc.enabled=true) and has a bucket index, whose "
                        "log-only file groups Java's CDC reader of version 6 cannot follow; pipe writes one or the other")
        index = (props.get("hoodie.index.type") or "").upper()
        engine = (props.get("hoodie.index.bucket.engine") or ("CONSISTENT_HASHING" if index != "BUCKET" else "SIMPLE")).upper()
        consistent = storage is not None and storage.list_files(".hoodie/.bucket_index", recursive=True)
        if storage is not None and storage.list_files(".hoodie/.hashing_meta", recursive=True):
            return ("it has Hudi 1.1's partition-level bucket index (.hoodie/.hashing_meta/): each partition's number of buckets "
                    "comes from Java regular expressions over its path (hoodie.bucket.index.partition.expressions), changed by "
                    "bucket-rescale replace commits, which pipe does not evaluate or keep; write it with Java Hudi, or rebuild it "
                    "with pipe with a fixed number of buckets (`index: bucket`, `buckets:`)")
        if (index == "BUCKET" and self.buckets is None) or consistent:
            return (f"it uses a bucket index (hoodie.index.type=BUCKET, hoodie.index.bucket.engine={engine}), whose file groups "
                    "are buckets pipe assigns only with the SIMPLE engine and a known number of buckets"
                    + ("" if consistent or engine != "SIMPLE" else " (hoodie.bucket.index.num.buckets)"))
        hashed = [f for f in (props.get("hoodie.bucket.index.hash.field") or "").split(",") if f.strip()]
        if self.buckets is not None and hashed and hashed != list(self.record_key_fields):
            return (f"its bucket index hashes field(s) {','.join(hashed)} (hoodie.bucket.index.hash.field), not its record key "
                    f"{','.join(self.record_key_fields)}, which pipe's bucket index does not do")
        return None

    def unwritable_reason(self, storage=None) -> str | None:
        """Why pipe cannot write into this table (unchangeable_reason, or one Hudi made with
        a key generator, merge or meta-field setting pipe does not reproduce), or None."""
        reason = self.unchangeable_reason(storage)
        if reason:
            return reason
        keygen = self.key_generator.rsplit(".", 1)[-1]
        if keygen not in ("SimpleKeyGenerator", "ComplexKeyGenerator", "NonpartitionedKeyGenerator"):
            return f"its key generator {keygen} derives partition paths pipe does not compute"
        if not self.populate_meta_fields:
            return "it was written without meta fields (hoodie.populate.meta.fields=false), so stored keys cannot be looked up"
        if self.table_type not in (COPY_ON_WRITE, MERGE_ON_READ):
            return f"table type {self.table_type} is not one pipe knows"
        if self.table_type == MERGE_ON_READ:
            try:
                self.read_merge_mode()
            except TableError as exc:  # its log files would be merged in a way pipe cannot apply
                return str(exc)
        return None

    def without_metadata_table(self) -> "TableConfig":
        props = {k: v for k, v in (self.properties or {}).items() if k not in _METADATA_PARTITIONS}
        return replace(self, metadata_partitions="", properties=props)


def _timeline_moved(storage) -> bool:
    """Instants completed in .hoodie/timeline/ that .hoodie/ does not hold completed too."""
    from runtime.table.timeline import HOODIE, TIMELINE_V2, parse_instant_file, parse_instant_file_v2

    def completed(folder, parse) -> set[tuple[str, str]]:
        found = (parse(f.path.rsplit("/", 1)[-1]) for f in storage.list_files(folder, recursive=False))
        return {(i.time, i.action) for i in found if i is not None and i.is_completed}

    copies = completed(TIMELINE_V2, parse_instant_file_v2)
    return bool(copies - completed(HOODIE, parse_instant_file)) if copies else False


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return -1


# --- the file format: java.util.Properties ---------------------------------------------------

def _escape(text: str, is_key: bool) -> str:
    """java.util.Properties.saveConvert: what store() writes for a key or a value (ISO-8859-1
    output: every character outside printable ASCII as \\uXXXX)."""
    out = []
    for i, ch in enumerate(text):
        code = ord(ch)
        if ch == " ":
            out.append("\\ " if (i == 0 or is_key) else " ")
        elif ch in "\\=:#!":
            out.append("\\" + ch)
        elif ch in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[ch])
        elif code < 0x20 or code > 0x7E:
            out.extend(f"\\u{unit:04X}" for unit in _utf16(ch))
        else:
            out.append(ch)
    return "".join(out)


def _utf16(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def store_properties(props: Mapping[str, str], comment: str, now: dt.datetime | None = None) -> str:
    """The text java.util.Properties.store writes (as HoodieTableConfig does): a comment line,
    a date line, then `key=value` lines escaped by _escape. Encode it as ISO-8859-1 (it is
    ASCII)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    lines = ["#" + comment, "#" + now.strftime("%a %b %d %H:%M:%S UTC %Y")]
    lines += [f"{_escape(k, True)}={_escape(v, False)}" for k, v in sorted(props.items())]
    return "\n".join(lines) + "\n"


def parse_properties(text: str) -> dict[str, str]:
    """java.util.Properties.load: `key=value`, `key:value` or `key value` lines, `#` and `!`
    comments, lines continued by a trailing backslash, and every escape (\\uXXXX, \\t, \\n, \\r,
    \\f, and a backslash before any other character stands for that character). A write
    reads the file about ten times: the same text is parsed once (a copy each time)."""
    return dict(_parsed_properties(text))


@functools.lru_cache(maxsize=64)
def _parsed_properties(text: str) -> tuple[tuple[str, str], ...]:
    props: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):  # an odd number of trailing backslashes
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(line):
            line = line[:-1]
        key_end, j = len(line), 0
        while j < len(line):
            ch = line[j]
            if ch == "\\":
                j += 2
                continue
            if ch in "=: \t\f":
                key_end = j
                break
            j += 1
        rest = line[key_end:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(line[:key_end])] = _unescape(rest)
    return tuple(props.items())


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, j = [], 0
    while j < len(text):
        ch = text[j]
        if ch != "\\" or j + 1 >= len(text):
            out.append(ch)
            j += 1
            continue
        nxt = text[j + 1]
        if nxt == "u" and j + 6 <= len(text):
            try:
                out.append(chr(int(text[j + 2:j + 6], 16)))
                j += 6
                continue
            except ValueError:
                raise TableError(f"hoodie.properties has a malformed \\u escape: {text[j:j + 6]!r}") from None
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
        j += 2
    # \\uD83D\\uDE00 pairs: Java strings are UTF-16
    return "".join(out).encode("utf-16-be", "surrogatepass").decode("utf-16-be")


def decode_properties(data: bytes) -> str:
    """hoodie.properties bytes as text. Java reads ISO-8859-1 (and writes only ASCII, with
    \\u escapes); pipe before 2026-11 wrote raw UTF-8, which is read as such."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("iso-8859-1")


_KEYGEN_TYPES = {t: _KEYGEN + c for t, c in (
    ("SIMPLE", "SimpleKeyGenerator"), ("COMPLEX", "ComplexKeyGenerator"), ("NON_PARTITION", "NonpartitionedKeyGenerator"),
    ("TIMESTAMP", "TimestampBasedKeyGenerator"), ("CUSTOM", "CustomKeyGenerator"))}


def _simple_buckets(props: Mapping[str, str]) -> int | None:
    """The number of buckets a table declares for Hudi's simple bucket index, or None."""
    if (props.get("hoodie.index.type") or "").upper() != "BUCKET" or (props.get("hoodie.index.bucket.engine") or "SIMPLE").upper() != "SIMPLE":
        return None
    n = _int(props.get("hoodie.bucket.index.num.buckets"), 0)
    return n if n > 0 else None


def _one_field(text: str | None) -> str | None:
    fields = [f.strip() for f in (text or "").split(",") if f.strip()]
    return fields[0] if len(fields) == 1 else None


def read_properties(storage) -> dict[str, str]:
    """hoodie.properties as Hudi's readers load it (HoodieTableConfig.fetchConfigs): the file,
    or, while an update is under way or after a crash in it, its backup."""
    for path in (PROPERTIES, PROPERTIES_BACKUP):
        try:
            return parse_properties(decode_properties(storage.read_bytes(path)))
        except FileNotFoundError:
            continue
    raise FileNotFoundError(PROPERTIES)


def update_properties(storage, set_props: Mapping[str, str] = {}, remove: tuple[str, ...] = ()) -> dict[str, str]:
    """Changes hoodie.properties as HoodieTableConfig.update/delete do, so that a crash at any
    point leaves a file Java and pipe read (read_properties): recover from an earlier crash
    (no file: the backup becomes it; the backup is dropped), back the file up, delete it,
    write the new one, check it, drop the backup. The caller holds the writer lock."""
    recover_properties(storage)
    props = read_properties(storage)
    comment = "Updated at " + dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if not storage.create_exclusive(PROPERTIES_BACKUP, store_properties(props, comment).encode("iso-8859-1")):
        raise TableError("hoodie.properties.backup appeared during an update of hoodie.properties: another writer is active")
    storage.delete(PROPERTIES)
    _fault("properties_after_backup")  # readers now read the backup
    props = {k: v for k, v in {**props, **set_props}.items() if k not in remove}
    storage.write_atomic(PROPERTIES, store_properties(props, comment).encode("iso-8859-1"))
    if read_properties(storage).get("hoodie.table.checksum") != props.get("hoodie.table.checksum"):
        storage.delete(PROPERTIES)  # readers keep using the backup; the next update recovers
        raise TableError("hoodie.properties did not read back as written; the table is as it was (its backup)")
    storage.delete(PROPERTIES_BACKUP)
    return props


def _fault(point: str) -> None:
    from runtime.table.services import fault

    fault(point)


def recover_properties(storage) -> None:
    """HoodieTableConfig.recoverIfNeeded: after a crash during an update, the backup (the file
    as it was) becomes hoodie.properties again."""
    if not storage.exists(PROPERTIES_BACKUP):
        return
    if not storage.exists(PROPERTIES):
        storage.create_exclusive(PROPERTIES, storage.read_bytes(PROPERTIES_BACKUP))
    storage.delete(PROPERTIES_BACKUP)
