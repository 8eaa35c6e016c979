"""Meta sync: a Hudi table registered in a catalog after its commits, as Hudi's sync tools do
(HiveSyncTool in HMS mode, AwsGlueCatalogSyncTool), so that Spark SQL, Trino, Athena and the
people behind them find it by name.

What a table looks like in the catalog (`definitions`): an EXTERNAL_TABLE at the table's base
path, Parquet's serde and output format, Hudi's input format (copy-on-write and a merge-on-read
table's read-optimized `_ro` table: HoodieParquetInputFormat; the real-time `_rt` table:
HoodieParquetRealtimeInputFormat), Hudi's meta columns then the data columns, the partition
columns as partition keys, and Spark's data-source properties (`spark.sql.sources.provider=hudi`
and the schema), with which a Spark session that has Hudi's bundle reads it as a Hudi table.

How a sync proceeds (`sync_table`), after each commit or by `pipe sync`:
- the database and the table are created when missing; a table whose columns differ gets the
  table's current columns (new columns appear; CASCADE on a Hive metastore);
- partitions: only those the completed writes after the catalog's `last_commit_time_sync`
  wrote or replaced are looked at. One with live file groups is added if the catalog lacks it;
  one left without any (delete_partition, insert_overwrite) is dropped. A table new to the
  catalog, or one whose last synced instant has left the active timeline (archived), has every
  partition listed once instead;
- `last_commit_time_sync` is set to the latest completed write instant, last: a sync that
  failed half-way is redone from the same instant by the next one.

The catalogs themselves (runtime/sync/hive.py, runtime/sync/glue.py) only store and fetch
what this module decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol

from runtime.steps.errors import RunError

LAST_SYNC = "last_commit_time_sync"
PARQUET_INPUT = "org.apache.hudi.hadoop.HoodieParquetInputFormat"
REALTIME_INPUT = "org.apache.hudi.hadoop.realtime.HoodieParquetRealtimeInputFormat"
PARQUET_OUTPUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat"
PARQUET_SERDE = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
META_COLUMNS = ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path", "_hoodie_file_name")
_SCHEMA_PART = 4000  # characters per spark.sql.sources.schema.part.N, as Spark and Hudi split it
# partition keys keep their column's type when a partition folder's text parses as it
_TYPED_KEYS = ("string", "int", "bigint", "smallint", "tinyint", "date", "boolean")


class SyncError(RunError):
    """A catalog refused or could not be reached; the commit stands."""


@dataclass(frozen=True)
class Definition:
    """One catalog table: what Hudi's sync would create for it."""

    database: str
    name: str
    location: str
    columns: tuple[tuple[str, str], ...]  # (name, Hive type) of the data columns
    partition_keys: tuple[tuple[str, str], ...]
    input_format: str
    params: Mapping[str, str]
    serde_params: Mapping[str, str]
    output_format: str = PARQUET_OUTPUT
    serde: str = PARQUET_SERDE

    @property
    def full_name(self) -> str:
        return f"{self.database}.{self.name}"

    def partition_location(self, partition: str) -> str:
        return f"{self.location}/{partition}" if partition else self.location


@dataclass(frozen=True)
class Stored:
    """What a catalog holds of a table: its columns and parameters."""

    columns: tuple[tuple[str, str], ...]
    params: Mapping[str, str]


