"""`kind: table`: the rows another pipe table's commits wrote since the last consumed instant.

The checkpoint is the upstream instant read up to. When commits after it are no longer on the
upstream's active timeline (archived, or rolled back / restored below it), the changes since
it cannot be told apart any more: the source stops with the command to recover, or, with
`on_checkpoint_lost: full_read`, reads the whole upstream snapshot (idempotent for upserts).

With `changes: true` the source is the upstream's change feed (runtime/table/cdc.py): every
changed record with `_change_type` and its before-image, deletes and moves included."""

from __future__ import annotations

from typing import Any, Mapping

from runtime.sources import Pending, SourceError
from runtime.table.cdc import lost_before_images, lost_before_images_by_completion
from runtime.table.errors import TableError
from runtime.table.timeline import Timeline


class TablePending(Pending):
    def __init__(self, name: str, upstream, since: str | None, until: str | None, commits: int, note: str = "",
                 changes: bool = False, window: tuple[str | None, str] | None = None):
        super().__init__(name, until, commits)
        self.upstream = upstream
        self.since = since
        self.note = note
        self.changes = changes  # the change feed (cdc.py) instead of the rows the commits wrote
        # a Hudi 1.x upstream (timeline layout 2): the completion times (since, until] read
        self.window = window

    def describe(self) -> str:
        if self.is_empty:
            return "no new commits"
        what = "full read" if self.since is None else f"{self.count} new commit{'s' if self.count != 1 else ''}"
        return f"{what} of table {self.upstream.config.name} up to {self.checkpoint}" + (f" ({self.note})" if self.note else "")

    def dataframe(self, spark):
        from runtime.table.table import Table

        upstream = Table(spark, self.upstream.storage, self.upstream.config)  # read in the step's session
        if self.window is not None:
            if self.changes:
                return upstream.read_changes(self.window[0], self.window[1])
            return upstream.read(since=self.window[0], until=self.window[1], meta=False)
        if self.changes:
            return upstream.read_changes(self.since, self.checkpoint)
        if self.since is None:
            return upstream.read(as_of=self.checkpoint, meta=False)
        return upstream.read(since=self.since, until=self.checkpoint, meta=False)


def lost_checkpoint(checkpoint: str, done, table: str, storage=None) -> str | None:
    """Why the changes after `checkpoint` can no longer be read from the completed instants
    `done` of `table`, or None when they can. With the table's `storage`, the message says
    what happened: the instant was rolled back, undone by a restore, or archived, or the
    table was rebuilt (created anew: every instant it has, archived ones included, is later
    than the checkpoint)."""
    if any(i.time == checkpoint for i in done):
        return None
    what = _what_happened(checkpoint, table, storage, done) if storage is not None else None
    if what:
        return what
    if checkpoint > done[-1].time:
        return f"table {table} no longer has instant {checkpoint} (rolled back or restored to {done[-1].time})"
    if checkpoint < done[0].time:
        return f"the commits of table {table} after instant {checkpoint} have been archived (its active timeline starts at {done[0].time})"
    # within the active timeline but gone: rolled back or restored away, and written again since
    return f"table {table} no longer has instant {checkpoint} (rolled back or restored, then written again)"


def _what_happened(checkpoint: str, table: str, storage, done) -> str | None:
    from runtime.table import avro
    from runtime.table.config import TableConfig, read_properties

    try:
        layout = TableConfig.from_properties_map(read_properties(storage)).timeline_layout
    except (FileNotFoundError, KeyError, ValueError):
        layout = 1
    timeline = Timeline.load(storage, layout)
    for inst in reversed(timeline.completed(("rollback", "restore"))):
        try:
            meta = avro.from_bytes(storage.read_bytes(timeline.path(inst)))
        except Exception:  # noqa: BLE001 - written by another tool in a form we do not know
            continue
        undone = meta.get("commitsRollback" if inst.action == "rollback" else "instantsToRollback") or []
        if checkpoint in undone:
            if inst.action == "rollback":
                return f"instant {checkpoint} of table {table} was rolled back (rollback instant {inst.time})"
            return f"table {table} was restored to an earlier commit (restore instant {inst.time}), which undid instant {checkpoint}"
    archived = _archived(storage, layout)
    if any(i.time == checkpoint for i in archived):
        return f"the commits of table {table} after instant {checkpoint} have been archived (its active timeline starts at {done[0].time})"
    first = min([i.time for i in archived] + [i.time for i in timeline.instants], default=None)
    if first is not None and checkpoint < first:
        return (f"table {table} was rebuilt: it was created anew at {first} (by `pipe run --full-refresh` after a change of its key, "
                f"partitioning, type or precombine field), after instant {checkpoint}, so its commits since then cannot be told apart")
    return None


