"""`Table`: the API the runtime uses to create, write and read a Hudi table (version 6,
copy-on-write), and the protocol that keeps data safe around each write:

    lock -> roll back pending instants -> request -> inflight -> write files
         -> remove stray files -> check conflicts -> complete (atomic) -> unlock

A reader never sees a file before the completed instant that names it exists. Upserts,
inserts and deletes complete a `commit`; the replacing operations (insert_overwrite,
insert_overwrite_table, delete_partition) a `replacecommit`, whose partitionToReplaceFileIds
hides the replaced file groups from every later snapshot (their files stay for time travel
until cleaned)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from runtime.spark import api as spark_api
from runtime.storage import Storage, StorageSpec, open_storage
from runtime.table import avro as _avro
from runtime.table import bucket_index as _bucket_index
from runtime.table import cdc as _cdc
from runtime.table import keygen as _keygen
from runtime.table import heartbeat as _heartbeat
from runtime.table import markers as _markers
from runtime.table import metadata_table as _metadata_table
from runtime.table import reader as _reader
from runtime.table import services as _services
from runtime.table import upgrade_downgrade as _upgrade
from runtime.table import writer as _writer
from runtime.table.errors import LockTimeout, TableError
from runtime.table.files import parquet_footer
from runtime.table.config import (
    COPY_ON_WRITE, MERGE_ON_READ, METADATA_TABLE, PROPERTIES, PROPERTIES_BACKUP, TABLE_VERSION, TableConfig, read_properties, recover_properties,
    update_properties,
)
from runtime.table.layout import FileSystemView, bucket_index_file_ids
from runtime.table.partition_pruning import partition_filter
from runtime.table.schema import META_COLUMNS, arrow_schema, avro_schema_json, invalid_avro_names, spark_struct
from runtime.table.timeline import (
    CLEAN, COMMIT, COMPACTION, DELTACOMMIT, HOODIE, INFLIGHT, REPLACECOMMIT, RESERVED_EXTRA, REQUESTED, WRITE_ACTIONS, CommitMetadata, Instant,
    Timeline, WriteStat, instant_path,
)

LOCK_FILE = f"{HOODIE}/pipe.lock"
log = logging.getLogger("pipe.table")
# Empty folders Java writers create and expect (hudi-rs does not need them).
# Spark schemas of base files, by Parquet schema (or full path), for every table this process
# opens: a step reads a table through one Table and writes it through another, and the tables a
# run reads often share a schema. Asking Spark for one is a query (a round trip over Connect).
_FILE_SCHEMAS: dict[str, Any] = {}

_HOODIE_DIRS = ("archived", ".temp", ".aux/.bootstrap/.partitions", ".aux/.bootstrap/.fileids", ".schema")


@dataclass
class WriteResult:
    instant: str
    action: str
    operation: str
    inserts: int
    updates: int
    deletes: int
    files: int
    bytes: int
    replaced_file_groups: int = 0  # replacecommits: file groups hidden (their rows are not counted as deletes)
    service_error: str | None = None  # inline clean or archive failed after the commit (the commit stands)
    compaction: str | None = None  # merge-on-read: the instant of the inline compaction that followed
    retired: str | None = None  # what the write retired first (a Java writer's metadata table), for the user


class Table:
    def __init__(self, spark, storage: Storage, config: TableConfig):
        self.spark = spark
        self.storage = storage
        self.config = config
        self.retired: str | None = None  # set when a change retired the table's metadata table (see _changing)
        # the project asks for a metadata table (`metadata_table: true`): a change builds one if the table has none
        self.wants_metadata_table = config.metadata_table
        self.wants_record_index = config.record_index

    # --- creating and opening --------------------------------------------------------------

    @classmethod
    def exists(cls, uri: str, storage_options: tuple = ()) -> bool:
        storage = open_storage(StorageSpec(uri, storage_options))
        return storage.exists(PROPERTIES) or storage.exists(PROPERTIES_BACKUP)  # the backup: an update under way

    @classmethod
    def open(cls, spark, uri: str, storage_options: tuple = ()) -> "Table":
        """Opens the table for reading and writing; refuses one pipe cannot read (a table
        version, timeline layout or Java feature it does not know: config.unreadable_reason)."""
        storage = open_storage(StorageSpec(uri, storage_options))
        try:
            config = TableConfig.from_properties_map(read_properties(storage))
        except FileNotFoundError as exc:
            raise TableError(f"no Hudi table at {uri} ({PROPERTIES} is missing)") from exc
        reason = config.unreadable_reason(storage)
        if reason:
            raise TableError(f"pipe cannot read or write table {config.name} at {uri}: {reason}")
        return cls(spark, storage, config)

    @classmethod
    def create(cls, spark, uri: str, config: TableConfig, storage_options: tuple = ()) -> "Table":
        """Creates the table, or opens it when it exists with the same definition."""
        storage = open_storage(StorageSpec(uri, storage_options))
        if storage.exists(PROPERTIES) or storage.exists(PROPERTIES_BACKUP):
            table = cls.open(spark, uri, storage_options)
            table._refuse_other_version()  # a table pipe does not write (version 4 or 5) is never compared, so never rebuilt
            table._check_same_definition(config)
            table.wants_metadata_table = config.metadata_table
            table.wants_record_index = config.record_index
            return table
        if config.table_type not in (COPY_ON_WRITE, MERGE_ON_READ):
            raise TableError(f"table type {config.table_type} is not one pipe knows; use copy_on_write or merge_on_read")
        for d in _HOODIE_DIRS + (("timeline", "timeline/history") if config.create_version >= 8 else ()):
            storage.write_atomic(f"{HOODIE}/{d}/.keep", b"") if not hasattr(storage, "root") else os.makedirs(storage.full_path(f"{HOODIE}/{d}"), exist_ok=True)
        text = config.to_properties()
        if not storage.create_exclusive(PROPERTIES, text.encode("iso-8859-1")):
            table = cls.open(spark, uri, storage_options)  # created meanwhile by someone else
            table._check_same_definition(config)
            table.wants_metadata_table = config.metadata_table
            table.wants_record_index = config.record_index
            return table
        table = cls(spark, storage, TableConfig.from_properties(text))  # as a later open reads it
        table.wants_metadata_table = config.metadata_table
        table.wants_record_index = config.record_index
        return table

    def _refuse_other_version(self) -> None:
        """A table of a version pipe does not write (4 and 5; pipe writes 6, 8 and 9) is refused
        before pipe takes its lock or recovers its properties: no file of it is touched."""
        config = TableConfig.from_properties_map(read_properties(self.storage))
        if config.table_version != TABLE_VERSION:
            reason = config.unchangeable_reason(self.storage)
            if reason:
                raise TableError(f"pipe cannot change table {config.name} at {self.storage.spec.uri}: {reason}")

    def _check_same_definition(self, wanted: TableConfig) -> None:
        what = self.definition_changes(wanted)
        if what:
            raise TableError(f"table {self.config.name} at {self.storage.spec.uri} was created differently: {what}. "
                             "Rebuild it (pipe run --full-refresh) to change its layout")

    def definition_changes(self, wanted: TableConfig) -> str | None:
        """How `wanted` differs from the table's definition in what the stored table is built
        on (a write under `wanted` needs a table created anew), or None."""
        have = self.config
        diffs = [
            (what, a, b) for what, a, b in (
                ("record key", have.record_key_fields, wanted.record_key_fields),
                ("partition fields", have.partition_fields, wanted.partition_fields),
                ("table type", have.table_type, wanted.table_type),
                ("hive-style partitioning", have.hive_style, wanted.hive_style),
                ("precombine field", have.precombine_field, wanted.precombine_field),
            ) if a != b
        ]
        if wanted.cdc_mode is not None:  # declared: the table must keep that log (undeclared: it keeps what it has)
            from runtime.table import cdc_log

            try:
                have_mode = (cdc_log.mode_of(have.properties or {}) or "none").lower()
            except ValueError:  # a mode Hudi does not know: never the one declared
                have_mode = f"unknown ({(have.properties or {}).get(cdc_log.MODE)})"
            if have_mode != wanted.cdc_mode.lower():
                diffs.append(("change data capture log (cdc_logging)", have_mode, wanted.cdc_mode.lower()))
        if not diffs:
            return None
        return "; ".join(f"{w} is {list(a) if isinstance(a, tuple) else a} in the table but {list(b) if isinstance(b, tuple) else b} now"
                         for w, a, b in diffs)

    # --- state ---------------------------------------------------------------------------------

    def timeline(self) -> Timeline:
        return Timeline.load(self.storage, self.config.timeline_layout)

    def view(self, timeline: Timeline | None = None) -> FileSystemView:
        return FileSystemView.load(self.storage, timeline or self.timeline())

    def schema(self, timeline: Timeline | None = None, as_of: str | None = None, files_only: bool = False):
        """The table's data columns (Spark StructType) as written by its latest commit (at or
        before `as_of`) that wrote a file still on storage. (A delete_partition writes no file,
        and cleaning removes the files of replaced groups.) With no such file: the writer
        schema of the latest commit, for readers (Avro keeps no tinyint or smallint, so a
        writer, `files_only`, gets None and takes the input's columns)."""
        from pyspark.sql import types as T

        timeline = timeline or self.timeline()
        found = self._schema_file(timeline, as_of)
        if found is None:
            return None if files_only else self._committed_schema(timeline, as_of)
        path, size = found
        # files with one Parquet schema have one Spark schema: the footer, read here, says
        # whether Spark must read the file's schema again
        key = self.storage.full_path(path) if size is None else _schema_key(parquet_footer(self.storage, path, size))
        struct = _FILE_SCHEMAS.get(key)
        if struct is None:
            full = self.storage.full_path(path)
            # no footer read (size unknown): the path is the key, and Spark is asked each time
            struct = _FILE_SCHEMAS[key] = self.spark.read.parquet(full).schema if size is None else spark_api.parquet_schema(self.spark, full, key)
        return T.StructType([f for f in struct.fields if f.name not in META_COLUMNS])

    def arrow_schema(self, timeline: Timeline | None = None, as_of: str | None = None):
        """The same columns as `schema`, as an Arrow schema read from the same file's footer,
        without Spark (for reads in this process, `read_batches`); None when `schema` is."""
        timeline = timeline or self.timeline()
        found = self._schema_file(timeline, as_of)
        if found is None:  # no file yet: the writer schema of the commit metadata (no JVM needed)
            struct = self._committed_schema(timeline, as_of)
            return None if struct is None else _reader.arrow_data_schema(arrow_schema(struct))
        path, size = found
        if size is None and not hasattr(self.storage, "root"):  # a ranged read of the footer needs the size
            size = next(f.size for f in self.storage.list_files(path.rpartition("/")[0], recursive=False) if f.path == path)
        return _reader.arrow_data_schema(parquet_footer(self.storage, path, size).schema.to_arrow_schema())

    def _schema_file(self, timeline: Timeline, as_of: str | None) -> tuple[str, int | None] | None:
        """The base file whose schema is the table's as of `as_of` (path, size if known)."""
        path, size = None, None
        for inst in reversed(timeline.completed()):
            if as_of is not None and inst.time > as_of:
                continue
            meta = timeline.commit_metadata(inst)
            stat = next((s for s in meta.write_stats if s.path.endswith(".parquet") and self.storage.exists(s.path)), None)
            path, size = (stat.path, stat.file_size or None) if stat else (None, None)
            if path is None and inst.action == DELTACOMMIT:
                path = self._base_file_of_logs(timeline, inst)
            if path:
                return path, size
        # every commit with files was archived: the newest base file live as of `as_of` (a
        # later one may have another schema: an insert_overwrite_table may change types)
        slices = [s for s in FileSystemView.load(self.storage, timeline).latest_slices(as_of=as_of) if s.base_file is not None]
        if not slices:
            return None
        base = max(slices, key=lambda s: s.base_instant).base_file
        return base.path, base.size or None

    def writer_schema(self, timeline: Timeline | None = None):
        """The data columns (Spark StructType, no meta columns) of the latest commit's writer
        schema, read from the timeline alone: no Spark, no data file (what a catalog sync
        registers, as Hudi's sync reads the schema of the commit metadata)."""
        return self._committed_schema(timeline or self.timeline(), None)

    def _committed_schema(self, timeline: Timeline, as_of: str | None):
        """The writer schema in the latest commit's metadata (at or before `as_of`): the
        columns of a table whose commits wrote no file yet (a first run without input)."""
        for inst in reversed(timeline.completed()):
            if as_of is None or inst.time <= as_of:
                text = timeline.commit_metadata(inst).schema
                if text:
                    return spark_struct(text)
        return None

    def _base_file_of_logs(self, timeline: Timeline, inst: Instant) -> str | None:
        """For a deltacommit that wrote only log files: the base file of a slice it appended
        to (a log stat names it in `baseFile`), if still on storage."""
        for part, stats in (timeline.read_json(inst).get("partitionToWriteStats") or {}).items():
            for st in stats or ():
                if st.get("baseFile"):
                    path = f"{part}/{st['baseFile']}" if part else st["baseFile"]
                    if self.storage.exists(path):
                        return path
        return None

    def record_size_estimate(self, default: int, timeline: Timeline | None = None) -> int:
        """Bytes per record of the latest write's base files, less their footers' bloom filters
        (431 KB a file whatever its rows); a file no larger than its filter tells nothing."""
        from runtime.table.bloom import footer_bytes

        timeline = timeline or self.timeline()
        for inst in reversed(timeline.completed()):
            stats = [s for s in timeline.commit_metadata(inst).write_stats if not s.is_log]
            sized = [(s.num_writes, s.file_size - footer_bytes(s.num_writes)) for s in stats if s.num_writes > 0]
            rows = sum(n for n, size in sized if size > 0)
            size = sum(size for n, size in sized if size > 0)
            if rows > 0 and size > 0:
                return max(1, size // rows)
        return default

    def checkpoints(self) -> dict[str, str]:
        """The source checkpoints of the latest completed commit."""
        timeline = self.timeline()
        latest = timeline.latest_completed()
        return timeline.commit_metadata(latest).checkpoints() if latest else {}

    # --- writing -----------------------------------------------------------------------------

    def write(self, df, operation: str = "upsert", extra_metadata: dict[str, str] | None = None,
              clean_policy: str = _services.KEEP_LATEST_COMMITS, clean_retain: int = 10, clean_inline: bool = True,
              archive_min: int = 20, archive_max: int = 30, expect_latest: Any = ..., retain_from: str | None = None,
              compact_after: int | None = None, **options: Any) -> WriteResult:
        """Writes `df` with `operation` in one commit; then, by default, cleans file versions
        older than the latest `clean_retain` commits. `options` are WriteOptions fields.

        upsert, insert, bulk_insert and delete complete a `commit`. The replacing operations
        complete a `replacecommit` naming the file groups they replace; they do no index
        lookup and compare nothing with stored rows, and write the input to new file groups:
        - insert_overwrite: replaces the groups of the partitions the input has rows for;
        - insert_overwrite_table: replaces every group; the input's schema becomes the
          table's. A full refresh is `combine_before_insert=True` with this operation: the
          batch is deduplicated by key (precombine decides; a key whose winning row is a delete
          is dropped), then it replaces the whole table, in one replacecommit;
        - bootstrap: a bulk_insert (sorted by `bulk_insert_sort_mode`) that is the table's
          first commit, with operationType BOOTSTRAP; refused on a table with commits;
        - delete_partition: `df` is ignored (may be None); replaces the groups of the
          partitions matching `partitions_to_delete` (partition paths as stored, e.g.
          `region=EU`, with fnmatch wildcards: `dt=2024-*`; `*` on a non-partitioned table).
          A pattern matching no partition raises TableError listing the partitions, before
          anything is written.
        WriteResult.replaced_file_groups counts the replaced groups.

        `expect_latest`: the latest completed write instant (None: no write yet) the caller
        based this write on, e.g. when it read its source checkpoints. Under the lock, a table
        whose latest write differs is refused (TableError) before anything is written: another
        writer got there first, and writing would consume the same input twice.

        `retain_from`: the oldest instant an incremental consumer of this table has read up to;
        inline cleaning keeps what reads after it need, and archiving does not pass it.

        Merge-on-read tables complete a `deltacommit`: updates and deletes of a file group go
        to a new log file of its slice, new keys to base files. `compact_after`: compact
        inline, under the same lock, once this many deltacommits followed the last compaction."""
        bootstrap = operation == "bootstrap"  # a bulk_insert that makes the table's first commit
        if bootstrap:
            operation = "bulk_insert"
        if "partitions_to_delete" in options:
            options["partitions_to_delete"] = tuple(options["partitions_to_delete"] or ())
        opts = _writer.WriteOptions(operation=operation, extra_metadata=dict(extra_metadata or {}), **options)
        if operation not in _writer.OPERATION_TYPES:
            raise TableError(f"operation {operation} is not supported by this table engine yet")
        if opts.partitions_to_delete and operation != "delete_partition":
            raise TableError(f"partitions_to_delete applies to operation delete_partition, not to {operation}")
        self._check_writable()
        opts = self._with_buckets(opts, bootstrap)
        operation = opts.operation
        bad = invalid_avro_names(df.schema) if df is not None else []
        if bad:
            raise TableError(f"pipe cannot write into table {self.config.name}: column(s) {', '.join(repr(b) for b in bad)} "
                             "are not valid Avro names, so Hudi readers (Java, hudi-rs) could not read the table",
                             "names are letters, digits and _, not starting with a digit: rename them in the SELECT with `as`")
        reserved = sorted(set(opts.extra_metadata) & set(RESERVED_EXTRA))
        if reserved:
            raise TableError(f"extra metadata key(s) {', '.join(reserved)} are Hudi's own; choose other names")
        replacing = operation in _writer.REPLACE_OPERATIONS
        action = REPLACECOMMIT if replacing else DELTACOMMIT if self.config.table_type == MERGE_ON_READ else COMMIT
        with self._changing(refuse=lambda t: self._refuse_layout(t, opts.buckets), keep=_keeps_record_index(opts)) as (checked, slices):
            rolled_back = self.rollback_pending()
            timeline = self.timeline()
            if timeline.instants != checked.instants:  # a failed write rolled back, a service finished
                slices = FileSystemView.load(self.storage, timeline).latest_slices()
            if expect_latest is not ...:
                last = timeline.latest_data_write()  # a compaction or clean since is no conflict
                latest = last.time if last else None
                if latest != expect_latest:
                    now = f"{last.action} {latest} ({timeline.commit_metadata(last).operation_type or 'a write'})" if last else "no commit"
                    raise TableError(f"table {self.config.name} changed since this write read its input at "
                                     f"{expect_latest or 'no commit yet'}: its latest write is now {now}, by another writer (a run, "
                                     "a rollback or a restore); nothing was written, as the input could be taken twice or lost",
                                     "run again: the next run reads its input from where the table's latest commit left off "
                                     "(a compaction or clean meanwhile is no conflict)")
            if bootstrap and timeline.completed(WRITE_ACTIONS):
                raise TableError(f"bootstrap makes the first commit of a table; {self.config.name} has commits already",
                                 "rebuild it from the dataset with `pipe run --select TABLE --full-refresh`")
            if operation == "delete_partition":
                self._check_partitions_to_delete(opts.partitions_to_delete, slices)
            stored_struct = self.schema(timeline, files_only=True)
            # the text of record keys and partition paths the stored rows have (keygen.py)
            self.config = _keygen.settle(self.spark, self.storage, self.config, slices, stored_struct)
            instant = Instant(timeline.new_instant_time(), action, REQUESTED)
            self._start_heartbeat(instant.time)  # before the instant exists, as Java's writers start theirs
            # Hudi's requested replacecommit is an empty HoodieRequestedReplaceMetadata (Avro)
            self._transition(instant, REQUESTED, _avro.to_bytes(_avro.REQUESTED_REPLACE_METADATA, _avro.EMPTY_REPLACE_REQUEST) if replacing else b"")
            op_type = "BOOTSTRAP" if bootstrap else _writer.OPERATION_TYPES[operation]
            self._transition(instant, INFLIGHT, CommitMetadata(op_type, [], {}).to_bytes(timeline.layout))
            _services.fault("after_inflight")
            try:
                staged = _writer.write(self.spark, self, df, opts, instant.time, timeline, slices, stored_struct)
                _services.fault("after_files")
                self._remove_strays(instant.time, staged.stats, staged.log_prefixes)
                self._check_conflicts(slices, staged.stats, staged.replaced)
                if not timeline.completed(WRITE_ACTIONS) and not self.config.create_schema:
                    self._set_create_schema(staged.schema_json)
                extra = {"schema": staged.schema_json, **opts.extra_metadata}
                meta = CommitMetadata(op_type, staged.stats, extra, staged.replaced if replacing else None)
                if staged.stats and staged.index_changes is None and _metadata_table.keeps_record_index(read_properties(self.storage)):
                    raise TableError(f"pipe cannot keep the record index of {self.config.name} in step with this {operation}; "
                                     "nothing was written")
                self._check_lock()
                # the metadata table's deltacommit (and the record index's Spark jobs) complete
                # first; a failure there is rolled back with the data instant
                _metadata_table.before_complete(self.storage, instant.time, staged.stats,
                                                (self.spark, staged.index_changes) if staged.index_changes is not None else None)
            except BaseException:
                # nothing half-written: the failed instant is rolled back before we report
                self._stop_heartbeat(instant.time)
                self.rollback_pending()
                raise
            if timeline.complete(instant, meta.to_bytes(timeline.layout)) is None:
                raise TableError(f"instant {instant.time} was completed by someone else")
            # as Java's post-commit: the markers and the heartbeat of a completed instant go
            self._stop_heartbeat(instant.time)
            _markers.delete_dir(self.storage, instant.time)
            _services.fault("after_commit")
            service_error, compacted = None, None
            try:  # the commit stands whatever happens here; the next write cleans and archives again
                if compact_after and self.config.table_type == MERGE_ON_READ and self._deltacommits_since_compaction() >= compact_after:
                    compacted = self._compact()
                elif self.config.table_type == MERGE_ON_READ:  # a compaction pipe scheduled and a dead compactor left
                    compacted = self._finish_compactions(only_pipes=True)
                if rolled_back or self._took_over:  # a writer died: its temporary files go (one listing)
                    _services.remove_dead_temps(self.storage)
                if clean_inline:
                    _services.clean(self.storage, clean_policy, clean_retain, retain_from)
                _services.archive(self.storage, archive_min, archive_max, retain_from)
            except Exception as exc:  # noqa: BLE001 - reported on the result
                service_error = f"{type(exc).__name__}: {exc}"
        c = staged.counts
        replaced = sum(len(ids) for ids in (staged.replaced or {}).values())
        return WriteResult(instant.time, action, "bootstrap" if bootstrap else operation, c.inserts, c.updates, c.deletes, c.files, c.bytes, replaced, service_error,
                           compacted, self.retired)

    # --- before any change: what pipe cannot write, and a Java writer's metadata table ---------

    def _check_readable(self) -> None:
        """Table.open's check again, for a Table opened before another writer changed the
        table (Hudi 1.x upgrading it to version 8 would make it read as empty)."""
        self.config = TableConfig.from_properties_map(read_properties(self.storage))
        reason = self.config.unreadable_reason(self.storage)
        if reason:
            raise TableError(f"pipe cannot read or write table {self.config.name} at {self.storage.spec.uri}: {reason}")

    def _completion_window(self, timeline: Timeline, since: str | None, until: str | None, as_of: str | None):
        """An incremental read of a Hudi 1.x table (timeline layout 2): `since` and `until` are
        completion times, as in Java 1.x's incremental queries (reader.completion_window)."""
        if as_of is not None:
            raise TableError(f"table {self.config.name} is Hudi table version {self.config.table_version}: an incremental read "
                             "takes completion times (since, until), and no as_of", "drop as_of, or read as of an instant without since")
        try:
            return _reader.completion_window(self.storage, timeline, since, until)
        except TableError as exc:  # its archived timeline cannot be read
            raise TableError(f"table {self.config.name}: the commits completed after {since} cannot be read incrementally: {exc}",
                             "read its latest snapshot instead") from None

    def _changes_by_completion(self, timeline: Timeline, since: str | None, until: str | None):
        """read_changes of a Hudi 1.x table (timeline layout 2): `since` and `until` are
        completion times, as in its incremental reads. The before-images are the table as it
        stood when `since` completed, the after-images as it stood when `until` completed
        (Timeline.completed_by: a commit that completed later is in flight for either), of
        the file groups the writes that completed in between wrote or replaced (all groups
        when some of those were archived with their write stats)."""
        from pyspark.sql import types as T

        done = timeline.completed_after(None)
        until = until or (done[-1].completed_at if done else None)
        after_tl, instants = self._completion_window(timeline, since, until, None)
        struct = self.schema(after_tl) or T.StructType([])
        groups = None
        if instants is not None:
            active = [i for i in after_tl.completed() if i.time in instants]
            groups = _cdc.touched_file_groups(after_tl, None, None, active) if len(active) == len(instants) else None
        after = _reader.read(self.spark, self.storage, struct, after_tl, config=self.config, file_groups=groups)
        if since is None:
            return _cdc.all_inserts(after, [f.name for f in struct.fields])
        before_tl = timeline.completed_by(since)
        before = _reader.read(self.spark, self.storage, self.schema(before_tl), before_tl, config=self.config, file_groups=groups)
        return _cdc.changes(before, after, struct, until)

    def _check_not_cleaned(self, timeline: Timeline, as_of: str | None) -> None:
        """A time travel read of a version whose files the cleaner removed would return only
        the rows of its surviving file groups: refuse it, as Java's reader does ("Cleaner
        cleaned up the timestamp of interest")."""
        latest = timeline.latest_completed()
        if as_of is None or latest is None or as_of >= latest.time:
            return
        hint = ("read a later instant (`pipe timeline TABLE` lists them), or keep more versions with "
                "`clean: {policy: keep_latest_commits, retain: N}`")
        last_clean = timeline.latest_completed((CLEAN,))
        if last_clean is not None:  # Java's rule (TimelineUtils.validateTimestampAsOf)
            meta = _avro.from_bytes(self.storage.read_bytes(timeline.path(last_clean)))
            earliest = meta.get("earliestCommitToRetain") or ""
            if earliest and as_of < earliest:
                raise TableError(f"table {self.config.name} as of {as_of} cannot be read: the clean at {last_clean.time} "
                                 f"kept only the versions from {earliest} on", hint)
        gone = _services.missing_files(self.storage, timeline, as_of)
        if gone:  # a keep_latest_file_versions clean names no earliest commit
            raise TableError(f"table {self.config.name} as of {as_of} cannot be read: the cleaner removed "
                             f"{len(gone)} of the files that version reads (e.g. {gone[0]})", hint)

    def _check_writable(self) -> None:
        self.config = TableConfig.from_properties_map(read_properties(self.storage))  # as it is now
        reason = self.config.unwritable_reason(self.storage)
        if reason:
            raise TableError(f"pipe cannot write into table {self.config.name}: {reason}")

    @contextmanager
    def _changing(self, refuse=None, keep: frozenset[str] = frozenset()) -> Iterator:
        """The writer lock, for anything that changes a file of the table (writes and every
        service). Under it: hoodie.properties as it is now (recovered if an update of it
        crashed), refused if pipe cannot write the table, if another writer is live (a fresh
        heartbeat: nothing of its may change, its metadata table included) or by
        `refuse(timeline)`, whose result is yielded; then a metadata table retired, or its
        partitions other than `files` and `keep` (those this change keeps in step) dropped."""
        self._refuse_other_version()
        with self.lock():
            recover_properties(self.storage)
            self.config = TableConfig.from_properties_map(read_properties(self.storage))
            reason = self.config.unchangeable_reason(self.storage)
            if reason:
                raise TableError(f"pipe cannot change table {self.config.name}: {reason}")
            timeline = self.timeline()  # listed once for both checks
            _services.refuse_live_writes(self.storage, timeline)
            checked = refuse(timeline) if refuse is not None else None
            self._metadata_table_in_step(timeline, keep)
            yield checked

    def _metadata_table_in_step(self, timeline: Timeline, keep: frozenset[str] = frozenset()) -> None:
        """Before a change, under the lock: a metadata table whose files partition pipe can keep
        in step stays (metadata_table.py), less the partitions pipe does not keep, which are
        dropped as Java drops a disabled index; one pipe cannot keep (another version than
        the table's, files it cannot read) is retired (retire_metadata_table); a table that
        asks for one and has none gets one, built from a listing."""
        props = read_properties(self.storage)
        mdt = _metadata_table.MetadataTable(self.storage, self.config.table_version)
        if _metadata_table.kept(props):
            reason = mdt.unkeepable_reason(timeline)
            if reason is None:
                if (_metadata_table.RECORD_INDEX in keep and _metadata_table.keeps_record_index(props)
                        and mdt.record_index_spec(timeline) is None):
                    keep = keep - {_metadata_table.RECORD_INDEX}  # file groups pipe cannot number as Java does
                dropped = _metadata_table.drop_unkept_partitions(self.storage, props, keep)
                if self.wants_record_index and _metadata_table.RECORD_INDEX in keep and not _metadata_table.keeps_record_index(read_properties(self.storage)):
                    self._build_record_index(mdt, timeline)
                if dropped:
                    what = (f"dropped the metadata table partition(s) {', '.join(dropped)} of {self.config.name}, which pipe does not "
                            "keep in step for this change, as Hudi drops a disabled index (its files partition stays, kept in step); "
                            "Java's next writer with those indexes enabled builds them again")
                    log.warning(what)
                    self.retired = what
                    self.config = TableConfig.from_properties_map(read_properties(self.storage))
                return
        else:
            reason = "it has no files partition pipe could keep in step (only partitions being built)"
        self.retire_metadata_table(reason)
        if self.wants_metadata_table or self.wants_record_index:
            mdt.initialize(read_properties(self.storage), timeline)
            self.config = TableConfig.from_properties_map(read_properties(self.storage))
            if self.wants_record_index and _metadata_table.RECORD_INDEX in keep:
                self._build_record_index(mdt, timeline)

    def _build_record_index(self, mdt, timeline: Timeline) -> None:
        """Builds the record index of a table that asks for one (`index: record`) from its
        committed rows' keys, partitions and file groups, in Spark (metadata_table.py)."""
        from pyspark.sql import functions as F

        if timeline.completed(WRITE_ACTIONS):
            rows = self.read(columns=[]).select(F.col("_hoodie_record_key").alias("_k"), F.col("_hoodie_partition_path").alias("_pipe_part"),
                                                F.substring_index(F.col("_hoodie_file_name"), "_", 1).alias("_pipe_file"))
            rows = spark_api.local_checkpoint(rows, eager=True)
            keys = rows.count()
            twice = rows.groupBy("_k").count().where("count > 1").limit(3).collect()
            if twice:
                raise TableError(f"table {self.config.name} holds key(s) {', '.join(repr(r[0]) for r in twice)} more than once, and a "
                                 "record index names one place per key, so pipe cannot build one; nothing was written",
                                 "rebuild the table once with `pipe run --select TABLE --full-refresh` (which keeps one row per key), "
                                 "or declare `index: global`")
        else:
            rows, keys = spark_api.empty_frame(self.spark, "_k string, _pipe_part string, _pipe_file string"), 0
        t = mdt.initialize_record_index(self.spark, read_properties(self.storage), timeline, rows, keys)
        log.info("built the record index of %s from its %d keys (metadata table instant %s)", self.config.name, keys, t)
        self.config = TableConfig.from_properties_map(read_properties(self.storage))

    def retire_metadata_table(self, reason: str = "pipe cannot keep it in step") -> str | None:
        """Retires the metadata table a Java writer keeps (Hudi's default since 0.11) exactly as
        Hudi's writer does when it runs with hoodie.metadata.enable=false
        (HoodieTable.maybeDeleteMetadataTable -> HoodieTableMetadataUtil.deleteMetadataTable):
        first hoodie.table.metadata.partitions(.inflight) are cleared through the crash-safe
        update of hoodie.properties, so no reader trusts it any more, then .hoodie/metadata is
        deleted: pipe retires one it cannot keep in step (`reason`: another version than the
        table's, files it cannot read; metadata_table.py keeps the rest), and Java's next writer
        with the default settings rebuilds it from a listing. A crash between the steps leaves
        an unused folder, deleted by the next change. Call under the lock; returns what was
        done (also in `self.retired` and logged), or None."""
        leftover = self.storage.list_files(METADATA_TABLE, recursive=True)
        if not self.config.has_metadata_table and not leftover:
            return None
        if self.config.has_metadata_table:
            partitions = self.config.metadata_partitions or "inflight"
            update_properties(self.storage, remove=("hoodie.table.metadata.partitions", "hoodie.table.metadata.partitions.inflight"))
            self.config = self.config.without_metadata_table()
            _services.fault("metadata_table_after_properties")
            what = (f"retired the metadata table of {self.config.name} (partitions: {partitions}) as Hudi does with "
                    f"hoodie.metadata.enable=false: {reason}; Java's next writer with default settings rebuilds it")
        else:
            what = f"deleted the unused metadata table folder of {self.config.name} (.hoodie/metadata, left by an interrupted retirement)"
        # its own hoodie.properties first: a partial folder is then no table to anyone
        for f in sorted(leftover, key=lambda f: (not f.path.endswith("/.hoodie/hoodie.properties"), f.path)):
            self.storage.delete(f.path)
        if hasattr(self.storage, "root"):  # local folders: the empty directories too, deepest first
            top = self.storage.full_path(METADATA_TABLE)
            for dirpath, _, _ in sorted(os.walk(top), key=lambda d: -d[0].count(os.sep)):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        log.warning(what)
        self.retired = what
        return what

    def _set_create_schema(self, schema_json: str) -> None:
        """hoodie.table.create.schema, as Java writes it when it creates a table: the Avro
        schema of the first write (without meta fields), which Java readers fall back to while
        the table has no commit. Written with the first write, whose schema pipe only then knows."""
        update_properties(self.storage, {"hoodie.table.create.schema": schema_json})
        self.config = TableConfig.from_properties_map(read_properties(self.storage))

    def partition_paths(self, df) -> set[str]:
        """The partition paths of `df`'s rows as this table writes them (keygen.py, in the text
        its stored rows have); only the distinct paths reach the driver."""
        from pyspark.sql import functions as F

        timeline = self.timeline()
        slices = FileSystemView.load(self.storage, timeline).latest_slices()
        self.config = _keygen.settle(self.spark, self.storage, self.config, slices, self.schema(timeline, files_only=True))
        return {r[0] for r in df.select(_keygen.partition_expr(F, self.config, dict(df.dtypes))).distinct().collect()}

    def _check_partitions_to_delete(self, patterns, slices) -> None:
        """delete_partition refuses patterns that match no partition (a typo would otherwise
        commit a replacecommit that deletes nothing, or less than meant)."""
        existing = sorted({s.partition for s in slices})
        _, unmatched = _writer.match_partitions(patterns, existing)
        if not patterns or unmatched:
            what = f"pattern(s) {', '.join(repr(p) for p in unmatched)} match no partition" if patterns else "no partitions_to_delete given"
            listed = ", ".join(repr(p) for p in existing) if existing else "none (the table has no live file groups)"
            raise TableError(f"delete_partition on table {self.config.name}: {what}; its partitions are: {listed}")

    def _with_buckets(self, opts, bootstrap: bool):
        """The write options with the table's simple bucket index: the number of buckets its
        properties declare or, for a table Java made (Java keeps the index as a write setting
        only), the one the write names; a bulk insert is an insert into the buckets."""
        declared, named = self.config.buckets, opts.buckets
        if declared is not None and named is not None and declared != named:
            raise TableError(f"table {self.config.name} has {declared} buckets per partition (hoodie.bucket.index.num.buckets), "
                             f"not {named}: a key's bucket depends on the number, so it cannot change",
                             f"declare `buckets: {declared}`, or rebuild the table (pipe run --full-refresh)")
        buckets = declared if declared is not None else named
        if buckets is None:
            return opts
        if bootstrap:
            raise TableError(f"table {self.config.name} has Hudi's bucket index, whose file groups a bootstrap does not make",
                             "load it with operation: insert instead")
        return dataclasses.replace(opts, buckets=buckets, operation="insert" if opts.operation == "bulk_insert" else opts.operation)

    def _refuse_layout(self, timeline: Timeline, buckets: int | None = None) -> tuple[Timeline, list]:
        """What only the timeline and the files show pipe cannot write into, checked under the
        lock before anything changes (a metadata table retired, a failed write rolled back):
        a refused write leaves every file as it was. Returns the timeline and latest slices.

        A clustering Java scheduled replaces its file groups when it completes: a write into
        them now would be lost then (Java's own writers reject such updates), and pipe does not
        execute clustering. A bucket index's file groups are numbered buckets (Java 0.15 keeps
        no hoodie.index.type in hoodie.properties, so only the file ids show it)."""
        pending = [i.time for i in timeline.pending() if _services.is_clustering(timeline, i)]
        if pending:
            raise TableError(f"table {self.config.name} has a pending clustering {pending[0]} (replacecommit): pipe does not execute "
                             "clustering, and a write now could be lost when it completes",
                             "complete it with Hudi (HoodieClusteringJob, Spark SQL `CALL run_clustering(op => 'execute', ...)`, "
                             "or a Java writer with clustering enabled), or roll it back with Hudi's CLI, then run again")
        slices = FileSystemView.load(self.storage, timeline).latest_slices()
        if buckets is not None:
            of = [(s, _bucket_index.bucket_of(s.file_id)) for s in slices]
            stray = next((s for s, bucket in of if bucket not in range(buckets)), None)
            if stray is not None:
                raise TableError(f"table {self.config.name} has file group {stray.file_id} in {stray.partition or 'the table'}, which is "
                                 f"not one of its {buckets} buckets: the table was not written with this bucket index",
                                 f"check `buckets:` against the writer that made it, or rebuild the table (pipe run --full-refresh)")
            owners: dict[tuple[str, int], str] = {}
            for s, bucket in of:  # a bucket is one file group: a second one would hold a key twice, and Java's next write fails on it
                first = owners.setdefault((s.partition, bucket), s.file_id)
                if first != s.file_id:
                    raise TableError(f"table {self.config.name} has two file groups for bucket {bucket} in "
                                     f"{s.partition or 'the table'} ({first} and {s.file_id}): a bucket index keeps one file group per "
                                     "bucket, so another writer wrote this table without it (or with another number of buckets)",
                                     "find the commit that added the second group (`pipe timeline`) and undo it (`pipe rollback` when it "
                                     "is the latest, else `pipe restore` to the instant before it), or rebuild the table (pipe run "
                                     "--full-refresh); nothing was written")
            return timeline, slices
        bucketed = bucket_index_file_ids(s.file_id for s in slices)
        if bucketed:
            raise TableError(f"pipe cannot write into table {self.config.name}: its file groups are those of Hudi's bucket index "
                             f"(hoodie.index.type=BUCKET; file ids start with an 8-digit bucket number, e.g. {bucketed[0]}), which "
                             "routes every key to the file group of its bucket: pipe writes it only knowing its number of buckets, which "
                             "Java keeps as a write setting (hoodie.bucket.index.num.buckets), not in the table",
                             "declare the table's bucket index in its YAML (`index: bucket` and `buckets:`, its "
                             "hoodie.bucket.index.num.buckets), or keep writing it with Java Hudi")
        return timeline, slices

    def _start_heartbeat(self, instant: str) -> None:
        """Hudi's heartbeat of an in-flight write (heartbeat.py): beaten with the lock's
        until the instant completes or is rolled back."""
        _heartbeat.beat(self.storage, instant, getattr(self, "_owner", None) or "")
        self._beating = getattr(self, "_beating", set()) | {instant}

    def _stop_heartbeat(self, instant: str) -> None:
        self._beating = getattr(self, "_beating", set()) - {instant}
        _heartbeat.stop(self.storage, instant)

    def _transition(self, instant: Instant, state: str, data: bytes) -> None:
        name = instant_path(instant, self.config.timeline_layout, state)
        if not self.storage.create_exclusive(name, data):
            raise TableError(f"instant file {name} exists already; another writer is active")

    def _remove_strays(self, instant: str, stats, log_prefixes: set[tuple[str, str]] = frozenset()) -> None:
        """Files of this instant that no write stat names (a retried or speculative task's
        output) would break readers: delete them before the commit. A log file's name has its
        slice's base instant, not this one: a stray log is one with a version this write
        assigned but another write token; a rewritten base file's `.cdc` file (named in its
        stat's cdcStats) has that prefix too when the group had a log target."""
        keep = {s.path for s in stats} | {path for s in stats for path in (s.cdc_stats or ())}
        partitions = {s.partition_path for s in stats} | {p for p, _ in log_prefixes}
        for part in partitions:
            prefixes = tuple(prefix for p, prefix in log_prefixes if p == part)
            for info in self.storage.list_files(part, recursive=False):
                name = info.path.rsplit("/", 1)[-1]
                if info.path in keep:
                    continue
                partial = _services.partial_file_instant(name) == instant  # a dead task's unfinished file
                if info.path.endswith(f"_{instant}.parquet") or partial or (prefixes and name.startswith(prefixes)):
                    self.storage.delete(info.path)

    def _check_conflicts(self, slices, stats, replaced: dict[str, list[str]] | None = None) -> None:
        """Refuses to commit when a file group we rewrote has changed since we read it, or,
        for a replacecommit, when the groups of a partition it replaces have (a write there
        would be hidden unseen)."""
        ours = {s.path for s in stats}  # the view lists our own uncommitted log files too

        def state(s):
            return s.base_instant, tuple(lf.name for lf in s.log_files if lf.path not in ours)

        before = {(s.partition, s.file_id): state(s) for s in slices}
        timeline = self.timeline()
        now = {(s.partition, s.file_id): state(s) for s in self.view(timeline).latest_slices()}
        hint = ("run again: the write is redone on the file groups as they are now. Run compactions and cleans between "
                "runs (pipe compact, or compact_after), or let one writer at a time write the table")
        # as Hudi's SimpleConcurrentFileWritesConflictResolutionStrategy: only a file group both
        # this write and another instant changed is a conflict; other groups may change freely
        for s in stats:
            key = (s.partition_path, s.file_id)
            if key in before and now.get(key) != before[key]:
                raise TableError(f"file group {s.file_id} in partition '{s.partition_path}' of table {self.config.name} was changed "
                                 f"by {self._changed_by(timeline, before[key], now.get(key))} while this write was writing it; "
                                 "nothing was committed and this write's files were removed", hint)
        for part in replaced or {}:
            if {k: v for k, v in before.items() if k[0] == part} != {k: v for k, v in now.items() if k[0] == part}:
                raise TableError(f"partition '{part}' of table {self.config.name} was changed by another instant while this write "
                                 "replaced it; nothing was committed", hint)

    @staticmethod
    def _changed_by(timeline: Timeline, was, now) -> str:
        """Which instant changed a file group: a compaction (new base instant), another write."""
        if now is None:
            return "a clean or replacecommit (the group is gone)"
        t = now[0]
        if t != was[0]:
            inst = timeline.find(t)
            if t in timeline.compactions:
                return f"compaction {t}"
            return f"another writer's {inst.action if inst else 'instant'} {t}"
        new_logs = [n for n in now[1] if n not in was[1]]
        return f"another writer's log file {new_logs[0]}" if new_logs else "another instant"

    # --- compaction (merge-on-read) --------------------------------------------------------------

    def compact(self) -> str | None:
        """Compacts every file slice with log files into a new base file (compaction.py);
        returns the compaction's instant, or None when no slice has logs."""
        if self.config.table_type != MERGE_ON_READ:
            raise TableError(f"table {self.config.name} is copy-on-write; only merge-on-read tables are compacted")
        with self._changing(keep=_MOVES_NO_KEY):
            self.rollback_pending()
            return self._compact()

    def _deltacommits_since_compaction(self) -> int:
        n = 0
        for inst in reversed(self.timeline().completed()):
            if inst.action == COMMIT:
                break
            n += inst.action == DELTACOMMIT
        return n

    def _compact(self) -> str | None:
        """Executes every pending compaction (oldest first: a Java writer's plan, or one whose
        compactor died), then plans and executes one over the other slices with logs."""
        from runtime.table import compaction as _compaction

        done = self._finish_compactions()
        timeline = self.timeline()
        slices = [s for s in FileSystemView.load(self.storage, timeline).latest_slices() if s.has_logs and s.pending_compaction is None]
        if not slices:
            return done
        instant = Instant(timeline.new_instant_time(), COMPACTION, REQUESTED)
        self._transition(instant, REQUESTED, _avro.to_bytes(_avro.COMPACTION_PLAN, _compaction.plan(slices)))
        return self._execute_compaction(timeline, instant, slices)

    def _finish_compactions(self, only_pipes: bool = False) -> str | None:
        """Executes the pending compactions, oldest first (with `only_pipes`, those pipe
        scheduled: a compactor that died left them); returns the last one's instant."""
        from runtime.table import compaction as _compaction

        timeline = self.timeline()
        done = None
        for t in timeline.pending_compactions():
            plan = _avro.from_bytes(self.storage.read_bytes(timeline.path(Instant(t, COMPACTION, REQUESTED))))
            if only_pipes and not _compaction.scheduled_by_pipe(plan):
                continue
            slices = _compaction.planned_slices(self.storage, self.config.name, t, plan)
            done = self._execute_compaction(timeline, Instant(t, COMPACTION, REQUESTED), slices)
            timeline = self.timeline()
        return done

    def tidy(self) -> list[str]:
        """What a dead pipe process left on a table this run may not write (no new input): a
        stale writer lock, failed writes, a compaction pipe scheduled, temporary files. When
        there is any, and no live writer holds the lock, it is cleared up as a write would
        (rolled back, executed, deleted); returns what was done. Never waits, never fails: a
        live writer, or what pipe refuses to touch, is left to the next write to report."""
        timeline = self.timeline()
        stale_lock = self.storage.exists(LOCK_FILE)
        if not stale_lock and not timeline.pending():
            return []
        done: list[str] = []
        try:
            with self._changing_now():
                done += [f"rolled back {t}" for t in self.rollback_pending()]
                if self.config.table_type == MERGE_ON_READ:
                    finished = self._finish_compactions(only_pipes=True)
                    if finished:
                        done.append(f"finished compaction {finished}")
                done += [f"deleted {p}" for p in _services.remove_dead_temps(self.storage)]
        except TableError:  # a live writer, or something pipe must not touch: the next write says what
            return done
        return done

    @contextmanager
    def _changing_now(self) -> Iterator:
        """_changing, without waiting for a live writer's lock (LockTimeout at once)."""
        self._refuse_other_version()
        with self.lock(wait_s=0):
            recover_properties(self.storage)
            self.config = TableConfig.from_properties_map(read_properties(self.storage))
            if self.config.unchangeable_reason(self.storage):
                raise TableError("unchangeable")
            _services.refuse_live_writes(self.storage, self.timeline())
            yield

    def _execute_compaction(self, timeline: Timeline, instant: Instant, slices) -> str:
        """Runs the requested compaction `instant` over `slices` and commits it. A failure
        leaves it requested, its files gone (services.revert_compaction), for the next try."""
        from runtime.table import compaction as _compaction

        struct = self.schema(timeline)
        if not self.storage.exists(timeline.path(instant, INFLIGHT)):
            self._transition(instant, INFLIGHT, b"")
        try:
            spec = _reader.merge_spec(self.storage, _writer.with_meta_struct(struct), timeline, self.config)
            written = _compaction.run(self.spark, self.storage, instant.time, slices, spec)
            _services.fault("compaction_after_files")
            stats = []
            by_group = {(s.partition, s.file_id): s for s in slices}
            for fid, part, path, nrows, size, *_ in written:
                if not path:  # every row of the slice was deleted: an empty base file hides them
                    path, size = _writer.write_empty_base_file(self.storage, part, fid, instant.time, struct)
                stats.append(WriteStat(fid, path, part, by_group[(part, fid)].base_instant, nrows, 0, nrows, 0, size))
            self._remove_strays(instant.time, stats)
        except BaseException:
            _services.revert_compaction(self.storage, instant.time)
            raise
        meta = CommitMetadata("COMPACT", stats, {"schema": avro_schema_json(struct, self.config.name)}, compacted=True)
        self._check_lock()
        _metadata_table.before_complete(self.storage, instant.time, stats, spark=self.spark)
        if timeline.complete(Instant(instant.time, COMMIT, REQUESTED), meta.to_bytes(timeline.layout)) is None:
            raise TableError(f"compaction {instant.time} was completed by someone else")
        _markers.delete_dir(self.storage, instant.time)
        return instant.time

    # --- changing the table version ----------------------------------------------------------

    def migrate(self, to: int, dry_run: bool = False) -> "_upgrade.Migration":
        """Changes the table's Hudi version to `to` (6, 8 or 9) in place, as Java's
        UpgradeDowngrade does (upgrade_downgrade.py says what changes and why a crash leaves
        the old or the new version); with `dry_run`, only says what it would do. On a table of
        version `to` it deletes what an interrupted migration left of the old layout."""
        if to not in _upgrade.VERSIONS:
            raise TableError(f"pipe migrates tables to version 6, 8 or 9, not {to}")
        if dry_run:
            return self._migration(to, self.timeline())
        with self._changing():
            frm = self.config.table_version
            frm_layout, to_layout = self.config.timeline_layout, 2 if to >= 8 else 1
            if frm == to:
                m = _upgrade.Migration(self.config.name, frm, to)
                for path in _upgrade.old_layout_files(self.storage, 1 if to_layout == 2 else 2):
                    self.storage.delete(path)
                    m.finished.append(path)
                return m
            m = _upgrade.Migration(self.config.name, frm, to)
            self._refuse_unfinished(self.timeline())
            m.rollbacks = self.rollback_pending()
            if self.config.table_type == MERGE_ON_READ:
                m.compact_groups = sum(1 for sl in self.view().latest_slices() if sl.has_logs)
                self._compact()
            self._refuse_unfinished(self.timeline(), every=True)
            m.metadata_table = self.config.has_metadata_table or self.wants_metadata_table
            if self.config.has_metadata_table:
                self.retire_metadata_table(f"its table version changes to {to}, and pipe builds it again at that version")
            props = read_properties(self.storage)
            m.set_props, m.removed_props = _upgrade.property_changes(props, frm, to)
            if frm_layout != to_layout:
                for path in _upgrade.old_layout_files(self.storage, to_layout):  # an interrupted try's
                    self.storage.delete(path)
                if to_layout == 2:
                    from runtime.table import lsm_timeline

                    files, m.reserialized = _upgrade.active_files_up(self.storage)
                    rows, m.kept = _upgrade.archived_up(self.storage)
                    m.kept = [f".hoodie/archived/{k} (an archive log pipe could not read; Hudi 1.x readers of the table do not read it)" for k in m.kept]
                    _upgrade.write_files(self.storage, files)
                    if rows:
                        lsm_timeline.append(self.storage, rows)
                    m.instants, m.archived = len(files), len(rows)
                else:
                    files, m.reserialized = _upgrade.active_files_down(self.storage)
                    archived = _upgrade.archived_down(self.storage)
                    m.mtimes_kept = _upgrade.write_files(self.storage, files + archived)
                    m.instants, m.archived = len(files), sum(1 for f in archived if not f.path.endswith(REQUESTED))
                _services.fault("migrate_after_timeline")
            update_properties(self.storage, m.set_props, tuple(m.removed_props))
            _services.fault("migrate_after_properties")
            self.config = TableConfig.from_properties_map(read_properties(self.storage))
            if frm_layout != to_layout:
                for path in _upgrade.old_layout_files(self.storage, frm_layout):
                    self.storage.delete(path)
            m.instant = self._record_migration(frm, to)
            if m.metadata_table:
                _metadata_table.MetadataTable(self.storage, to).initialize(read_properties(self.storage), self.timeline())
                self.config = TableConfig.from_properties_map(read_properties(self.storage))
            return m

    def _refuse_unfinished(self, timeline: Timeline, every: bool = False) -> None:
        """A migration is refused, the table unchanged, while an instant is pending that pipe
        neither rolls back nor finishes (a clustering, an indexing or a log compaction Java
        planned); with `every`, while any instant is pending."""
        finished = (*WRITE_ACTIONS, COMPACTION, CLEAN, "rollback", "savepoint", "restore")
        left = [i for i in timeline.pending() if every or i.action not in finished or _services.is_clustering(timeline, i)]
        if left:
            names = ", ".join(f"{i.time}.{i.action}.{i.state}" for i in left)
            raise TableError(f"table {self.config.name} has pending instants pipe does not finish ({names}); its version is unchanged",
                             "finish or roll them back with the writer that made them, then run pipe migrate again")

    def _migration(self, to: int, timeline: Timeline) -> "_upgrade.Migration":
        """What migrate(to) would do, found without changing a file."""
        frm = self.config.table_version
        m = _upgrade.Migration(self.config.name, frm, to)
        frm_layout, to_layout = self.config.timeline_layout, 2 if to >= 8 else 1
        if frm == to:
            m.finished = _upgrade.old_layout_files(self.storage, 1 if to_layout == 2 else 2)
            return m
        reason = self.config.unchangeable_reason(self.storage)
        if reason:
            raise TableError(f"pipe cannot change table {self.config.name}: {reason}")
        self._refuse_unfinished(timeline)
        m.rollbacks = [i.time for i in _services.failed_writes(self.storage, timeline)]
        if self.config.table_type == MERGE_ON_READ:
            m.compact_groups = sum(1 for sl in self.view(timeline).latest_slices() if sl.has_logs)
        m.metadata_table = self.config.has_metadata_table or self.wants_metadata_table
        m.set_props, m.removed_props = _upgrade.property_changes(read_properties(self.storage), frm, to)
        if frm_layout != to_layout:
            if to_layout == 2:
                files, m.reserialized = _upgrade.active_files_up(self.storage)
                rows, kept = _upgrade.archived_up(self.storage)
                m.instants, m.archived, m.kept = len(files), len(rows), [f".hoodie/archived/{k} (an archive log pipe cannot read)" for k in kept]
            else:
                files, m.reserialized = _upgrade.active_files_down(self.storage)
                m.instants = len(files)
                m.archived = sum(1 for f in _upgrade.archived_down(self.storage) if not f.path.endswith(REQUESTED))
                m.mtimes_kept = hasattr(self.storage, "root")
        return m

    def _record_migration(self, frm: int, to: int) -> str:
        """The empty commit (deltacommit on merge-on-read) that puts a migration on the
        timeline, in the new version's format, with the table's schema; returns its instant."""
        timeline = self.timeline()
        schema = next((m.schema for i in reversed(timeline.completed()) if (m := timeline.commit_metadata(i)).schema), None)
        action, meta = _upgrade.empty_commit_metadata(self.config.table_type, schema, frm, to)
        instant = Instant(timeline.new_instant_time(), action, REQUESTED)
        self._start_heartbeat(instant.time)
        try:
            self._transition(instant, REQUESTED, b"")
            self._transition(instant, INFLIGHT, CommitMetadata(meta.operation_type, [], {}).to_bytes(timeline.layout))
            self._check_lock()
            if timeline.complete(instant, meta.to_bytes(timeline.layout)) is None:
                raise TableError(f"instant {instant.time} was completed by someone else")
        finally:
            self._stop_heartbeat(instant.time)
        return instant.time

    def rollback_pending(self) -> list[str]:
        """Rolls back every requested or inflight write (see services.rollback_pending)."""
        return _services.rollback_pending(self.storage)

    def clean(self, policy: str = _services.KEEP_LATEST_COMMITS, retain: int = 10, retain_from: str | None = None) -> _services.CleanResult:
        """Deletes file versions no retained commit, savepoint or consumer (`retain_from`: the
        oldest instant an incremental consumer has read up to) needs; see services.plan_clean."""
        with self._changing(keep=_MOVES_NO_KEY):
            self.rollback_pending()
            return _services.clean(self.storage, policy, retain, retain_from)

    def archive(self, min_instants: int = 20, max_instants: int = 30, keep_from: str | None = None) -> list[str]:
        with self._changing(keep=_MOVES_NO_KEY):
            self.rollback_pending()
            return _services.archive(self.storage, min_instants, max_instants, keep_from)

    def savepoint(self, instant: str | None = None, user: str = "", comment: str = "") -> str:
        """Savepoints a completed write (default: the latest); returns its instant time."""
        with self._changing(keep=_MOVES_NO_KEY):
            self.rollback_pending()
            return _services.savepoint(self.storage, instant, user or _user(), comment)

    def delete_savepoint(self, instant: str) -> None:
        with self._changing(keep=_MOVES_NO_KEY):
            _services.delete_savepoint(self.storage, instant)

    def savepoints(self) -> list[str]:
        return _services.savepoint_times(self.timeline())

    def restore(self, instant: str) -> tuple[str, list[str]]:
        """Returns the table to the completed write `instant` (see services.restore); returns
        the restore instant and the instants it undid, newest first."""
        with self._changing():
            return _services.restore(self.storage, instant)

    def rollback(self, instant: str) -> str:
        """Rolls back the latest completed write, which must be `instant`; returns the rollback
        instant."""
        with self._changing():
            return _services.rollback(self.storage, instant)

    # --- reading -----------------------------------------------------------------------------

    def read(self, as_of: str | None = None, since: str | None = None, until: str | None = None, meta: bool = True,
             read_optimized: bool = False, columns: list[str] | None = None, named: frozenset[str] | None = None,
             where: tuple = (), plan: list | None = None):
        """Snapshot, time travel or incremental read, with the schema as of the instant read
        (an insert_overwrite_table may have changed it since). A merge-on-read table's log
        files are merged into its base files' rows, unless `read_optimized` (base files only:
        faster, but without the updates and deletes still in log files). `columns`: only these
        data columns (Spark cannot push a query's columns into the merge of log files, so a
        reader that needs few columns of a merge-on-read table names them). `named`: the
        lower-case names a query uses (views.names_used): a merge-on-read read takes only the
        data columns among them. `where`: conditions every row the reader uses meets
        (views.view_filters): only the partitions that can hold such rows are read
        (partition_pruning.py); the rows are not filtered. `plan`: a list the read's
        reader.ReadPlan is appended to."""
        self._check_readable()
        timeline = self.timeline()
        if timeline.layout >= 2 and (since is not None or until is not None):
            timeline, instants = self._completion_window(timeline, since, until, as_of)
            struct = self.schema(timeline)
            return _reader.read(self.spark, self.storage, struct, timeline, meta=meta, config=self.config,
                                read_optimized=read_optimized, instants=instants, columns=self._columns(struct, columns, named, read_optimized),
                                partitions=partition_filter(self.config, struct, where), plan=plan)
        self._check_not_cleaned(timeline, as_of)
        struct = self.schema(timeline, as_of=until or as_of)
        return _reader.read(self.spark, self.storage, struct, timeline, as_of=as_of, since=since, until=until, meta=meta,
                            config=self.config, read_optimized=read_optimized, columns=self._columns(struct, columns, named, read_optimized),
                            partitions=partition_filter(self.config, struct, where), plan=plan)

    def _columns(self, struct, columns: list[str] | None, named: frozenset[str] | None = None,
                 read_optimized: bool = False) -> list[str] | None:
        """`columns` as the table names them (Spark's names are case-insensitive), refused
        when the table lacks one; or, from `named`, the data columns a merge needs to read
        (None: all of them, as for a copy-on-write table, whose base files Spark prunes itself)."""
        names = {f.name.lower(): f.name for f in (struct.fields if struct else [])}
        if columns is None and named is not None and self.config.table_type == MERGE_ON_READ and not read_optimized:
            kept = [n for low, n in names.items() if low in named]
            return kept if len(kept) < len(names) else None
        if columns is None:
            return None
        out = []
        for c in columns:
            if c.lower() not in names:
                raise TableError(f"table {self.config.name} has no column {c!r} (its columns: {', '.join(names.values()) or 'none'})",
                                 "read a column the table has")
            if names[c.lower()] not in out:
                out.append(names[c.lower()])
        return out

    def read_changes(self, since: str | None, until: str | None = None):
        """The changes the writes in (since, until] made (cdc.py): the data columns of each
        changed record's image, `_change_type` (insert, update_preimage, update_postimage,
        delete) and `_commit_time`. `since` None: every row as of `until` is an insert."""
        self._check_readable()
        timeline = self.timeline()
        if timeline.layout >= 2:
            return self._changes_by_completion(timeline, since, until)
        until = until or (timeline.latest_completed().time if timeline.latest_completed() else None)
        from pyspark.sql import types as T

        struct = self.schema(timeline, as_of=until) or T.StructType([])
        columns = [f.name for f in struct.fields]
        groups = None if since is None else _cdc.touched_file_groups(timeline, since, until)
        after = _reader.read(self.spark, self.storage, struct, timeline, as_of=until, config=self.config, file_groups=groups)
        if since is None:
            return _cdc.all_inserts(after, columns)
        before_struct = self.schema(timeline, as_of=since)  # the columns may have changed since
        before = _reader.read(self.spark, self.storage, before_struct, timeline, as_of=since, config=self.config, file_groups=groups)
        return _cdc.changes(before, after, struct, until)

    def read_batches(self, as_of: str | None = None, since: str | None = None, until: str | None = None, meta: bool = True,
                     read_optimized: bool = False):
        """The rows `read` returns, read in this process with pyarrow, without Spark: (Arrow
        schema, iterator of record batches). For small reads of a table on a local disk."""
        self._check_readable()
        timeline = self.timeline()
        if timeline.layout >= 2 and (since is not None or until is not None):
            timeline, instants = self._completion_window(timeline, since, until, as_of)
            return _reader.read_batches(self.storage, self.arrow_schema(timeline), timeline, meta=meta, config=self.config,
                                        read_optimized=read_optimized, instants=instants)
        self._check_not_cleaned(timeline, as_of)
        schema = self.arrow_schema(timeline, as_of=until or as_of)
        return _reader.read_batches(self.storage, schema, timeline, as_of=as_of, since=since, until=until, meta=meta,
                                    config=self.config, read_optimized=read_optimized)

    # --- the writer lock -----------------------------------------------------------------------

    @contextmanager
    def lock(self, ttl_s: float = 60.0, wait_s: float = 120.0) -> Iterator[None]:
        """One writer per table. The lock file names its owner and an expiry that a heartbeat
        pushes forward; a crashed holder's lock expires and is taken over."""
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + wait_s
        self._took_over = False

        def body() -> bytes:
            return json.dumps({"owner": owner, "expires_ms": int((time.time() + ttl_s) * 1000)}).encode()

        while not self.storage.create_exclusive(LOCK_FILE, body()):
            try:
                held = json.loads(self.storage.read_bytes(LOCK_FILE))
            except (FileNotFoundError, ValueError):
                continue
            if held.get("expires_ms", 0) < time.time() * 1000 or _holder_is_gone(held.get("owner", "")):
                self.storage.delete(LOCK_FILE)  # expired, or held by a dead process on this host
                self._took_over = True  # that process may have left temporary files (see write)
                continue
            if time.monotonic() > deadline:
                until = dt.datetime.fromtimestamp(held["expires_ms"] / 1000, dt.timezone.utc).isoformat(timespec="seconds")
                raise LockTimeout(f"table {self.config.name} is being written by {held.get('owner')}; "
                                  f"if that process is gone its lock expires at {until}")
            time.sleep(0.2)
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(ttl_s / 3):
                try:
                    if self._lock_owner() != owner:
                        return  # taken over: the commit will notice and refuse
                    self.storage.write_atomic(LOCK_FILE, body())
                    for t in list(getattr(self, "_beating", ())):  # Hudi's heartbeats of our in-flight instants
                        if t in self._beating:
                            _heartbeat.beat(self.storage, t, owner)
                except Exception:  # noqa: BLE001 - a failed beat is retried at the next one
                    continue

        beat = threading.Thread(target=heartbeat, daemon=True, name=f"pipe-lock-{self.config.name}")
        beat.start()
        self._owner = owner
        try:
            yield
        finally:
            stop.set()
            beat.join()
            self._owner = None
            if self._lock_owner() == owner:  # never delete a lock someone else took over
                self.storage.delete(LOCK_FILE)

    def _lock_owner(self) -> str | None:
        try:
            return json.loads(self.storage.read_bytes(LOCK_FILE)).get("owner")
        except (FileNotFoundError, ValueError):
            return None

    def _check_lock(self) -> None:
        if getattr(self, "_owner", None) is None or self._lock_owner() != self._owner:
            raise TableError(f"lost the writer lock of table {self.config.name} (another writer took it over); nothing was committed")


# the metadata table partitions a service that moves no key keeps in step (its files partition
# always): the record index of a compaction, a clean, an archiving or a savepoint stays right
_MOVES_NO_KEY = frozenset({_metadata_table.RECORD_INDEX})


def _keeps_record_index(opts) -> frozenset[str]:
    """The partitions a write keeps in step besides `files`: the record index, for the
    operations whose moved keys the writer names (record_index.py), with the global index
    whose uniqueness it records; any other write drops it, as Java drops a disabled index."""
    if opts.operation in ("upsert", "insert", "delete") and opts.index == "global" and opts.buckets is None:
        return frozenset({_metadata_table.RECORD_INDEX})
    return frozenset()


def _schema_key(footer) -> str:
    """What Spark's schema of a Parquet file depends on: the Parquet schema, and the Spark
    schema a Spark writer may have stored beside it."""
    spark_schema = (footer.metadata or {}).get(b"org.apache.spark.sql.parquet.row.metadata", b"")
    parquet = [line for line in str(footer.schema).splitlines() if not line.startswith("<")]  # not the object's address
    return "\n".join(parquet + [spark_schema.decode("utf-8", "replace")])


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        return "pipe"


def _holder_is_gone(owner: str) -> bool:
    """True when the lock's owner is a process of this host that no longer exists."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