class Catalog(Protocol):
    """The operations a sync needs of a catalog (runtime/sync/hive.py, runtime/sync/glue.py)."""

    kind: str

    def ensure_database(self, database: str) -> bool: ...  # True if created
    def get_table(self, database: str, name: str) -> Stored | None: ...
    def create_table(self, definition: Definition) -> None: ...
    def update_table(self, definition: Definition) -> None: ...  # columns and parameters
    def existing_partitions(self, definition: Definition, values: list[tuple[str, ...]]) -> set[tuple[str, ...]]: ...
    def add_partitions(self, definition: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None: ...
    def drop_partitions(self, definition: Definition, values: list[tuple[str, ...]]) -> None: ...


@dataclass
class SyncOutcome:
    names: list[str]
    instant: str | None = None  # the latest completed write instant, now the catalog's last_commit_time_sync
    created: list[str] = field(default_factory=list)
    columns_changed: list[str] = field(default_factory=list)  # the tables whose columns were updated
    added: int = 0  # partitions, per catalog table
    dropped: int = 0
    full: bool = False  # every partition was listed (a table new to the catalog, or archived instants)
    up_to_date: bool = False  # nothing to do: the catalog had synced this instant

    def to_dict(self) -> dict[str, Any]:
        return {"names": self.names, "instant": self.instant, "created": self.created, "columns_changed": self.columns_changed,
                "partitions_added": self.added, "partitions_dropped": self.dropped, "full": self.full, "up_to_date": self.up_to_date}

    def summary(self) -> str:
        """A note for the step's line: empty when nothing changed."""
        if self.up_to_date:
            return ""
        what = []
        if self.created:
            what.append("registered " + ", ".join(self.created))
        else:
            what.append("synced " + ", ".join(self.names))
        if self.columns_changed:
            what.append("columns updated")
        if self.added:
            what.append(f"+{self.added} partition(s)")
        if self.dropped:
            what.append(f"-{self.dropped} partition(s)")
        return "; " + ", ".join(what)


def definitions(catalog: Mapping[str, Any], names: list[str], table, struct, location: str) -> list[Definition]:
    """The catalog tables of Hudi table `table` (its `names` as the plan gives them,
    `database.table`), with the columns of Spark schema `struct` (data columns, no meta columns)."""
    from runtime.table.config import MERGE_ON_READ

    parts = list(table.config.partition_fields)
    by_name = {f.name: f for f in struct.fields}
    columns = tuple((c, "string") for c in META_COLUMNS) + tuple(
        (f.name.lower(), hive_type(f.dataType)) for f in struct.fields if f.name not in parts)
    keys = tuple((p.lower(), _key_type(by_name.get(p))) for p in parts)
    spark_schema = _spark_schema_json(struct, parts)
    out = []
    for full in names:
        database, name = full.split(".", 1)
        realtime = table.config.table_type == MERGE_ON_READ and name.endswith("_rt")
        read_optimized = table.config.table_type == MERGE_ON_READ and not realtime
        params = {"EXTERNAL": "TRUE", "spark.sql.sources.provider": "hudi", **_split_schema(spark_schema)}
        if parts:
            params["spark.sql.sources.schema.numPartCols"] = str(len(parts))
            params.update({f"spark.sql.sources.schema.partCol.{i}": p for i, p in enumerate(parts)})
        if catalog.get("kind") == "glue":
            params["hudi.metadata-listing-enabled"] = "FALSE"
        out.append(Definition(
            database=database, name=name, location=location, columns=columns, partition_keys=keys,
            input_format=REALTIME_INPUT if realtime else PARQUET_INPUT, params=params,
            serde_params={"path": location, "hoodie.query.as.ro.table": "true" if read_optimized else "false", "serialization.format": "1"},
        ))
    return out


def hive_type(data_type) -> str:
    """The Hive type of a Spark type, as a catalog stores it (lower case, no spaces)."""
    from pyspark.sql import types as T

    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return "timestamp"
    if isinstance(data_type, T.ArrayType):
        return f"array<{hive_type(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"map<{hive_type(data_type.keyType)},{hive_type(data_type.valueType)}>"
    if isinstance(data_type, T.StructType):
        return "struct<" + ",".join(f"{f.name.lower()}:{hive_type(f.dataType)}" for f in data_type.fields) + ">"
    return data_type.simpleString().lower()


def _key_type(f) -> str:
    if f is None:
        return "string"
    t = hive_type(f.dataType)
    return t if t in _TYPED_KEYS else "string"


def _spark_schema_json(struct, parts: list[str]) -> str:
    """Spark's schema of the table as a data-source table: meta columns, data columns, then the
    partition columns (Spark's order for a partitioned data-source table)."""
    from pyspark.sql import types as T

    meta = [T.StructField(c, T.StringType(), True) for c in META_COLUMNS]
    data = [f for f in struct.fields if f.name not in parts]
    keys = [next((f for f in struct.fields if f.name == p), T.StructField(p, T.StringType(), True)) for p in parts]
    return T.StructType(meta + data + keys).json()


def _split_schema(text: str) -> dict[str, str]:
    chunks = [text[i:i + _SCHEMA_PART] for i in range(0, len(text), _SCHEMA_PART)] or [""]
    return {"spark.sql.sources.schema.numParts": str(len(chunks)), **{f"spark.sql.sources.schema.part.{i}": c for i, c in enumerate(chunks)}}


def partition_values(partition: str, fields: Iterable[str]) -> tuple[str, ...]:
    """A partition folder's values, as Hudi's MultiPartKeysValueExtractor reads them: one per
    `/`-separated segment, `k=v` giving `v`, the text as it is in the path."""
    if not partition:
        return ()
    values = tuple(seg.split("=", 1)[1] if "=" in seg else seg for seg in partition.split("/"))
    wanted = len(tuple(fields))
    if len(values) != wanted:
        raise SyncError(f"partition folder {partition!r} has {len(values)} level(s), the table has {wanted} partition field(s)")
    return values


def sync_table(catalog: Catalog, specs: list[Definition], table, force_full: bool = False) -> SyncOutcome:
    """Brings the catalog tables `specs` (one Hudi table's) up to its latest completed write."""
    from runtime.table.layout import FileSystemView
    from runtime.table.timeline import REPLACECOMMIT, WRITE_ACTIONS

    timeline = table.timeline()
    writes = timeline.completed(WRITE_ACTIONS)
    latest = writes[-1].time if writes else None
    outcome = SyncOutcome(names=[d.full_name for d in specs], instant=latest)
    created_db = False
    for d in {d.database for d in specs}:
        created_db = catalog.ensure_database(d) or created_db
    stored = {d.name: catalog.get_table(d.database, d.name) for d in specs}
    synced = [s.params.get(LAST_SYNC) for s in stored.values() if s is not None]
    if all(s is not None for s in stored.values()) and synced and all(t == latest for t in synced) and not force_full \
            and all(_same_columns(s.columns, d.columns) for d, s in ((d, stored[d.name]) for d in specs)):
        outcome.up_to_date = True
        return outcome

    # which partitions to look at: those the writes since the oldest synced instant touched,
    # or all of them when that instant is unknown or no longer on the active timeline
    since = min(synced) if synced and len(synced) == len(specs) else None
    full = force_full or since is None or timeline.find(since) is None  # archived, or rolled back since
    fields = list(table.config.partition_fields)
    if full:
        view = FileSystemView.load(table.storage, timeline)
        touched = {s.partition for s in view.latest_slices()}
        live = set(touched)
    else:
        touched = set()
        for inst in writes:
            if inst.time <= since:
                continue
            meta = timeline.commit_metadata(inst)
            touched |= {s.partition_path for s in meta.write_stats}
            if inst.action == REPLACECOMMIT and meta.replaced:
                touched |= set(meta.replaced)
        touched.discard(None)
        live = {s.partition for s in FileSystemView.load(table.storage, timeline, partitions=sorted(touched)).latest_slices()} if touched else set()
    outcome.full = full

    for d in specs:
        have = stored[d.name]
        if have is None:
            catalog.create_table(_with_sync(d, None))
            outcome.created.append(d.full_name)
        elif not _same_columns(have.columns, d.columns):
            catalog.update_table(_with_sync(d, have.params.get(LAST_SYNC)))
            outcome.columns_changed.append(d.full_name)
        if not fields:
            continue
        wanted = {partition_values(p, fields): p for p in touched if p in live}
        gone = [partition_values(p, fields) for p in touched if p not in live and p]
        present = catalog.existing_partitions(d, sorted(set(wanted) | set(gone))) if (wanted or gone) else set()
        to_add = [(v, d.partition_location(p)) for v, p in sorted(wanted.items()) if v not in present]
        to_drop = [v for v in sorted(set(gone)) if v in present]
        if full and have is not None:  # a full sync also drops what the catalog has beyond the table's partitions
            to_drop += [v for v in sorted(catalog.existing_partitions(d, None) - set(wanted)) if v not in to_drop]
        if to_add:
            catalog.add_partitions(d, to_add)
        if to_drop:
            catalog.drop_partitions(d, to_drop)
        outcome.added += len(to_add)
        outcome.dropped += len(to_drop)
    for d in specs:  # the marker last: a sync that failed before it is redone from the same instant
        catalog.update_table(_with_sync(d, latest))
    return outcome


def _with_sync(d: Definition, instant: str | None) -> Definition:
    params = dict(d.params)
    if instant is not None:
        params[LAST_SYNC] = instant
    return Definition(**{**d.__dict__, "params": params})


def _same_columns(a: Iterable[tuple[str, str]], b: Iterable[tuple[str, str]]) -> bool:
    norm = lambda cols: [(n.lower(), t.replace(" ", "").lower()) for n, t in cols]  # noqa: E731
    return norm(a) == norm(b)