def pending(name: str, config: Mapping[str, Any], upstream, consumer: str, checkpoint: str | None) -> TablePending:
    """`upstream` is the opened upstream Table; `consumer` names the table being written."""
    timeline: Timeline = upstream.timeline()
    if timeline.layout >= 2:
        return _pending_by_completion(name, config, upstream, consumer, checkpoint, timeline)
    if checkpoint and "_" in checkpoint:  # taken when the upstream was Hudi 1.x, downgraded since: its instant time
        checkpoint = checkpoint.split("_", 1)[0]
    done = timeline.completed()
    changes = bool(config.get("changes"))
    if not done:
        return TablePending(name, upstream, checkpoint, None, 0, changes=changes)
    latest = done[-1].time
    if checkpoint is None:
        return TablePending(name, upstream, None, latest, len(done), changes=changes)
    if checkpoint == latest:
        return TablePending(name, upstream, checkpoint, None, 0, changes=changes)
    lost = lost_checkpoint(checkpoint, done, upstream.config.name, upstream.storage)
    if lost is None and changes:
        lost = lost_before_images(upstream.storage, timeline, checkpoint, latest)
        lost = lost and f"table {upstream.config.name}: {lost}"
    if lost:
        if config.get("on_checkpoint_lost") == "full_read":
            return TablePending(name, upstream, None, latest, len(done), note=f"checkpoint lost: {lost}", changes=changes)
        raise SourceError(f"source {name}: {lost}, so the changes since the last run of {consumer} cannot be read",
                          f"rebuild {consumer} from all of {upstream.config.name} with `pipe run --select {consumer} --full-refresh`, "
                          "or set `on_checkpoint_lost: full_read` on the source")
    new = [i for i in done if i.time > checkpoint]
    return TablePending(name, upstream, checkpoint, latest, len(new), changes=changes)


def _token(instant) -> str:
    """The checkpoint of a Hudi 1.x upstream: `<instant time>_<completion time>`, the name of
    its completed instant file, so it says which commit it is and when it completed."""
    return f"{instant.time}_{instant.completed_at}"


def _pending_by_completion(name: str, config: Mapping[str, Any], upstream, consumer: str, checkpoint: str | None,
                           timeline: Timeline) -> TablePending:
    """A Hudi 1.x upstream (timeline layout 2): its commits in the order they completed, as
    Java 1.x's incremental sources read them. The checkpoint is the last consumed commit's
    `<instant>_<completion>`; the next run reads the commits that completed after it, so one
    that started before it but completed later is not skipped. A checkpoint of a version 6
    upstream since upgraded (an instant time alone) is taken at that instant's completion
    time, as Java converts its checkpoints."""
    upstream_name = upstream.config.name
    changes = bool(config.get("changes"))
    done = timeline.completed_after(None)
    if not done:
        return TablePending(name, upstream, checkpoint, None, 0, changes=changes)
    latest = done[-1]
    if checkpoint is None:
        return TablePending(name, upstream, None, _token(latest), len(done), window=(None, latest.completed_at), changes=changes)
    time, _, completion = checkpoint.partition("_")
    found, lost = timeline.find(time), None
    if found is not None and found.is_completed:
        completion = found.completed_at  # also for a version 6 checkpoint (the time alone) of an upgraded table
    elif not completion or not any(i.time == time for i in _archived(upstream.storage, 2)):
        lost = (_what_happened(time, upstream_name, upstream.storage, timeline.completed())
                or f"table {upstream_name} no longer has instant {time}")
    new = timeline.completed_after(completion)
    if lost is None and changes and new:
        lost = lost_before_images_by_completion(upstream.storage, timeline, completion, new[-1].completed_at)
        lost = lost and f"table {upstream_name}: {lost}"
    if lost:
        if config.get("on_checkpoint_lost") == "full_read":
            return TablePending(name, upstream, None, _token(latest), len(done), note=f"checkpoint lost: {lost}",
                                window=(None, latest.completed_at), changes=changes)
        raise SourceError(f"source {name}: {lost}, so the changes since the last run of {consumer} cannot be read",
                          f"rebuild {consumer} from all of {upstream_name} with `pipe run --select {consumer} --full-refresh`, "
                          "or set `on_checkpoint_lost: full_read` on the source")
    if not new:
        return TablePending(name, upstream, checkpoint, None, 0, changes=changes)
    return TablePending(name, upstream, checkpoint, _token(new[-1]), len(new), window=(completion, new[-1].completed_at),
                        changes=changes)


def _archived(storage, layout: int) -> list:
    """The table's archived instants; none when its archived timeline cannot be read (a lost
    checkpoint is then told by what the active timeline says)."""
    from runtime.table.timeline import archived_instants

    try:
        return archived_instants(storage, layout)
    except TableError:
        return []
