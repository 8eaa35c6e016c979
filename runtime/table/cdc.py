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

from runtime.table.layout import completed_write_instants
from runtime.table.timeline import Timeline

CHANGE_TYPE = "_change_type"
COMMIT_TIME = "_commit_time"
INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE = "insert", "update_preimage", "update_postimage", "delete"
CHANGE_COLUMNS = (CHANGE_TYPE, COMMIT_TIME)


def touched_file_groups(timeline: Timeline, since: str | None, until: str | None) -> set[tuple[str, str]] | None:
    """(partition, file id) of every group a write in (since, until] wrote or replaced, or None
    when some of those writes were archived (their write stats are gone: every group counts).
    A compaction changes no record, so its commit does not count."""
    done = timeline.completed()
    if since is not None and done and since < done[0].time and timeline.instants and timeline.instants[0].time > since:
        return None
    groups: set[tuple[str, str]] = set()
    for inst in completed_write_instants(timeline, since, until):
        meta = timeline.commit_metadata(inst)
        if meta.compacted:
            continue
        groups.update((s.partition_path, s.file_id) for s in meta.write_stats)
        for part, ids in (meta.replaced or {}).items():
            groups.update((part, fid) for fid in ids)
    return groups


def changes(before, after, data_columns: list[str], until: str):
    """The change rows between `before` and `after` (DataFrames of the touched groups' rows
    with meta columns, as of since and as of until): the data columns, then `_change_type` and
    `_commit_time` (the commit that wrote the after-image; for a delete, `until`)."""
    from pyspark.sql import functions as F

    key = ["_hoodie_record_key", "_hoodie_partition_path"]

    def side(df, prefix):
        return df.select(*key, F.col("_hoodie_commit_time").alias(f"{prefix}_t"),
                         F.struct(*[F.col(f"`{c}`") for c in data_columns]).alias(f"{prefix}_row"))

    joined = side(before, "pre").join(side(after, "post"), on=key, how="full_outer")
    pre_t, post_t = F.col("pre_t"), F.col("post_t")
    changed = pre_t.isNull() | post_t.isNull() | (pre_t != post_t)
    preimage = F.when(pre_t.isNotNull() & changed, F.struct(
        F.col("pre_row").alias("row"), F.when(post_t.isNull(), F.lit(DELETE)).otherwise(F.lit(UPDATE_PREIMAGE)).alias("kind"),
        F.coalesce(post_t, F.lit(until)).alias("t")))
    postimage = F.when(post_t.isNotNull() & changed, F.struct(
        F.col("post_row").alias("row"), F.when(pre_t.isNull(), F.lit(INSERT)).otherwise(F.lit(UPDATE_POSTIMAGE)).alias("kind"),
        post_t.alias("t")))
    out = joined.where(changed).select(F.explode(F.array(preimage, postimage)).alias("c")).where(F.col("c").isNotNull())
    return out.select(*[F.col("c.row").getField(c).alias(c) for c in data_columns],
                      F.col("c.kind").alias(CHANGE_TYPE), F.col("c.t").alias(COMMIT_TIME))


def all_inserts(snapshot, data_columns: list[str]):
    """Every row of a snapshot as an insert: the changes since the table was empty."""
    from pyspark.sql import functions as F

    return snapshot.select(*[F.col(f"`{c}`") for c in data_columns], F.lit(INSERT).alias(CHANGE_TYPE),
                           F.col("_hoodie_commit_time").alias(COMMIT_TIME))
