"""`kind: files`: a folder or glob of json, csv or parquet files, read incrementally.

The checkpoint never skips a file. Ordering files by modification time alone loses files
when many share one timestamp and a per-run limit cuts between them (apache/hudi#2850), so
the checkpoint is a watermark plus the names of the files consumed near it:

    {"v": 1, "mtime_ms": T, "files": [every consumed file with mtime >= T - WINDOW_MS]}

A file is done when its mtime is older than T - WINDOW_MS or it is listed. New files are taken
oldest first (mtime, then path), so a limit never jumps over an older file. A file that
appears with an mtime more than WINDOW_MS older than the newest file already consumed (a
copy that kept an old timestamp) is not seen: that is the one case the watermark cannot
tell from a consumed file, and the docs say so."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from runtime.sources import Pending, SourceError, columns_ddl, human_bytes, records
from runtime.task_errors import worker_error

WINDOW_MS = 10 * 60 * 1000
CORRUPT = records.CORRUPT
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the source's base folder, with /
    full: str
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class Checkpoint:
    mtime_ms: int
    files: frozenset[str]

    def to_str(self) -> str:
        return json.dumps({"v": 1, "mtime_ms": self.mtime_ms, "files": sorted(self.files)}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None, source: str) -> "Checkpoint | None":
        if text is None:
            return None
        try:
            d = json.loads(text)
            return cls(int(d["mtime_ms"]), frozenset(d["files"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"source {source}: the stored checkpoint {text[:80]!r} is not one pipe wrote",
                              "rebuild the table from all input with `pipe run --full-refresh`") from exc

    def is_done(self, f: FileEntry) -> bool:
        return f.mtime_ms < self.mtime_ms - WINDOW_MS or f.path in self.files


def base_and_pattern(path: str, root: Path) -> tuple[Path, str | None]:
    """The folder to list and the glob (relative to it) the files must match, if any."""
    p = Path(path) if os.path.isabs(path) else root / path
    parts = p.parts
    for i, part in enumerate(parts):
        if _GLOB_CHARS & set(part):
            return Path(*parts[:i]), "/".join(parts[i:])
    return p, None


def list_files(config: Mapping[str, Any], root: Path, source: str) -> list[FileEntry]:
    """Every input file, oldest first. Hidden files and names starting with `_` (`_SUCCESS`,
    `.crc`) are not data, as for Spark's own readers."""
    path = config["path"]
    if str(path).startswith(("s3://", "s3a://")):
        raise SourceError(f"source {source}: path {path} is on S3; a `files` source reads local or mounted folders",
                          "use an `s3_incremental` source fed by S3 event notifications for objects on S3")
    base, pattern = base_and_pattern(path, root)
    if pattern is None and not base.is_dir():
        raise SourceError(f"source {source}: folder {base} does not exist",
                          "create it (and put input files in it) or fix `path` in the source's YAML")
    if pattern is not None:
        found = [Path(f) for f in glob.glob(str(base / pattern), recursive=True)]
    else:
        found = [Path(d) / n for d, dirs, names in os.walk(base) for n in names + [x for x in dirs if os.path.islink(os.path.join(d, x))]]
    entries = []
    for f in found:
        rel = f.relative_to(base).as_posix()
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        _refuse_links(base, rel, source)
        if not f.is_file():
            continue
        st = f.stat()
        entries.append(FileEntry(rel, str(f), st.st_size, int(st.st_mtime * 1000)))
    entries.sort(key=lambda e: (e.mtime_ms, e.path))
    return entries


def _refuse_links(base: Path, rel: str, source: str) -> None:
    """A symbolic link below the source's folder (to a file or a folder, pointing inside it or
    out) stops the run naming it: input is the regular files the folder holds, never what a link
    lets someone else's file stand in for. The folder named by `path` may itself be a link."""
    here = base
    for part in rel.split("/"):
        here = here / part
        if here.is_symlink():
            raise SourceError(f"source {source}: {here} is a symbolic link (to {os.readlink(here)}); a files source reads only "
                              f"the regular files inside its folder {base} and follows no link",
                              "copy or move the file (or folder) itself into the folder, or point the source's `path` at the folder "
                              "the link leads to; nothing was read")


