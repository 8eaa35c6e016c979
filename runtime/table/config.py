"""hoodie.properties: what a table is (name, type, keys, partitioning, merge mode), written once
at creation with every key Hudi readers expect (HUDI_FORMAT.md section 1.1)."""

from __future__ import annotations

import datetime as dt
import zlib
from dataclasses import dataclass

from runtime.table.errors import TableError

PROPERTIES = ".hoodie/hoodie.properties"
DATABASE = "default"

COPY_ON_WRITE, MERGE_ON_READ = "COPY_ON_WRITE", "MERGE_ON_READ"
_KEYGEN = "org.apache.hudi.keygen."
# Event-time ordering: the largest precombine value wins, also against the stored row.
_EVENT_TIME_PAYLOAD = "org.apache.hudi.common.model.DefaultHoodieRecordPayload"
_COMMIT_TIME_PAYLOAD = "org.apache.hudi.common.model.OverwriteWithLatestAvroPayload"
# Merge modes of a merge-on-read read (read_merge_mode).
COMMIT_TIME, EVENT_TIME, APPEND_ONLY = "COMMIT_TIME_ORDERING", "EVENT_TIME_ORDERING", "APPEND_ONLY"
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
        if self.complex_single_key:  # Java's current default text, declared for Java's validation
            props["hoodie.table.complex.keygen.encoding"] = self.complex_key_encoding or "FIELD_PREFIXED"
        lines = ["#Properties saved on " + now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"]
        # values are written raw: hudi-rs does not unescape, and Java accepts them unescaped
        lines += [f"{k}={v}" for k, v in sorted(props.items())]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_properties(cls, text: str) -> "TableConfig":
        props = parse_properties(text)
        split = lambda v: tuple(x for x in (v or "").split(",") if x)  # noqa: E731
        keygen = props.get("hoodie.table.keygenerator.class", "")
        partitions = () if keygen.endswith("NonpartitionedKeyGenerator") else split(props.get("hoodie.table.partition.fields"))
        return cls(
            name=props["hoodie.table.name"],
            table_type={"cow": COPY_ON_WRITE, "mor": MERGE_ON_READ}.get(props["hoodie.table.type"].lower(), props["hoodie.table.type"].upper()),
            record_key_fields=split(props.get("hoodie.table.recordkey.fields")),
            partition_fields=partitions,
            precombine_field=props.get("hoodie.table.precombine.field") or None,
            hive_style=props.get("hoodie.datasource.write.hive_style_partitioning", "false") == "true",
            url_encode=props.get("hoodie.datasource.write.partitionpath.urlencode", "false") == "true",
            key_generator_class=keygen or None,
            populate_meta_fields=props.get("hoodie.populate.meta.fields", "true") == "true",
            metadata_partitions=props.get("hoodie.table.metadata.partitions", ""),
            payload_class=props.get("hoodie.compaction.payload.class") or None,
            record_merge_mode=props.get("hoodie.record.merge.mode") or None,
            complex_key_encoding=(props.get("hoodie.table.complex.keygen.encoding") or "").strip().upper() or None,
        )

    def unwritable_reason(self) -> str | None:
        """Why pipe cannot write into this table (one Hudi made with features pipe does not
        reproduce), or None."""
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
        if self.metadata_partitions:
            return ("it has a metadata table (hoodie.table.metadata.partitions), which Java readers trust and pipe "
                    "does not maintain; disable it in Hudi first (hoodie.metadata.enable=false)")
        return None


def parse_properties(text: str) -> dict[str, str]:
    """Java properties as Hudi writes them: `key=value` lines, `#` comments, `\\:` for `:`."""
    props = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip().replace("\\:", ":").replace("\\=", "=")
    return props
