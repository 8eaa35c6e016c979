"""Data diffs: what two builds of one table hold, row by row (`pipe diff --data BASE:HEAD`).

`compare` joins the base's and the head's snapshot of a table by record key in Spark, in one
full outer join and one aggregation: rows on each side, keys added, removed, changed and
unchanged, mismatches per column, and a few sample rows of each kind. Only that one row of
aggregates (with the samples) reaches the driver. A table without a record key is compared as
whole rows instead. `compare_inputs` reads, from each side's latest pipe commit, the
upstream instants and source checkpoints it was built from. `parse_gates` and `Gate.tripped`
are the `--fail-on-data` rules. The command line and the outputs are pipe/commands/diff.py's and
pipe/data_diff_output.py's; docs/diff.md ("Data diff") describes what a user sees."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from compiler.errors import PipeError
from runtime.steps.context import stored
from runtime.table.schema import META_COLUMNS

DATA_DIFF_SCHEMA_VERSION = 1
KEY, PARTITION = "_hoodie_record_key", "_hoodie_partition_path"
# Indexes under which a key is unique only within its partition: rows are matched by key and partition.
PARTITION_SCOPED = ("partition", "bucket")
UNCHANGED, CHANGED, ADDED, REMOVED = 0, 1, 2, 3
KINDS = {"added": ADDED, "removed": REMOVED, "changed": CHANGED}
METRICS = ("added_rows", "removed_rows", "changed_rows", "unchanged_rows", "moved_rows", "base_rows", "head_rows")


class DataDiffError(PipeError):
    """A table could not be compared (Spark failed reading or joining it); `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class ColumnDiff:
    """A data column both sides have. `mismatches`: keys on both sides whose values differ
    (null-safe); `rate`: their share of the keys on both sides (None when there are none).
    `reaches`: the downstream columns ("table.column") computed from it (column lineage)."""

    name: str
    mismatches: int
    rate: float | None
    base_type: str
    head_type: str
    reaches: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mismatches": self.mismatches, "rate": self.rate, "base_type": self.base_type,
                "head_type": self.head_type, "reaches": list(self.reaches)}


@dataclass(frozen=True)
class InputChange:
    """An upstream (a table read by ref() or a source) whose read differs between the sides:
    what each side's latest commit read (an instant, or a source's checkpoint; None: not read),
    and the target whose lake a table was read from ("" for a source outside the lake)."""

    name: str
    base: str | None
    head: str | None
    base_from: str
    head_from: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "head": self.head, "base_from": self.base_from, "head_from": self.head_from}


@dataclass(frozen=True)
class Inputs:
    """What each side's latest pipe commit of a table was built from. `same`: every upstream
    read at the same instant (or checkpoint) of the same table; None when a side has no commit
    written by pipe, so it cannot be told. `same_definition`: the step fingerprints agree."""

    same: bool | None
    changes: tuple[InputChange, ...]
    same_definition: bool | None
    base_commit: str | None
    head_commit: str | None
    unknown: str | None = None  # why `same` is None

    def to_dict(self) -> dict[str, Any]:
        return {"same": self.same, "changes": [c.to_dict() for c in self.changes], "same_definition": self.same_definition,
                "base_commit": self.base_commit, "head_commit": self.head_commit, "unknown": self.unknown}


@dataclass(frozen=True)
class TableDataDiff:
    """One table compared. `status`: `compared`, `only_in_base`, `only_in_head` or `in_neither`
    (not built on either side). The counts are None unless compared; `changed_rows` also for a
    table without a record key, whose rows are compared whole (`join_on` empty)."""

    table: str
    status: str
    join_on: tuple[str, ...] = ()
    base_rows: int | None = None
    head_rows: int | None = None
    added_rows: int | None = None
    removed_rows: int | None = None
    changed_rows: int | None = None
    unchanged_rows: int | None = None
    moved_rows: int | None = None  # keys whose partition path changed (when matched by key alone)
    columns: tuple[ColumnDiff, ...] = ()
    added_columns: tuple[str, ...] = ()
    dropped_columns: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    samples: Mapping[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)  # kind -> rows, values as Spark gives them
    inputs: Inputs | None = None

    @property
    def has_differences(self) -> bool:
        if self.status != "compared":
            return self.status != "in_neither"
        return bool(self.added_rows or self.removed_rows or self.changed_rows or self.added_columns or self.dropped_columns)

    def metric(self, name: str) -> int | None:
        """A gate's metric: a count of METRICS, or `mismatch.<column>` (None: not measured here)."""
        if name.startswith("mismatch."):
            col = name.split(".", 1)[1].lower()
            return next((c.mismatches for c in self.columns if c.name.lower() == col), None)
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "status": self.status, "join_on": list(self.join_on),
            "rows": {m[:-5]: getattr(self, m) for m in METRICS},
            "columns": [c.to_dict() for c in self.columns], "added_columns": list(self.added_columns),
            "dropped_columns": list(self.dropped_columns), "notes": list(self.notes),
            "samples": {k: [{c: json_value(v) for c, v in r.items()} for r in rows] for k, rows in self.samples.items()},
            "inputs": self.inputs.to_dict() if self.inputs is not None else None,
        }


# --- comparing the rows ---------------------------------------------------------------------------


def compare(spark, name: str, base, head, partition_scoped: bool = False, samples: int = 5,
            labels: tuple[str, str] = ("base", "head")) -> TableDataDiff:
    """Compares the latest snapshots of two builds of table `name` (runtime.table.Table objects
    opened with `spark`). Rows are matched by record key (its columns, or `_hoodie_record_key`:
    _key_columns), and also by partition when the table's keys are unique only within a
    partition (`partition_scoped`): then a row that changed partition is one removed and one
    added, else one changed (and moved). `labels`: the sides' names, for the notes."""
    notes = list(_definition_notes(base.config, head.config, labels))
    try:
        bdf, hdf = base.read(meta=True), head.read(meta=True)
        bcols = [f for f in bdf.schema.fields if f.name not in META_COLUMNS]
        hcols = [f for f in hdf.schema.fields if f.name not in META_COLUMNS]
        keyed = bool(base.config.record_key_fields) and bool(head.config.record_key_fields)
        if not keyed:
            return _compare_whole_rows(spark, name, bdf, hdf, bcols, hcols, notes, samples, labels)
        key_pairs = _key_columns(base.config, head.config, bcols, hcols, partition_scoped)
        same_parts = [p for p in head.config.partition_fields if p.lower() in {q.lower() for q in base.config.partition_fields}]
        partitions = same_parts if len(same_parts) == len(head.config.partition_fields) == len(base.config.partition_fields) else []
        partitioned = bool(base.config.partition_fields or head.config.partition_fields)
        return _compare_by_key(spark, name, bdf, hdf, bcols, hcols, notes, key_pairs, partitions, partitioned, partition_scoped,
                               samples, labels)
    except PipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark failed: say what we were doing
        from runtime.errors import is_cancellation, spark_message

        if is_cancellation(exc):
            raise
        raise DataDiffError(f"comparing table {name}: {spark_message(exc)}",
                            "run again with --debug for the cause; `pipe show` reads each side") from exc


def _definition_notes(b, h, labels: tuple[str, str]) -> Iterable[str]:
    bl, hl = labels
    if tuple(b.record_key_fields) != tuple(h.record_key_fields):
        yield (f"the record key differs ({bl}: [{', '.join(b.record_key_fields)}], {hl}: [{', '.join(h.record_key_fields)}]): "
               "compared anyway by each row's key text (_hoodie_record_key), which may then match no row")
    if tuple(b.partition_fields) != tuple(h.partition_fields):
        yield (f"the partitioning differs ({bl}: [{', '.join(b.partition_fields)}], {hl}: [{', '.join(h.partition_fields)}]): "
               "compared anyway")


def _columns(bcols, hcols, labels: tuple[str, str]) -> tuple[list[tuple[Any, Any]], list[str], list[str], list[str]]:
    """(common (base field, head field) pairs, columns only in the base, only in the head, notes on
    retyped columns). Columns match by name, case-insensitively (as Spark's names do)."""
    heads = {f.name.lower(): f for f in hcols}
    bases = {f.name.lower() for f in bcols}
    common = [(f, heads[f.name.lower()]) for f in bcols if f.name.lower() in heads]
    notes = []
    for b, h in common:
        if b.dataType != h.dataType:
            how = "by value" if _by_value(b.dataType, h.dataType) else "as text"
            notes.append(f"column {h.name} is {b.dataType.simpleString()} in {labels[0]} and {h.dataType.simpleString()} in {labels[1]}: compared {how}")
    return (common, [f.name for f in bcols if f.name.lower() not in heads], [f.name for f in hcols if f.name.lower() not in bases], notes)


def _by_value(a, b) -> bool:
    from pyspark.sql import types as T

    return a == b or (isinstance(a, T.NumericType) and isinstance(b, T.NumericType))


def _has_map(dt) -> bool:
    from pyspark.sql import types as T

    if isinstance(dt, T.MapType):
        return True
    if isinstance(dt, T.ArrayType):
        return _has_map(dt.elementType)
    if isinstance(dt, T.StructType):
        return any(_has_map(f.dataType) for f in dt.fields)
    return False


def _comparable(F, col, dtype, other):
    """`col` as it is compared with a column of type `other`: itself, or its text when the types
    cannot be compared by value, or JSON when it holds a map (maps have no equality in Spark)."""
    if _has_map(dtype):
        return F.to_json(col)
    if _has_map(other):
        return col.cast("string")
    return col if _by_value(dtype, other) else col.cast("string")


def _bounded_samples(spark) -> bool:
    """Whether Spark's min_by takes `k` (Spark 4.2): samples then come from the aggregation itself."""
    try:
        major, minor = (int(x) for x in re.findall(r"\d+", spark.version)[:2])
    except ValueError:
        return False
    return (major, minor) >= (4, 2)


def _key_columns(bconf, hconf, bcols, hcols, partition_scoped: bool) -> list[tuple[Any, Any]] | None:
    """The (base, head) data columns that identify a row on both sides: the record key fields (and
    the partition fields when keys are unique only within a partition), when both sides declare
    the same ones with the same types. A record key's text and partition path are functions of
    these values, so matching on them matches what `_hoodie_record_key` and
    `_hoodie_partition_path` do, with typed values (cheaper to join, and ordered as numbers and
    times are). None: match on the meta columns instead."""
    def fields(conf) -> list[str]:
        return [f.lower() for f in (*conf.record_key_fields, *(conf.partition_fields if partition_scoped else ()))]

    if fields(bconf) != fields(hconf):
        return None
    bmap, hmap = {f.name.lower(): f for f in bcols}, {f.name.lower(): f for f in hcols}
    pairs = [(bmap.get(n), hmap.get(n)) for n in fields(bconf)]
    if any(b is None or h is None or b.dataType != h.dataType for b, h in pairs):
        return None
    return pairs


def _compare_by_key(spark, name, bdf, hdf, bcols, hcols, notes, key_pairs, partitions, partitioned, partition_scoped, samples,
                    labels) -> TableDataDiff:
    """`key_pairs`: the typed key columns (_key_columns), or None to match on the meta columns.
    `partitions`: the partition fields both sides have, whose change is a move (key_pairs only);
    `partitioned`: a side is partitioned (else nothing moves)."""
    from pyspark.sql import functions as F

    common, dropped, added, retyped = _columns(bcols, hcols, labels)
    bi = {f.name: i for i, f in enumerate(bcols)}
    hi = {f.name: i for i, f in enumerate(hcols)}
    # typed keys are data columns, shuffled once; the meta columns' texts are columns of their own
    meta = [KEY, PARTITION] if partition_scoped else [KEY]
    keys = [h.name for _, h in key_pairs] if key_pairs is not None else meta
    bkeys = [f"__b{bi[b.name]}" for b, _ in key_pairs] if key_pairs is not None else [f"__bk{i}" for i in range(len(meta))]
    hkeys = [f"__h{hi[h.name]}" for _, h in key_pairs] if key_pairs is not None else [f"__hk{i}" for i in range(len(meta))]
    # a move: the partition of a key changed (matched by key alone); told by the partition columns, or the paths
    by_path = not partition_scoped and key_pairs is None and partitioned
    b = bdf.select(*([F.col(k).alias(f"__bk{i}") for i, k in enumerate(meta)] if key_pairs is None else []), F.lit(True).alias("__in_b"),
                   *([F.col(PARTITION).alias("__bp")] if by_path else []),
                   *[F.col(f"`{f.name}`").alias(f"__b{i}") for i, f in enumerate(bcols)])
    h = hdf.select(*([F.col(k).alias(f"__hk{i}") for i, k in enumerate(meta)] if key_pairs is None else []), F.lit(True).alias("__in_h"),
                   *([F.col(PARTITION).alias("__hp")] if by_path else []),
                   *[F.col(f"`{f.name}`").alias(f"__h{i}") for i, f in enumerate(hcols)])
    # A record key of one field is never null (Hudi refuses the row); a part of a composite key
    # may be (its text says __null__): those are matched null-safe.
    on = [F.col(x) == F.col(y) if len(keys) == 1 else F.col(x).eqNullSafe(F.col(y)) for x, y in zip(bkeys, hkeys)]
    joined = b.join(h, on=_all(on), how="full_outer")
    in_b, in_h = F.col("__in_b").isNotNull(), F.col("__in_h").isNotNull()
    both = in_b & in_h
    diffs = [both & ~_comparable(F, F.col(f"__b{bi[bf.name]}"), bf.dataType, hf.dataType)
             .eqNullSafe(_comparable(F, F.col(f"__h{hi[hf.name]}"), hf.dataType, bf.dataType)) for bf, hf in common]
    parts = {p.lower() for p in partitions}
    moved_by = [i for i, (_, hf) in enumerate(common) if hf.name.lower() in parts] if not partition_scoped and not by_path else []
    key_values = [F.coalesce(F.col(x), F.col(y)).alias(k) for x, y, k in zip(bkeys, hkeys, keys)]
    flagged = joined.select(*key_values, "*", *[d.alias(f"__d{i}") for i, d in enumerate(diffs)])
    changed = _any([F.col(f"__d{i}") for i in range(len(diffs))])
    moved = (both & ~F.col("__bp").eqNullSafe(F.col("__hp"))) if by_path else _any([F.col(f"__d{i}") for i in moved_by]) if moved_by else None
    kind = F.when(~in_b, ADDED).when(~in_h, REMOVED).when(changed, CHANGED).otherwise(UNCHANGED)
    key_struct = [F.col(f"`{k}`") for k in keys]
    sample_of = {
        "added": F.struct(*([] if key_pairs else key_struct), *[F.col(f"__h{i}").alias(f.name) for i, f in enumerate(hcols)]),
        "removed": F.struct(*([] if key_pairs else key_struct), *[F.col(f"__b{i}").alias(f.name) for i, f in enumerate(bcols)]),
        "changed": F.struct(*key_struct, *[F.col(f"__d{i}").alias(f"d{i}") for i in range(len(common))],
                            *[F.col(f"__b{bi[bf.name]}").alias(f"b{i}") for i, (bf, _) in enumerate(common)],
                            *[F.col(f"__h{hi[hf.name]}").alias(f"h{i}") for i, (_, hf) in enumerate(common)]),
    }
    order = key_struct[0] if len(keys) == 1 else F.struct(*key_struct)
    bounded = samples > 0 and _bounded_samples(spark)
    # What the aggregation reads, narrow: each row's kind and flags, and for a row that is no
    # unchanged one its sample with its key (the sort order); an unchanged row carries nulls.
    # Each sample column is read twice below (value and order), so Spark keeps this projection
    # in the join's generated code rather than moving the struct into the aggregation, which
    # (min_by with k has no generated code) would copy every column of every row into it.
    narrow = flagged.select(kind.alias("__kind"), *[F.col(f"__d{i}") for i in range(len(diffs))],
                            *([moved.alias("__moved")] if moved is not None else []),
                            *([F.when(kind == KINDS[kd], F.struct(order.alias("o"), s.alias("v"))).alias(f"__s_{kd}")
                               for kd, s in sample_of.items()] if bounded else []))
    k = F.col("__kind")
    aggs = [F.count_if(k != ADDED).alias("base_rows"), F.count_if(k != REMOVED).alias("head_rows"),
            F.count_if(k == ADDED).alias("added"), F.count_if(k == REMOVED).alias("removed"),
            F.count_if(k == CHANGED).alias("changed"), F.count_if(k == UNCHANGED).alias("unchanged")]
    aggs += [F.count_if(F.col("__moved")).alias("moved")] if moved is not None else []
    aggs += [F.count_if(F.col(f"__d{i}")).alias(f"m{i}") for i in range(len(common))]
    if bounded:  # the samples come with the counts, from the same pass: the rows of smallest keys of each kind
        aggs += [F.min_by(F.col(f"__s_{kd}.v"), F.col(f"__s_{kd}.o"), samples).alias(f"s_{kd}") for kd in sample_of]
    row = narrow.agg(*aggs).collect()[0]
    picked: dict[str, list] = {}
    for kd, s in sample_of.items():
        if samples <= 0 or not row[kd]:
            picked[kd] = []
        elif bounded:
            picked[kd] = list(row[f"s_{kd}"] or [])
        else:  # an older Spark: one more job per kind with rows, ordered and limited in Spark
            picked[kd] = [r[0] for r in flagged.filter(kind == KINDS[kd]).orderBy(order).select(s).limit(samples).collect()]
    both_rows = row["changed"] + row["unchanged"]
    columns = tuple(ColumnDiff(hf.name, row[f"m{i}"], (row[f"m{i}"] / both_rows) if both_rows else None,
                               bf.dataType.simpleString(), hf.dataType.simpleString()) for i, (bf, hf) in enumerate(common))
    if partition_scoped:
        notes.append("keys are unique within a partition (index: partition or bucket): rows are matched by key and partition, "
                     "so a row that changed partition counts as removed and added")
    if key_pairs is None:
        notes.append(f"rows are matched by {' and '.join(keys)}: the sides do not declare the same key columns with the same types")
    return TableDataDiff(
        table=name, status="compared", join_on=tuple(keys), base_rows=row["base_rows"], head_rows=row["head_rows"],
        added_rows=row["added"], removed_rows=row["removed"], changed_rows=row["changed"], unchanged_rows=row["unchanged"],
        moved_rows=row["moved"] if moved is not None else None, columns=columns, added_columns=tuple(added),
        dropped_columns=tuple(dropped), notes=tuple(notes + retyped),
        samples={"added": tuple(_row(r) for r in picked["added"]), "removed": tuple(_row(r) for r in picked["removed"]),
                 "changed": tuple(_changed_row(r, keys, common) for r in picked["changed"])},
    )


def _any(cols):
    from functools import reduce

    from pyspark.sql import functions as F

    return reduce(lambda a, b: a | b, cols) if cols else F.lit(False)


def _all(cols):
    from functools import reduce

    return reduce(lambda a, b: a & b, cols) if len(cols) > 1 else cols[0]


def _row(r) -> dict[str, Any]:
    return r.asDict(recursive=True)


def _changed_row(r, keys: list[str], common) -> dict[str, Any]:
    """A changed row's sample: its key, and `{"base": ..., "head": ...}` for each differing column."""
    d = r.asDict(recursive=True)
    out: dict[str, Any] = {k: d[k] for k in keys}
    for i, (_, hf) in enumerate(common):
        if d[f"d{i}"]:
            out[hf.name] = {"base": d[f"b{i}"], "head": d[f"h{i}"]}
    return out


def json_value(v: Any) -> Any:
    """A sample's value as JSON holds it: numbers, text and booleans as they are, a changed
    column's {"base", "head"} pair as such, anything else (decimals, timestamps, ...) as text."""
    from runtime.errors import sample

    if isinstance(v, dict) and set(v) == {"base", "head"}:
        return sample(v)
    return sample({"v": v})["v"]


def _compare_whole_rows(spark, name, bdf, hdf, bcols, hcols, notes, samples, labels) -> TableDataDiff:
    """A table without a record key: its rows are compared whole, as multisets of the columns both
    sides have. A row only in the head is added, one only in the base removed; a changed row is
    one of each (there is no key to pair them)."""
    from pyspark.sql import functions as F

    common, dropped, added, retyped = _columns(bcols, hcols, labels)
    if not common:
        raise DataDiffError(f"table {name} has no record key and no column in common between {labels[0]} and {labels[1]}: nothing to compare")
    notes.append("the table has no record key: rows are compared whole (over the columns both sides have); "
                 "a changed row counts as one removed and one added")
    b = bdf.select(*[_comparable(F, F.col(f"`{bf.name}`"), bf.dataType, hf.dataType).alias(f"__c{i}") for i, (bf, hf) in enumerate(common)],
                   F.lit(1).alias("__nb"), F.lit(0).alias("__nh"))
    h = hdf.select(*[_comparable(F, F.col(f"`{hf.name}`"), hf.dataType, bf.dataType).alias(f"__c{i}") for i, (bf, hf) in enumerate(common)],
                   F.lit(0).alias("__nb"), F.lit(1).alias("__nh"))
    cols = [f"__c{i}" for i in range(len(common))]
    groups = b.unionByName(h).groupBy(*cols).agg(F.sum("__nb").alias("nb"), F.sum("__nh").alias("nh"))
    nb, nh = F.col("nb"), F.col("nh")
    row_of = F.struct(*[F.col(c).alias(hf.name) for c, (_, hf) in zip(cols, common)])
    order = F.xxhash64(*cols)
    aggs = [F.sum(nb).alias("base_rows"), F.sum(nh).alias("head_rows"), F.sum(F.greatest(nh - nb, F.lit(0))).alias("added"),
            F.sum(F.greatest(nb - nh, F.lit(0))).alias("removed"), F.sum(F.least(nb, nh)).alias("unchanged")]
    bounded = samples > 0 and _bounded_samples(spark)
    if bounded:
        aggs += [F.min_by(F.when(nh > nb, row_of), F.when(nh > nb, order), samples).alias("s_added"),
                 F.min_by(F.when(nb > nh, row_of), F.when(nb > nh, order), samples).alias("s_removed")]
    row = groups.agg(*aggs).collect()[0]
    picked = {}
    for kd, cond in (("added", nh > nb), ("removed", nb > nh)):
        if samples <= 0 or not row[kd]:
            picked[kd] = []
        elif bounded:
            picked[kd] = list(row[f"s_{kd}"] or [])
        else:
            picked[kd] = [r[0] for r in groups.filter(cond).orderBy(order).select(row_of).limit(samples).collect()]
    return TableDataDiff(
        table=name, status="compared", join_on=(), base_rows=row["base_rows"] or 0, head_rows=row["head_rows"] or 0,
        added_rows=row["added"] or 0, removed_rows=row["removed"] or 0, changed_rows=None, unchanged_rows=row["unchanged"] or 0,
        added_columns=tuple(added), dropped_columns=tuple(dropped), notes=tuple(notes + retyped),
        samples={"added": tuple(_row(r) for r in picked["added"]), "removed": tuple(_row(r) for r in picked["removed"]), "changed": ()},
    )


# --- what each side was built from -----------------------------------------------------------------


def compare_inputs(base, head, targets: tuple[str, str], lake_reads: Iterable[str], lakes: Mapping[str, str]) -> Inputs:
    """Whether the latest pipe commits of the base's and the head's table read the same inputs
    (runtime.steps.context.stored: each input's checkpoint, and the target a deferred one was
    read from). `targets`: (base target, head target). `lake_reads`: the upstream names read
    from the side's own lake (tables, and `kind: table` sources): such a read is the same input
    on both sides when it is of the same target's table (or of two targets with one lake) at
    the same instant; a run with `--defer T` read it from T's lake. Any other source's
    checkpoint is compared as text. `lakes`: target name -> its lake, where known."""
    b, h = stored(base), stored(head)
    for side, s in zip(targets, (b, h)):
        if s.fingerprint is None and not s.checkpoints:
            return Inputs(None, (), None, b.based_on, h.based_on, unknown=f"the latest commit in {side} was not written by pipe")
    reads = set(lake_reads)

    def read(s, target: str) -> dict[str, tuple[str, str]]:
        return {n: (v, s.deferred.get(n) or (target if n in reads else "")) for n, v in s.checkpoints.items()}

    def same_place(x: str, y: str) -> bool:
        return x == y or (x in lakes and y in lakes and lakes[x] == lakes[y])

    b_reads, h_reads = read(b, targets[0]), read(h, targets[1])
    changes = []
    for n in sorted(set(b_reads) | set(h_reads)):
        (bv, bw), (hv, hw) = b_reads.get(n, (None, "")), h_reads.get(n, (None, ""))
        if bv != hv or not same_place(bw, hw):
            changes.append(InputChange(n, bv, hv, bw, hw))
    bf, hf = b.fingerprint, h.fingerprint
    return Inputs(not changes, tuple(changes), (bf == hf) if bf and hf else None, b.based_on, h.based_on)


# --- gates ----------------------------------------------------------------------------------------

_GATE = re.compile(r"^\s*(?P<metric>[A-Za-z_]+(?:\.[^\s<>=!]+)?)\s*(?P<op>>=|<=|==|!=|=|>|<)\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<pct>%?)\s*$")
_OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
        "==": lambda a, b: a == b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b}


@dataclass(frozen=True)
class Gate:
    """`METRIC OP VALUE[%]`: METRIC one of METRICS or `mismatch.<column>`; a value with `%` is that
    share of the table's base rows."""

    text: str
    metric: str
    op: str
    value: float
    percent: bool

    def limit(self, d: TableDataDiff) -> float:
        return self.value * (d.base_rows or 0) / 100 if self.percent else self.value

    def tripped(self, d: TableDataDiff) -> str | None:
        """Why the gate trips on table `d`, or None (a table not compared, or without the metric)."""
        if d.status != "compared":
            return None
        got = d.metric(self.metric)
        if got is None:
            return None
        limit = self.limit(d)
        if not _OPS[self.op](got, limit):
            return None
        of = f" ({self.value:g}% of {d.base_rows:,} base rows = {limit:,.1f})" if self.percent else ""
        return f"{d.table}: {self.metric} {got:,} {self.op} {self.value:g}{'%' if self.percent else ''}{of}"

    def to_dict(self) -> dict[str, Any]:
        return {"expression": self.text, "metric": self.metric, "op": self.op, "value": self.value, "percent": self.percent}


class GateError(ValueError):
    """An expression of --fail-on-data that cannot be read; the message says why."""


def parse_gates(texts: Iterable[str]) -> list[Gate]:
    """The gates of `--fail-on-data` (each option may hold several, separated by commas)."""
    out = []
    for text in texts:
        for part in text.split(","):
            if not part.strip():
                continue
            m = _GATE.match(part)
            if m is None:
                raise GateError(f"cannot read {part.strip()!r}: write METRIC OP NUMBER or METRIC OP PERCENT%, e.g. `changed_rows > 1%`")
            metric = m["metric"]
            if metric not in METRICS and not (metric.startswith("mismatch.") and len(metric) > len("mismatch.")):
                raise GateError(f"unknown metric {metric!r} in {part.strip()!r}: use {', '.join(METRICS)} or mismatch.<column>")
            out.append(Gate(part.strip(), metric, m["op"], float(m["value"]), bool(m["pct"])))
    return out


def tripped(gates: Iterable[Gate], diffs: Iterable[TableDataDiff]) -> list[str]:
    return [why for g in gates for d in diffs if (why := g.tripped(d)) is not None]


@dataclass(frozen=True)
class DataDiff:
    """Every selected table of a `pipe diff --data BASE:HEAD`, and the gates it was asked for."""

    base: str
    head: str
    tables: tuple[TableDataDiff, ...]
    gates: tuple[Gate, ...] = ()

    @property
    def failures(self) -> list[str]:
        return tripped(self.gates, self.tables)

    def counts(self) -> dict[str, int]:
        out = {"compared": 0, "different": 0, "only_in_base": 0, "only_in_head": 0, "in_neither": 0}
        for t in self.tables:
            out[t.status] += 1
            out["different"] += t.status == "compared" and t.has_differences
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"data_diff_schema_version": DATA_DIFF_SCHEMA_VERSION, "base": self.base, "head": self.head,
                "summary": self.counts(), "tables": [t.to_dict() for t in self.tables],
                "gates": [g.to_dict() for g in self.gates], "failures": self.failures}