def plan_files(entries: list[FileEntry], checkpoint: Checkpoint | None, max_files: int | None,
               max_bytes: int | None, now_ms: int | None = None) -> tuple[list[FileEntry], list[FileEntry], Checkpoint | None]:
    """(files taken this run, files left waiting, the checkpoint after taking them). `now_ms`
    is the listing time (default: now)."""
    if now_ms is None:
        import time

        now_ms = int(time.time() * 1000)
    new = [e for e in entries if checkpoint is None or not checkpoint.is_done(e)]
    taken: list[FileEntry] = []
    size = 0
    for e in new:
        if max_files is not None and len(taken) >= max_files:
            break
        if max_bytes is not None and taken and size + e.size > max_bytes:
            break
        taken.append(e)
        size += e.size
    if not taken:
        return [], new, checkpoint
    mark = max([e.mtime_ms for e in taken] + ([checkpoint.mtime_ms] if checkpoint else []))
    # a file stamped in the future (a skewed clock) must not carry the watermark past now, or
    # files arriving later with true times would fall behind it
    mark = min(mark, max(now_ms, checkpoint.mtime_ms if checkpoint else 0))
    names = {e.path for e in taken} | (checkpoint.files if checkpoint else frozenset())
    # keep only names the watermark alone cannot vouch for
    recent = {e.path for e in entries if e.path in names and e.mtime_ms >= mark - WINDOW_MS}
    return taken, new[len(taken):], Checkpoint(mark, frozenset(recent))


class FilesPending(Pending):
    def __init__(self, name: str, config: Mapping[str, Any], taken: list[FileEntry], waiting: list[FileEntry],
                 checkpoint: Checkpoint | None, root: Path | None = None):
        super().__init__(name, checkpoint.to_str() if taken else None, len(taken), sum(e.size for e in taken))
        self.config = config
        self.taken = taken
        self.waiting = waiting
        self.root = root

    def describe(self) -> str:
        if not self.taken:
            return "no new files"
        text = f"{self.count} new file{'s' if self.count != 1 else ''} ({human_bytes(self.bytes)})"
        if self.waiting:
            text += f", {len(self.waiting)} more waiting for the next run (per-run limit)"
        return text

    def dataframe(self, spark):
        """The new files as a DataFrame, every value checked against the declared schema."""
        files = [(display_name(e, self.root), e.full) for e in self.taken]
        df, self.rows, self.bad_records, self.bad_samples = read_checked(spark, files, self.config, self.name, "files",
                                                                         records.local_opener, self._cache)
        return df


def display_name(entry: FileEntry, root: Path | None) -> str:
    """A file as the user knows it: relative to the project when it lies inside it."""
    if root is not None:
        try:
            return Path(entry.full).resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return entry.full


def read_checked(spark, files: list[tuple[str, str]], config: Mapping[str, Any], name: str, what: str, opener, cache: list):
    """(DataFrame, rows, bad records left out, samples of them) of `files` ((name shown, locator)
    pairs). JSON and CSV with a declared schema are read as lines by the executors and every
    value is checked (records.py); the rest goes to Spark's own readers."""
    fmt = config["format"]
    options = config.get("options") or {}
    declared = config.get("schema")
    on_bad = config.get("on_bad_record") or "fail"
    if declared and fmt in ("json", "csv"):
        lines = records.line_reader(spark, files, opener, options, fmt)
        ddl = columns_ddl(declared)
        try:
            checked = records.check(records.parse(lines, ddl, fmt, options), [c["name"] for c in declared], name, what, on_bad, cache)
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - Spark's errors on unreadable input
            raise SourceError(f"source {name}: cannot read the {fmt} {what} ({_first_line(exc)})",
                              _read_hint(exc, "check `format`, `options` and `schema` of the source")) from exc
        if checked.missing:
            raise SourceError(f"source {name}: {checked.missing[0]} was removed while the step read it",
                              "run again: files are read once they are complete and stay in place")
        return checked.df, checked.rows, checked.bad, checked.samples
    if declared and fmt == "parquet":
        check_parquet_footers(files, declared, name)
    return read_with_spark(spark, [loc for _, loc in files], config, name, what, cache)


