"""Typed records from JSON or CSV text, every value checked against the source's declared schema.

`files` and `s3_incremental` sources read their files or objects as text lines inside the
executors (`line_reader`), numbering the lines of each file, then `parse` turns each line (each
record of a multiLine JSON document) into typed columns twice: with the declared types and with
every column as a string. A value present as text but null once typed did not convert: the
record is bad, and `check` stops the step naming file, line, column and value (or, with
`on_bad_record: drop`, leaves the record out and counts it). JSON null and an empty CSV field
are nulls, not bad values; an empty JSON string is bad for a non-string column, as for Spark. Only counts and a few sample records reach the driver;
the checked rows are persisted, so the files are read once for the check and the write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from runtime.spark import api as spark_api
from runtime.sources import SourceError

FILE, LINE_NO, RECORD_NO, TEXT, IS_HEADER, MISSING = "_pipe_file", "_pipe_line", "_pipe_record", "_pipe_text", "_pipe_is_header", "_pipe_missing"
PROBLEM = "_pipe_problem"
DECODE_PROBLEM = "_pipe_decode_problem"  # why a reader could not decode a record before parsing (a message that is no change event)
CORRUPT = "_pipe_corrupt_record"
LINES_DDL = f"`{FILE}` STRING, `{LINE_NO}` BIGINT, `{TEXT}` STRING, `{IS_HEADER}` BOOLEAN, `{MISSING}` STRING"
SAMPLES = 5  # bad records named in a message
_BATCH_LINES = 50_000
_COMPRESSED = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
# options of Spark's file readers that are about files, not about parsing one record
_FILE_OPTIONS = ("multiline", "header", "inferschema", "encoding", "charset", "linesep", "samplingratio", "pathglobfilter",
                 "recursivefilelookup", "modifiedbefore", "modifiedafter", "compression")


def option(options: Mapping[str, Any], name: str) -> str | None:
    """A reader option's value, its name matched without regard to case (as Spark does)."""
    for k, v in options.items():
        if k.lower() == name.lower():
            return str(v).lower() if isinstance(v, bool) else str(v)
    return None


def flag(options: Mapping[str, Any], name: str) -> bool:
    return (option(options, name) or "").lower() == "true"


# --- reading lines in the executors ----------------------------------------------------------------


def split_text(body: bytes, name: str, whole: bool, header: bool, encoding: str | None, line_sep: str | None):
    """(line numbers, texts (large_string), is_header) of the non-blank lines of a file, as Arrow arrays, numbered
    as an editor does (from 1, blank lines counted). `whole`: the file is one record (multiLine
    JSON). Splitting and filtering run in Arrow's C++ kernels."""
    import io

    parts = list(split_stream(io.BytesIO(body), name, whole, header, encoding, line_sep))
    if len(parts) == 1:
        return parts[0]
    import pyarrow as pa

    return tuple(pa.concat_arrays([p[i] for p in parts]) if parts else pa.array([], t)
                 for i, t in enumerate((pa.int64(), pa.large_string(), pa.bool_())))


CHUNK_BYTES = 32 * 1024 * 1024  # a file is read in pieces of this size: memory stays bounded however large it is


def split_stream(stream, name: str, whole: bool, header: bool, encoding: str | None, line_sep: str | None,
                 chunk_bytes: int = CHUNK_BYTES, quoting: tuple[str, str] | None = None) -> Iterator[tuple]:
    """split_text of a binary stream, read and decompressed `chunk_bytes` at a time: one
    (line numbers, texts, is_header) triple per piece, lines cut only at their separator and
    numbered across pieces. A `whole` file (one multiLine JSON record) is read at once.
    `quoting` ((quote, escape) of a multiLine CSV): a line break inside a quoted field does not
    end the record; the record is numbered by its first line. Bytes not valid in the encoding
    become INVALID, which `parse` reports as a bad record."""
    import codecs
    import pyarrow as pa

    _register_invalid_marker()

    for suffix, module in _COMPRESSED.items():
        if name.endswith(suffix):
            stream = {"gzip": lambda f: __import__("gzip").GzipFile(fileobj=f), "bz2": lambda f: __import__("bz2").BZ2File(f),
                      "lzma": lambda f: __import__("lzma").LZMAFile(f)}[module](stream)
            break
    decoder = codecs.getincrementaldecoder(codecs.lookup(encoding).name if encoding else "utf-8")(errors=_INVALID_HANDLER)
    sep = line_sep or "\n"
    carry, first_line, started, header_left = "", 1, False, header
    while True:
        chunk = stream.read(-1 if whole else chunk_bytes)
        final = whole or not chunk
        text = decoder.decode(chunk or b"", final=final)
        if not started and text:
            started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        text = carry + text
        if whole:
            texts = pa.array([text] if text.strip() else [], pa.large_string())
            yield _numbered(texts, 1, header_left)
            return
        if not final:
            cut = text.rfind(sep)
            if cut < 0:  # no line ends in this piece yet
                carry = text
                continue
            text, carry = text[:cut], text[cut + len(sep):]
            if quoting is not None:  # a record still open at the cut waits for the next piece
                start = _open_record_start(text, sep, *quoting)
                if start is not None:
                    text, carry = text[:max(0, start - len(sep))], text[start:] + sep + carry
                    if start == 0:
                        continue
        nums, texts, heads = _lines(text, first_line, line_sep, header_left, quoting)
        first_line += text.count(sep) + 1
        header_left = header_left and len(texts) == 0
        yield nums, texts, heads
        if final:
            return


def _lines(text: str, first_line: int, line_sep: str | None, header: bool, quoting: tuple[str, str] | None = None):
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = pc.split_pattern(pa.array([text], pa.large_string()), pattern=line_sep or "\n").flatten()
    numbers = None
    if quoting is not None:  # a \r\n inside a quoted field is kept
        numbers, texts = _joined_records(texts, first_line, line_sep or "\n", *quoting)
    if not line_sep:
        texts = pc.utf8_rtrim(texts, characters="\r")  # records end at \n or \r\n, as for Spark
    return _numbered(texts, first_line, header, numbers)


INVALID = "\U0010fffe"  # stands for bytes not valid in the file's encoding (a noncharacter: never in real text)
_INVALID_HANDLER = "pipe-invalid-bytes"


def _register_invalid_marker() -> None:
    import codecs

    try:
        codecs.lookup_error(_INVALID_HANDLER)
    except LookupError:
        codecs.register_error(_INVALID_HANDLER, lambda exc: (INVALID, exc.end))


def _quote_counts(lines: list[str], quote: str, escape: str) -> list[int]:
    """Quote characters of each line that open or close a quoted field: an escaped quote
    (`\\"` when the escape is not the quote) counts for none; a doubled one (`""`) for two."""
    if escape and escape != quote:
        return [line.count(quote) - line.count(escape + quote) for line in lines]
    return [line.count(quote) for line in lines]


def _open_record_start(text: str, sep: str, quote: str, escape: str) -> int | None:
    """The offset in `text` of the record its last line leaves open (an odd number of quotes
    since its start), or None when every record in it is closed."""
    lines = text.split(sep)
    open_, start, offset = False, 0, 0
    for line, n in zip(lines, _quote_counts(lines, quote, escape)):
        if not open_:
            start = offset
        open_ = open_ != (n % 2 == 1)
        offset += len(line) + len(sep)
    return start if open_ else None


def _joined_records(texts, first_line: int, sep: str, quote: str, escape: str):
    """(first line numbers, records) of multiLine CSV lines: a line that ends inside a quoted
    field continues on the next (joined with the separator), the record numbered by its first line."""
    import pyarrow as pa

    lines = texts.to_pylist()
    counts = _quote_counts(lines, quote, escape)
    if all(n % 2 == 0 for n in counts):
        return None, texts
    nums, out, open_ = [], [], False
    for i, (line, n) in enumerate(zip(lines, counts)):
        if open_:
            out[-1] += sep + line
        else:
            nums.append(first_line + i)
            out.append(line)
        open_ = open_ != (n % 2 == 1)
    return nums, pa.array(out, pa.large_string())


def _numbered(texts, first_line: int, header: bool, numbers: list[int] | None = None):
    """Line numbers from `first_line` (or `numbers`), blank lines left out, the first kept line the header."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    nums = pa.array(numbers, pa.int64()) if numbers is not None else pa.array(np.arange(first_line, first_line + len(texts), dtype=np.int64))
    keep = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0)
    nums, texts = nums.filter(keep), texts.filter(keep)
    heads = np.zeros(len(texts), dtype=bool)
    if header and len(texts):
        heads[0] = True
    return nums, texts, pa.array(heads)


def read_lines(opener: Callable[[], Callable[[str], Any]], whole: bool, header: bool, encoding: str | None,
               line_sep: str | None, batches: Iterator, quoting: tuple[str, str] | None = None) -> Iterator:
    """mapInArrow: (name, locator) rows in, (file, line number, text, is_header, missing) out.
    `opener()` is called once per task and returns a function opening one file by its locator
    as a binary stream (None when the file is gone); the file is read in pieces."""
    import pyarrow as pa

    schema = pa.schema([(FILE, pa.string()), (LINE_NO, pa.int64()), (TEXT, pa.string()), (IS_HEADER, pa.bool_()), (MISSING, pa.string())])
    open_file = opener()
    for batch in batches:
        for name, locator in zip(batch.column("name").to_pylist(), batch.column("locator").to_pylist()):
            stream = open_file(locator)
            if stream is None:
                yield pa.RecordBatch.from_arrays([pa.array([name]), pa.nulls(1, pa.int64()), pa.nulls(1, pa.string()), pa.array([False]), pa.array([name])],
                                                 schema=schema)
                continue
            try:
                pieces = _naming_file(name, split_stream(stream, name, whole, header, encoding, line_sep, quoting=quoting))
                for nums, texts, heads in pieces:
                    for start in range(0, len(texts), _BATCH_LINES):  # bounded batches: a big file stays under Arrow's 2 GB strings
                        n = min(_BATCH_LINES, len(texts) - start)
                        yield pa.RecordBatch.from_arrays([pa.array([name] * n, pa.string()), nums.slice(start, n), texts.slice(start, n).cast(pa.string()),
                                                          heads.slice(start, n), pa.nulls(n, pa.string())], schema=schema)
            finally:
                stream.close()


def _naming_file(name: str, pieces: Iterator) -> Iterator:
    """`pieces`, with a failure to read them (a damaged compressed file, an I/O error) raised as a
    SourceError that names the file: the driver reports it in one line (runtime/task_errors.py)."""
    import zlib

    from runtime.sources import SourceError

    try:
        yield from pieces
    except (OSError, EOFError, ValueError, UnicodeError, zlib.error) as exc:
        said = (str(exc).splitlines() or [""])[0]
        raise SourceError(f"{name}: {type(exc).__name__}" + (f": {said}" if said else "")) from exc


def line_reader(spark, files: list[tuple[str, str]], opener, options: Mapping[str, Any], fmt: str):
    """The lines of `files` ((name shown to users, locator) pairs) as a DataFrame, read by the
    executors with `opener`, a task spreading the files in turns."""
    whole = fmt == "json" and flag(options, "multiLine")
    header = fmt == "csv" and flag(options, "header")
    encoding = option(options, "encoding") or option(options, "charset")
    line_sep = option(options, "lineSep")
    quoting = csv_quoting(options) if fmt == "csv" and flag(options, "multiLine") and csv_quoting(options)[0] else None
    parallelism = max(1, min(len(files), spark_api.default_parallelism(spark) * 2))
    listing = spark.createDataFrame(files, "name STRING, locator STRING").repartition(parallelism)
    return listing.mapInArrow(lambda it: read_lines(opener, whole, header, encoding, line_sep, it, quoting), LINES_DDL)


JSON_MAX_STRING_LEN = 20_000_000  # Spark's JSON option maxStringLen (Jackson's StreamReadConstraints) by default


def encoding_name(options: Mapping[str, Any]) -> str:
    """The encoding files are read in, as users name it (the source's `encoding`, else UTF-8)."""
    return option(options, "encoding") or option(options, "charset") or "UTF-8"


def csv_quoting(options: Mapping[str, Any]) -> tuple[str, str]:
    """(quote, escape) of a CSV source: RFC 4180's `"` and `""` unless its options say otherwise."""
    quote = option(options, "quote")
    quote = '"' if quote is None else quote
    escape = option(options, "escape")
    return quote, quote if escape is None else escape


def read_local(locator: str):
    """The file as a binary stream, or None when it is gone."""
    try:
        return open(locator, "rb")
    except FileNotFoundError:
        return None


def local_opener():
    return read_local


# --- parsing and checking ----------------------------------------------------------------------------


def parse_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The reader options that apply to one record (from_json / from_csv)."""
    out = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in options.items() if k.lower() not in _FILE_OPTIONS}
    out["mode"] = "PERMISSIVE"  # never empty: Spark prunes the schema of an option-less from_json per field read
    return out


def parse(lines, ddl: str, fmt: str, options: Mapping[str, Any], keep: tuple[str, ...] = (), with_text: bool = False,
          arrays: bool = True):
    """Typed columns of each record of `lines` plus FILE, LINE_NO, RECORD_NO and PROBLEM (why
    the record does not fit the schema, or null), and the columns of `lines` named in `keep`
    (a Kafka message's topic, partition, offset), as they are. A DECODE_PROBLEM column among
    `keep` is the record's problem when set. `with_text`: TEXT too (a dead-letter table keeps it).
    `arrays`: a JSON line may be an array of records (False: each line is one, as the text pipe's
    own decoders make)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    fields = StructType.fromDDL(ddl).fields
    opts = parse_options(options)
    quote, escape = csv_quoting(options) if fmt == "csv" else ("", "")
    if fmt == "csv" and option(options, "escape") is None:  # RFC 4180 (Python's csv, Excel): `""` in a quoted field
        opts["escape"] = escape
    typed_opts = {**opts, "columnNameOfCorruptRecord": CORRUPT}
    body = lines.where(~F.col(IS_HEADER))  # a file gone (MISSING) keeps its one row, to be counted
    comment = option(options, "comment") if fmt == "csv" else None
    if comment:  # Spark's CSV reader skips comment lines
        body = body.where(F.col(TEXT).isNull() | ~F.col(TEXT).startswith(comment))
    if fmt == "json" and arrays:
        # a line (a multiLine document) holds one record or an array of them, as for Spark's
        # reader; each element's own JSON text is a record, named by its position
        is_array = F.ltrim(F.col(TEXT)).startswith("[")
        elements = F.from_json(F.col(TEXT), "array<string>", opts)
        records = F.when(is_array & elements.isNotNull(), elements).otherwise(F.array(F.col(TEXT)))
        body = body.select(FILE, MISSING, LINE_NO, is_array.alias("a"), F.posexplode(records).alias(RECORD_NO, TEXT), *keep)
        whole = flag(options, "multiLine")
        body = body.select(FILE, MISSING, (F.lit(None).cast("bigint") if whole else F.col(LINE_NO)).alias(LINE_NO),
                           F.when(F.lit(whole) | F.col("a"), F.col(RECORD_NO) + 1).cast("bigint").alias(RECORD_NO), TEXT, *keep)
    else:
        body = body.select(FILE, MISSING, LINE_NO, F.lit(None).cast("bigint").alias(RECORD_NO), TEXT, *keep)
    with_corrupt = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields) + f", `{CORRUPT}` STRING"
    # as text: one more column than declared tells a CSV row with too many fields
    extra = "_pipe_extra_field"
    as_text = ", ".join(f"`{f.name}` STRING" for f in fields) + (f", `{extra}` STRING" if fmt == "csv" else f", `{CORRUPT}` STRING")
    parser = F.from_json if fmt == "json" else F.from_csv
    typed = body.select(FILE, MISSING, LINE_NO, RECORD_NO, TEXT, parser(F.col(TEXT), with_corrupt, typed_opts).alias("t"), *keep)
    # a value that fails to convert marks the record corrupt: only those are parsed once more, as text
    failed = F.col("t").isNull() | F.col("t").getField(CORRUPT).isNotNull()
    both = typed.select("*", F.when(failed, parser(F.col(TEXT), as_text, typed_opts if fmt == "json" else opts)).alias("s"))
    checks = []
    for f in fields:
        if f.dataType.simpleString() == "string":
            continue  # every value is a string
        raw, typed = F.col("s").getField(f.name), F.col("t").getField(f.name)
        shown = F.concat(F.lit('"'), F.substring(raw, 1, 60), F.when(F.length(raw) > 60, F.lit('…"')).otherwise(F.lit('"')))
        checks.append(F.when(raw.isNotNull() & typed.isNull(),
                             F.concat(F.lit(f"column {f.name}: "), shown, F.lit(f" is not {_a(f.dataType.simpleString().upper())}"))))
    text = F.substring(F.regexp_replace(F.col(TEXT), INVALID, "\ufffd"), 1, 80)
    corrupt = F.col("t").getField(CORRUPT).isNotNull() | F.col("t").isNull()
    first = []  # problems that explain the others: they come before a value's
    if fmt == "csv":
        n = len(fields)
        quoting = "; quoting is the likely cause: "
        structural = F.when(F.col("s").getField(extra).isNotNull(), F.concat(F.lit(f"more fields than the {n} declared{quoting}"), text)) \
            .otherwise(F.concat(F.lit(f"fewer fields than the {n} declared{quoting}"), text))
        if quote:  # an odd number of quotes: a quoted field is not closed on its line
            quotes = F.length(F.col(TEXT)) - F.length(F.replace(F.col(TEXT), F.lit(quote), F.lit("")))
            if escape and escape != quote:
                quotes = quotes - (F.length(F.col(TEXT)) - F.length(F.replace(F.col(TEXT), F.lit(escape + quote), F.lit("")))) / len(escape + quote)
            first.append(F.when(failed & (quotes % 2 == 1), F.concat(F.lit("unbalanced quotes (a quoted field is not closed)"), F.lit(quoting), text)))
        first.append(F.when(failed & F.col("s").getField(extra).isNotNull(), structural))
    else:  # as text, only a record that is no JSON object fails; else the culprit is nested
        limit = int(option(options, "maxStringLen") or JSON_MAX_STRING_LEN)
        structural = F.when(F.col("s").getField(CORRUPT).isNotNull() | F.col("s").isNull(),
                            F.when(F.length(F.col(TEXT)) > limit,
                                   F.concat(F.lit("a line of "), F.length(F.col(TEXT)).cast("string"),
                                            F.lit(f" characters that Spark's JSON parser refuses: a string value longer than {limit} characters "
                                                  f"(its maxStringLen) is too long; set `maxStringLen` in the source's options to read longer ones: "), text))
                            .otherwise(F.concat(F.lit("not a valid JSON object: "), text))) \
            .otherwise(F.concat(F.lit("a nested value does not fit the declared type: "), text))
    invalid = F.when(F.col(TEXT).contains(INVALID), F.concat(F.lit(f"bytes that are not valid {encoding_name(options)}: "), text))
    decoded = [F.col(DECODE_PROBLEM)] if DECODE_PROBLEM in keep else []  # the reader's reason comes first
    problem = F.when(F.col(MISSING).isNull(), F.coalesce(*decoded, invalid, *first, *checks, F.when(corrupt, structural)))
    return both.select(FILE, MISSING, LINE_NO, RECORD_NO, *[F.col("t").getField(f.name).alias(f.name) for f in fields], problem.alias(PROBLEM),
                       *keep, *([TEXT] if with_text else []))


def _a(word: str) -> str:
    return ("an " if word[0] in "AEIOU" else "a ") + word


@dataclass
class Checked:
    """The outcome of `check`: rows to offer the table, how many were read and left out, and
    the files gone before they could be read."""

    df: Any
    rows: int
    bad: int
    samples: list[str]
    missing: list[str]
    rejected: Any = None  # the bad records (parse()'s columns and PROBLEM), with `on_bad_record: dead_letter`


def where(row, line: str = "line") -> str:
    """`file line N`, `file record N` (multiLine) or `file line N record M` (an array on a line);
    `line` names what LINE_NO counts (a Kafka message's `offset`)."""
    parts = [row[FILE]]
    if row[LINE_NO] is not None:
        parts.append(f"{line} {row[LINE_NO]}")
    if row[RECORD_NO] is not None:
        parts.append(f"record {row[RECORD_NO]}")
    return " ".join(parts)


def check(parsed, data_cols: list[str], name: str, what: str, on_bad: str, cache: list, line: str = "line") -> Checked:
    """Counts the records, the bad ones and the files gone in one pass over the persisted rows;
    stops the step (SourceError) on a bad record unless `on_bad` is `drop` or `dead_letter`. `cache` collects
    what to unpersist once the step is over."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    cache.append(parsed)
    total, bad, gone = parsed.select(F.count(F.lit(1)), F.count(F.col(PROBLEM)), F.count(F.col(MISSING))).first()
    samples: list[str] = []
    if bad:
        rows = (parsed.where(F.col(PROBLEM).isNotNull()).select(FILE, LINE_NO, RECORD_NO, PROBLEM)
                .orderBy(FILE, LINE_NO, RECORD_NO).limit(SAMPLES).collect())
        samples = [f"{where(r, line)}: {r[PROBLEM]}" for r in rows]
        if on_bad not in ("drop", "dead_letter"):
            raise SourceError(bad_message(name, what, bad, samples), bad_hint(samples))
    missing = missing_names(parsed, gone)
    good = parsed.where(F.col(PROBLEM).isNull() & F.col(MISSING).isNull()) if bad or gone else parsed
    rejected = parsed.where(F.col(PROBLEM).isNotNull()) if bad and on_bad == "dead_letter" else None
    return Checked(good.select(*[F.col(f"`{c}`") for c in data_cols]), int(total) - int(bad) - int(gone), int(bad), samples, missing,
                   rejected)


def missing_names(df, gone: int) -> list[str]:
    """`gone` entries for the files or objects `df` marks MISSING: the first few named, the rest
    blank (only a few names reach the driver)."""
    from pyspark.sql import functions as F

    names = [r[0] for r in df.where(F.col(MISSING).isNotNull()).select(MISSING).limit(3).collect()] if gone else []
    return names + [""] * (gone - len(names))


def bad_message(name: str, what: str, bad: int, samples: list[str], unit: str = "records") -> str:
    head = f"source {name}: " + (samples[0] if bad == 1 else f"{bad} {unit} of the new {what} do not fit the declared schema: " + "; ".join(samples))
    if bad > len(samples) and bad != 1:
        head += f"; and {bad - len(samples)} more"
    return head


def bad_hint(samples: list[str]) -> str:
    if any("quoting is the likely cause" in s for s in samples):  # dropping would leave out every record with a quote in it
        return ("nothing of this source was written and its checkpoint did not move: check how the file quotes its fields. "
                "pipe reads CSV as RFC 4180 (as Python's csv module and Excel write it): a field holding a comma, quote or line break "
                'is quoted with ", and a " inside it is written "". Set `quote` and `escape` in the source\'s options for another '
                "convention (escape: '\\' when quotes inside quotes are written \\\"), `multiLine: true` when quoted fields hold "
                "line breaks, and `encoding` when the file is not UTF-8")
    if all("bytes that are not valid" in s for s in samples):
        return ("nothing of this source was written and its checkpoint did not move: set `encoding` in the source's options to the "
                "files' encoding (latin1, cp1252, UTF-16, ...), fix the files, or set `on_bad_record: drop` on the source to leave such records out")
    hint = ("nothing of this source was written and its checkpoint did not move: fix or remove those records and run again, "
            "declare the column with the type its values have, or set `on_bad_record: drop` on the source to leave such records out")
    text = " ".join(samples)
    if "is not a DATE" in text:
        hint += "; dates are read as yyyy-MM-dd unless the source's options set `dateFormat`"
    if "is not a TIMESTAMP" in text:
        hint += "; timestamps are read as ISO 8601 (2024-01-31T10:00:00) unless the source's options set `timestampFormat`"
    return hint


def infer_ddl(spark, lines, fmt: str, options: Mapping[str, Any], source: str, what: str = "objects", where: str = "") -> str:
    """The schema Spark's own reader infers from the (cached) lines of `what` (`where`: which of
    them, for the message)."""
    texts = lines.where("`" + MISSING + "` is null").select(TEXT)
    if not spark_api.is_connect(spark):
        texts = texts.rdd.map(lambda r: r[0])  # a DataFrame of lines is read from pyspark 4.2 on, an RDD by all
    reader = spark.read.options(**{k: v for k, v in options.items()})
    if fmt == "json":
        schema = reader.json(texts).schema
    else:
        schema = reader.csv(texts).schema
    fields = [f for f in schema.fields if f.name != "_corrupt_record"]
    if not fields:
        raise SourceError(f"source {source}: no column could be inferred from the {what}{' ' + where if where else ''}",
                          f"declare the {what}' columns in the source's `schema`; nothing of this source was written and its "
                          "checkpoint did not move")
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
