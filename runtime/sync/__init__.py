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

Hudi 1.x's tables (timeline layout 2), where a commit that started earlier may complete later,
are synced as Hudi 1.x's sync tools do: `last_commit_completion_time_sync` holds the latest
completion time synced, and the writes that completed after it are the ones looked at (every
partition is listed when the catalog lacks it, or its `last_commit_time_sync` has left the
active timeline).

The catalogs themselves (runtime/sync/hive.py, runtime/sync/glue.py) only store and fetch
what this module decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol

from runtime.errors import RunError
from runtime.table.schema import META_COLUMNS

LAST_SYNC = "last_commit_time_sync"
LAST_COMPLETION_SYNC = "last_commit_completion_time_sync"  # Hudi 1.x, timeline layout 2
PARQUET_INPUT = "org.apache.hudi.hadoop.HoodieParquetInputFormat"
REALTIME_INPUT = "org.apache.hudi.hadoop.realtime.HoodieParquetRealtimeInputFormat"
PARQUET_OUTPUT = "org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat"
PARQUET_SERDE = "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"
_SCHEMA_PART = 4000  # characters per spark.sql.sources.schema.part.N, as Spark and Hudi split it
# partition keys keep these column types (their folders' text reads as the type); others are strings
_TYPED_KEYS = ("string", "int", "bigint", "smallint", "tinyint", "date", "boolean")


class SyncError(RunError):
    """A catalog refused or could not be reached; the commit stands. `unreachable`: the catalog
    did not answer at all, so the run's other tables do not wait for it again."""

    def __init__(self, message: str, hint: str | None = None, unreachable: bool = False):
        super().__init__(message, hint)
        self.unreachable = unreachable


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
    """What a catalog holds of a table: its columns, partition keys and parameters."""

    columns: tuple[tuple[str, str], ...]
    partition_keys: tuple[tuple[str, str], ...]
    params: Mapping[str, str]