_FAMILIES = (("string", ("string", "varchar", "char", "binary")), ("integer", ("tinyint", "smallint", "int", "bigint")),
             ("floating", ("float", "double")), ("decimal", ("decimal",)), ("boolean", ("boolean",)), ("date", ("date",)),
             ("timestamp", ("timestamp", "timestamp_ntz")))
# file family -> declared families Spark's Parquet reader widens it to
_WIDENS = {"integer": {"floating", "decimal"}, "date": {"timestamp"}}


def _family(spark_type) -> str:
    name = spark_type.simpleString().split("(")[0]
    return next((family for family, names in _FAMILIES if name in names), name)  # nested types: their own name


_INT_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}  # digits of the largest value of each width


def _fits(found, wanted, have: str, want: str) -> bool:
    """Whether Spark's Parquet reader reads a column of type `found` as `wanted` of a kind it
    accepts: an integer only into as wide an integer or a decimal with room for its digits, a
    decimal into one with as many digits on each side of the point, a double not into FLOAT.
    Otherwise Spark fails in the middle of the write, naming no column of the source."""
    f, w = found.simpleString().split("(")[0], wanted.simpleString().split("(")[0]
    if have == want == "integer":
        return _INT_DIGITS[f] <= _INT_DIGITS[w]
    if have == "integer" and want == "decimal":  # by the stored width: INT32 (tinyint to int) or INT64
        return wanted.precision - wanted.scale >= (20 if f == "bigint" else 10)
    if have == want == "decimal":
        return wanted.precision - wanted.scale >= found.precision - found.scale and wanted.scale >= found.scale
    if have == want == "floating":
        return not (f == "double" and w == "float")
    return True


