"""Change data capture: what the commits in (since, until] changed, row by row, with the kind
of each change and the image before it where there was one.

Hudi's CDC reader infers changes it has no CDC log for by comparing a file group's slice
before a commit with the slice the commit wrote (its "inference" cases for inserted and
deleted base files). pipe does that for every change, so it needs no `.cdc` log files and
works on any table, also one Java wrote: the file groups that writes in the range touched
(their write stats, and the groups a replacecommit replaced) are read as of `since` and as of
`until`, and the two images of each record are compared in Spark. Cleaning keeps the slices
an incremental consumer's checkpoint needs (services.plan_clean's `retain_from`), so the
before-images are there for as long as a consumer has not read past them.

A record is (record key, partition path), as in Hudi's CDC: a row that moved to another
partition is a `delete` in its old partition and an `insert` in its new one, so an aggregate
by partition value sees both sides. The changes are net over the range: a key inserted and
deleted within it does not appear, and an update is one preimage and one postimage however
many commits changed it."""

from __future__ import annotations

from runtime.table.layout import completed_write_instants, writes_archived_after
from runtime.table.timeline import Timeline

CHANGE_TYPE = "_change_type"
COMMIT_TIME = "_commit_time"
INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE = "insert", "update_preimage", "update_postimage", "delete"


def touched_file_groups(timeline: Timeline, since: str | None, until: str | None, instants=None) -> set[tuple[str, str]] | None:
    """(partition, file id) of every group a write in (since, until] (or of `instants`, given)
    wrote or replaced, or None when some of those writes were archived (their write stats are
    gone: every group counts). A compaction changes no record, so its commit does not count."""
    if instants is None and writes_archived_after(timeline, since):
        return None
    groups: set[tuple[str, str]] = set()
    for inst in completed_write_instants(timeline, since, until) if instants is None else instants:
        meta = timeline.commit_metadata(inst)
        if meta.compacted:
            continue
        groups.update((s.partition_path, s.file_id) for s in meta.write_stats)
        for part, ids in (meta.replaced or {}).items():
            groups.update((part, fid) for fid in ids)
    return groups


def lost_before_images(storage, timeline: Timeline, since: str, until: str | None) -> str | None:
    """Why the before-images of the changes in (since, until] cannot be read (their files were
    cleaned, by a cleaner that did not know this consumer), or None."""
    from runtime.table.services import missing_files

    groups = touched_file_groups(timeline, since, until)
    missing = missing_files(storage, timeline, since, groups)
    if not missing:
        return None
    return f"{len(missing)} file(s) of the table as of instant {since} were cleaned (e.g. {missing[0]}), so the rows as they were then are gone"


def lost_before_images_by_completion(storage, timeline: Timeline, since: str, until: str) -> str | None:
    """lost_before_images of a Hudi 1.x table (timeline layout 2), whose `since` and `until`
    are completion times: the before-images are the table as it stood when `since` completed."""
    from runtime.table.services import missing_files

    before = timeline.completed_by(since)
    last = before.latest_completed()
    window = [i for i in timeline.completed_after(since) if i.completed_at <= until and i.time not in timeline.compactions]
    missing = missing_files(storage, before, last.time if last else None, touched_file_groups(timeline, None, None, window))
    if not missing:
        return None
    return (f"{len(missing)} file(s) of the table as it stood when {since} completed were cleaned (e.g. {missing[0]}), "
            "so the rows as they were then are gone")


def changes(before, after, struct, until: str):
    """The change rows between `before` and `after` (DataFrames of the touched groups' rows
    with meta columns, as of since and as of until): the data columns of `struct` (the schema
    as of until; `before` is aligned to it by name), then `_change_type` and `_commit_time`
    (the commit that wrote the after-image; for a delete, `until`).

    The two sides are one union, shuffled once by (key, partition path). A record present on
    both sides with the same sequence number did not change; the rest of a (key, partition)
    is a delete (before only), an insert (after only) or an update (both: the before rows are
    preimages, the after rows postimages). Keys stored twice in a group (inserts that kept
    duplicates) pair up without phantom changes."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = ["_hoodie_record_key", "_hoodie_partition_path"]
    seq, t = "_hoodie_commit_seqno", "_hoodie_commit_time"

    def side(df, name):
        data = [(F.col(f"`{f.name}`").try_cast(f.dataType) if f.name in df.columns else F.lit(None).cast(f.dataType)).alias(f.name)
                for f in struct.fields]
        return df.select(*key, seq, t, F.lit(name).alias("_side"), *data)

    both = side(before, "before").unionByName(side(after, "after")).repartition(*key)
    same = Window.partitionBy(*key, seq, t)
    rows = both.withColumn("_n", F.count(F.lit(1)).over(same)).where(F.col("_n") == 1)
    record = Window.partitionBy(*key)
    is_before = F.col("_side") == "before"
    rows = rows.withColumn("_has_before", F.max(is_before.cast("int")).over(record)) \
               .withColumn("_has_after", F.max((~is_before).cast("int")).over(record)) \
               .withColumn("_after_t", F.max(F.when(~is_before, F.col(t))).over(record))
    kind = (F.when(is_before & (F.col("_has_after") == 1), F.lit(UPDATE_PREIMAGE))
            .when(is_before, F.lit(DELETE))
            .when(F.col("_has_before") == 1, F.lit(UPDATE_POSTIMAGE))
            .otherwise(F.lit(INSERT)))
    when = F.when(is_before, F.coalesce(F.col("_after_t"), F.lit(until))).otherwise(F.col(t))
    return rows.select(*[F.col(f"`{f.name}`") for f in struct.fields], kind.alias(CHANGE_TYPE), when.alias(COMMIT_TIME))


def all_inserts(snapshot, data_columns: list[str]):
    """Every row of a snapshot as an insert: the changes since the table was empty."""
    from pyspark.sql import functions as F

    return snapshot.select(*[F.col(f"`{c}`") for c in data_columns], F.lit(INSERT).alias(CHANGE_TYPE),
                           F.col("_hoodie_commit_time").alias(COMMIT_TIME))