class Catalog(Protocol):
    """The operations a sync needs of a catalog (runtime/sync/hive.py, runtime/sync/glue.py)."""

    def ensure_database(self, database: str) -> None: ...
    def get_table(self, database: str, name: str) -> Stored | None: ...
    def create_table(self, definition: Definition) -> None: ...
    def update_table(self, definition: Definition) -> None: ...  # columns, formats, location; parameters merged
    def drop_table(self, database: str, name: str) -> None: ...  # the entry only: an external table's data stays
    # values -> location of the partitions among `values` that the table has (None: all of them)
    def existing_partitions(self, definition: Definition, values: list[tuple[str, ...]] | None) -> dict[tuple[str, ...], str | None]: ...
    def add_partitions(self, definition: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None: ...
    def move_partitions(self, definition: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None: ...
    def drop_partitions(self, definition: Definition, values: list[tuple[str, ...]]) -> None: ...
    def close(self) -> None: ...


@dataclass
class SyncOutcome:
    names: list[str]
    instant: str | None = None  # the latest completed write instant, now the catalog's last_commit_time_sync
    completion: str | None = None  # timeline layout 2: the latest completion time, its last_commit_completion_time_sync
    created: list[str] = field(default_factory=list)
    columns_changed: list[str] = field(default_factory=list)  # the tables whose columns were updated
    added: int = 0  # partitions of the Hudi table (a merge-on-read table's _ro and _rt count once)
    dropped: int = 0
    full: bool = False  # every partition was listed (a table new to the catalog, or archived instants)
    up_to_date: bool = False  # nothing to do: the catalog had synced this instant

    def to_dict(self) -> dict[str, Any]:
        return {"names": self.names, "instant": self.instant, "completion": self.completion, "created": self.created, "columns_changed": self.columns_changed,
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


def partition_values(partition: str, fields: Iterable[str], hive_style: bool = True) -> tuple[str, ...]:
    """A partition folder's values, the text as it is in the path, as Hudi's extractors read
    them: one per `/`-separated level, `field=` left out (hive style); a single field without
    hive style is the whole path (SinglePartPartitionValueExtractor: `2024/01/01` is one value)."""
    fields = tuple(fields)
    if not partition:
        return ()
    if len(fields) == 1 and not hive_style:
        return (partition,)
    levels = partition.split("/")
    if len(levels) != len(fields):
        raise SyncError(f"partition folder {partition!r} has {len(levels)} level(s), the table has {len(fields)} partition field(s)",
                        "a folder the table's partition_by does not describe; see the table's partition paths with `pipe show`")
    return tuple(level[len(f) + 1:] if hive_style and level.startswith(f + "=") else level for level, f in zip(levels, fields))


def sync_table(catalog: Catalog, specs: list[Definition], table, timeline, force_full: bool = False) -> SyncOutcome:
    """Brings the catalog tables `specs` (one Hudi table's) up to its latest completed write
    on `timeline` (the table's, as loaded)."""
    from runtime.table.cdc import touched_file_groups
    from runtime.table.layout import FileSystemView
    from runtime.table.timeline import WRITE_ACTIONS

    writes = timeline.completed(WRITE_ACTIONS)
    latest = writes[-1].time if writes else None
    by_completion = table.config.timeline_layout >= 2
    # Hudi 1.x's tables: a commit that started earlier may complete later, so what was synced
    # is told by completion time (a later completion with an earlier instant time is new)
    completion = max((w.completed_at for w in writes), default=None) if by_completion else None
    outcome = SyncOutcome(names=[d.full_name for d in specs], instant=latest, completion=completion)
    for database in sorted({d.database for d in specs}):
        catalog.ensure_database(database)
    stored = {d.name: catalog.get_table(d.database, d.name) for d in specs}
    for d in specs:  # partition keys cannot change in place (a rebuilt table): registered anew
        have = stored[d.name]
        if have is not None and [k.lower() for k, _ in have.partition_keys] != [k for k, _ in d.partition_keys]:
            catalog.drop_table(d.database, d.name)
            stored[d.name] = None
    synced = [None if s is None else s.params.get(LAST_SYNC) for s in stored.values()]
    synced_completion = [None if s is None else s.params.get(LAST_COMPLETION_SYNC) for s in stored.values()]
    marks, current = (synced_completion, completion) if by_completion else (synced, latest)
    if not force_full and None not in marks and all(t == current for t in marks) \
            and all(_same_columns(stored[d.name].columns, d.columns) for d in specs):
        outcome.up_to_date = True
        return outcome

    # which partitions to look at: those the writes since the oldest synced instant (completion
    # time on layout 2) wrote or replaced, or all of them when that instant is unknown (a table
    # new to the catalog, a sync that stopped before its markers), archived, or rolled back or
    # restored away
    groups = None
    active = {w.time for w in writes}
    if not force_full and None not in synced and all(t in active for t in synced):
        if not by_completion:
            groups = touched_file_groups(timeline, min(synced), None)  # None: some of those writes were archived
        elif None not in synced_completion:
            groups = touched_file_groups(timeline, None, None, timeline.completed_after(min(synced_completion)))
    full = groups is None
    fields = list(table.config.partition_fields)
    if full:
        touched = {s.partition for s in FileSystemView.load(table.storage, timeline).latest_slices()}
        live = set(touched)
    else:
        touched = {p for p, _ in groups if p is not None}
        live = {s.partition for s in FileSystemView.load(table.storage, timeline, partitions=sorted(touched)).latest_slices()} if touched else set()
    outcome.full = full
    # partition values -> location (the same for each catalog table of the Hudi table)
    wanted = {partition_values(p, fields, table.config.hive_style): specs[0].partition_location(p) for p in touched if p in live} if fields else {}
    gone = {partition_values(p, fields, table.config.hive_style) for p in touched if p not in live and p} if fields else set()

    added, dropped = set(), set()
    for d in specs:
        have = stored[d.name]
        if have is None:
            catalog.create_table(_with_sync(d, None))
            outcome.created.append(d.full_name)
        elif not _same_columns(have.columns, d.columns):
            outcome.columns_changed.append(d.full_name)  # the columns are set with the marker, below
        if not fields:
            continue
        present = catalog.existing_partitions(d, None if full and have is not None else sorted(set(wanted) | gone)) \
            if (wanted or gone or (full and have is not None)) else {}
        to_add = [(v, loc) for v, loc in sorted(wanted.items()) if v not in present]
        # a partition registered at another place (the table was rebuilt elsewhere) moves
        to_move = [(v, loc) for v, loc in sorted(wanted.items()) if v in present and _other_place(present[v], loc)]
        to_drop = sorted(v for v in present if v in gone or (full and v not in wanted))
        if to_add:
            catalog.add_partitions(d, to_add)
        if to_move:
            catalog.move_partitions(d, to_move)
        if to_drop:
            catalog.drop_partitions(d, to_drop)
        added |= {v for v, _ in to_add}
        dropped |= set(to_drop)
    outcome.added, outcome.dropped = len(added), len(dropped)  # per Hudi table, not per catalog table
    for d in specs:  # the markers last: a sync that stopped before them is redone from the same instant
        catalog.update_table(_with_sync(d, latest, completion))
    return outcome


def _other_place(stored: str | None, wanted: str) -> bool:
    """Whether a catalog's partition location is not `wanted` (schemes aside: s3/s3a, file:/ and file:///)."""
    def norm(loc: str) -> str:
        loc = loc.rstrip("/")
        for scheme in ("s3a://", "s3n://", "s3://", "file:///", "file://", "file:/"):
            if loc.startswith(scheme):
                return ("s3://" if scheme.startswith("s3") else "/") + loc[len(scheme):].lstrip("/")
        return loc
    return stored is not None and norm(stored) != norm(wanted)


def _with_sync(d: Definition, instant: str | None, completion: str | None = None) -> Definition:
    params = dict(d.params)
    if instant is not None:
        params[LAST_SYNC] = instant
    if completion is not None:
        params[LAST_COMPLETION_SYNC] = completion
    return Definition(**{**d.__dict__, "params": params})


def _same_columns(a: Iterable[tuple[str, str]], b: Iterable[tuple[str, str]]) -> bool:
    norm = lambda cols: [(n.lower(), t.replace(" ", "").lower()) for n, t in cols]  # noqa: E731
    return norm(a) == norm(b)