def check_parquet_footers(files: list[tuple[str, str]], declared, name: str) -> None:
    """A Parquet file whose column is of another kind than declared (text where a number is
    declared, ...) stops the step before anything is read, naming file, column and both types.
    Only footers are read, on the driver. Kinds Spark's reader widens (an integer into DOUBLE or
    DECIMAL, a date into TIMESTAMP) pass, and so do sizes within a kind, which Spark checks."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructType

    wanted = StructType.fromDDL(columns_ddl(declared))
    for shown, path in files:
        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # noqa: BLE001 - not Parquet at all
            raise SourceError(f"source {name}: {shown} is not a Parquet file ({_first_line(exc)})",
                              "check `format` and `path` of the source") from exc
        by_name = {n.lower(): i for i, n in enumerate(schema.names)}  # Spark matches names without regard to case
        for f in wanted.fields:
            if f.name.lower() not in by_name:
                continue  # read as null, as Spark does
            try:
                found = from_arrow_type(schema.field(by_name[f.name.lower()]).type)
            except Exception:  # noqa: BLE001 - a type pyspark cannot name: Spark decides when it reads
                continue
            have, want = _family(found), _family(f.dataType)
            if (have != want and want not in _WIDENS.get(have, ())) or not _fits(found, f.dataType, have, want):
                raise SourceError(f"source {name}: {shown}: column {f.name} holds {found.simpleString().upper()} values, but the source "
                                  f"declares {f.dataType.simpleString().upper()}",
                                  "declare the column with the type the files have (and cast it in the SQL), or fix the file; "
                                  "nothing of this source was written and its checkpoint did not move")


def read_with_spark(spark, paths: list[str], config: Mapping[str, Any], name: str, what: str = "objects", cache: list | None = None):
    """(DataFrame, record count, bad records left out, samples) of `paths` read by Spark's reader
    of the source's format: Parquet, JSON or CSV without a declared schema, and s3a:// objects. Malformed records stop the step naming their file, unless
    `on_bad_record: drop`; without line numbers (Spark's readers do not know them)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    fmt = config["format"]
    options = config.get("options") or {}
    reader = spark.read.format(fmt).options(**{k: str(v) for k, v in options.items()})
    if fmt == "csv" and records.option(options, "escape") is None:  # RFC 4180: a quote in a quoted field is doubled
        reader = reader.option("escape", records.csv_quoting(options)[1])
    declared = config.get("schema")
    textual = fmt in ("json", "csv")
    if declared:
        ddl = columns_ddl(declared) + (f", `{CORRUPT}` STRING" if textual else "")
        reader = reader.schema(ddl)
    if textual:
        reader = reader.option("columnNameOfCorruptRecord", CORRUPT).option("mode", "PERMISSIVE")
    try:
        df = reader.load(paths)
    except Exception as exc:  # noqa: BLE001 - Spark's analysis errors: unreadable input
        raise SourceError(f"source {name}: cannot read {fmt} {what} ({_first_line(exc)})",
                          "check `format`, `options` and `schema` of the source") from exc
    if CORRUPT not in df.columns:
        return df, None, 0, []
    data_cols = [c for c in df.columns if c != CORRUPT]
    if not data_cols:
        raise SourceError(f"source {name}: no record of the new {what} could be read as {fmt}",
                          "check the input and the source's `format` and `options`")
    drop = config.get("on_bad_record") == "drop"
    if drop and cache is not None:  # the rows left out must be the rows counted
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        cache.append(df)
    # one pass for the count and the malformed records; the hash of every column makes Spark
    # convert them all (it converts only the columns a query reads)
    every = F.hash(F.lit(0), *[F.col(f"`{f.name}`") for f in df.schema.fields if f.name != CORRUPT and f.dataType.typeName() != "map"])  # hash takes no map
    total, bad, _ = df.select(F.count(F.lit(1)), F.count(F.when(F.col(CORRUPT).isNotNull(), 1)), F.max(every)).first()
    samples: list[str] = []
    if bad:
        rows = (df.select(F.input_file_name().alias("f"), F.col(CORRUPT), every.alias("h")).where(F.col(CORRUPT).isNotNull())
                .limit(3).collect())  # `every` again: the rows found bad above are found with every column converted
        samples = [f"{_short(r['f'])}: {r[CORRUPT].strip()[:120]!r}" for r in rows]
        if not drop:
            raise SourceError(f"source {name}: {bad} malformed record(s) in the new {what}, e.g. {'; '.join(samples)}",
                              f"fix or remove those {what} (or their records) and run again, or set `on_bad_record: drop` on the source; "
                              "nothing of this source was written and its checkpoint did not move")
        df = df.where(F.col(CORRUPT).isNull())
    return df.drop(CORRUPT), int(total) - int(bad), int(bad), samples


def pending(name: str, config: Mapping[str, Any], root: Path, checkpoint_text: str | None) -> FilesPending:
    entries = list_files(config, root, name)
    checkpoint = Checkpoint.parse(checkpoint_text, name)
    taken, waiting, after = plan_files(entries, checkpoint, config.get("max_files_per_run"), config.get("max_bytes_per_run"))
    return FilesPending(name, config, taken, waiting, after, root)


def _read_hint(exc: Exception, default: str) -> str:
    """The hint of a task failure that is not the input's (a package missing on the executors,
    memory), else `default`."""
    failure = worker_error(exc)
    return (failure.hint() if failure is not None else None) or default


def _first_line(exc: Exception) -> str:
    failure = worker_error(exc)  # a task failed: what it raised, not "An exception was thrown from the Python worker"
    if failure is not None:
        return failure.line()[:500]
    text = str(getattr(exc, "desc", None) or exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _short(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri
