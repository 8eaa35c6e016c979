"""The key generator: the text of a row's record key (_hoodie_record_key) and partition path
(_hoodie_partition_path), as Hudi's Java key generators write them, computed as Spark column
expressions (the data stays in the executors; the session time zone plays no part).

Java takes a field's text from its Avro value (KeyGenUtils -> HoodieAvroUtils.
getNestedFieldValAsString -> convertValueForAvroLogicalTypes -> StringUtils.objToString):
- timestamp (timestamp-micros): the epoch microseconds as a decimal number, 1704103200000000;
  timestamp_ntz (local-timestamp-micros): the same number of the wall-clock time taken as UTC;
- decimal: java.math.BigDecimal.toString(), scientific below 1E-6 at the column's scale
  (1E-10, 0E-10, -1.5E-9), plain otherwise (1.5000000000);
- binary (bytes): the lower-case hex of the bytes;
- date: yyyy-mm-dd (LocalDate); float and double: Float/Double.toString, which Spark's cast
  to string also gives; integers, booleans and strings: as they are.

A ComplexKeyGenerator with one key field writes `field:value` (FIELD_PREFIXED: Hudi 0.14.0, and
the default of 0.14.2, 0.15.1, 1.0.3 and 1.1+) or the bare value (VALUE_ONLY: 0.14.1, 0.15.0,
1.0.0-1.0.2, HUDI-7001); hoodie.table.complex.keygen.encoding declares which. A table whose
stored keys were written otherwise (pipe before this text was adopted: Spark's cast to string of timestamps,
decimals and binary values; Java tables without the property) is recognised from one stored
row (`settle`), and its text is kept: a table never holds two texts of one key."""

from __future__ import annotations

import dataclasses
import threading

from runtime.table.errors import TableError

FIELD_PREFIXED, VALUE_ONLY = "FIELD_PREFIXED", "VALUE_ONLY"
ENCODING_PROPERTY = "hoodie.table.complex.keygen.encoding"
NULL_KEY, EMPTY_KEY = "__null__", "__empty__"

# Types whose Java text differs from Spark's cast to string (pipe's text before this version)
_JAVA_TEXT_TYPES = ("timestamp", "timestamp_ntz", "binary", "decimal")
# Types whose text never holds a character that URL encoding escapes (digits, signs, '.', 'E',
# '-', hex): their partition values skip the 15 replacements per row.
_PLAIN_TYPES = ("tinyint", "smallint", "int", "bigint", "date", "boolean", "decimal", "timestamp", "timestamp_ntz", "binary")


def _base_type(dtype: str) -> str:
    return dtype.split("(")[0]


def single_key_prefixed(config) -> bool:
    """Whether the table's one record key field is written `field:value`."""
    return config.complex_single_key and (config.complex_key_encoding or FIELD_PREFIXED) == FIELD_PREFIXED


def value_text(F, col, dtype: str, legacy: bool = False):
    """The text Java's key generators write for a value of Spark type `dtype` (a simpleString,
    as DataFrame.dtypes gives). `legacy`: Spark's cast to string, which pipe wrote before."""
    base = _base_type(dtype)
    if legacy or base not in _JAVA_TEXT_TYPES:
        return col.cast("string")
    if base == "timestamp":
        return F.unix_micros(col).cast("string")
    if base == "timestamp_ntz":
        return F.timestamp_diff("MICROSECOND", F.expr("TIMESTAMP_NTZ'1970-01-01 00:00:00'"), col).cast("string")
    if base == "binary":
        return F.lower(F.hex(col))
    return _java_decimal(F, col, int(dtype.split(",")[1].rstrip(") ")))


def _java_decimal(F, col, scale: int):
    """BigDecimal.toString() of a decimal with `scale`: with n digits in the unscaled value,
    the exponent n - 1 - scale below -6 gives scientific notation (one digit, the rest after a
    point, E and the exponent), else the plain text Spark's cast also gives."""
    plain = col.cast("string")
    if scale <= 6:  # the exponent is never below -scale
        return plain
    digits = F.ltrim(F.regexp_replace(plain, r"[-.]", ""), F.lit("0"))
    digits = F.when(digits == "", F.lit("0")).otherwise(digits)
    n = F.length(digits)
    scientific = F.concat(F.when(col < 0, F.lit("-")).otherwise(F.lit("")), F.substring(digits, 1, 1),
                          F.when(n > 1, F.concat(F.lit("."), digits.substr(F.lit(2), n))).otherwise(F.lit("")),
                          F.lit("E"), (n - 1 - scale).cast("string"))
    return F.when(n < scale - 5, scientific).otherwise(plain)


# Column expressions already built, by what they depend on: building one is a few hundred
# round trips to the driver's JVM (each function and literal of the URL encoding is one), and a
# Column is an unresolved expression, valid for any DataFrame of the JVM that made it.
_BUILT: dict = {}
_BUILT_MAX = 256
_BUILT_LOCK = threading.Lock()


def _memo(kind: str, config, fields, types: dict[str, str], build):
    from pyspark import SparkContext
    from pyspark.sql.utils import is_remote

    remote = is_remote()
    try:
        key = (kind, remote, None if remote else SparkContext._gateway, config, tuple(types.get(f, "string") for f in fields))
        hash(key)
    except TypeError:  # a config holding something unhashable: built each time
        return build()
    with _BUILT_LOCK:
        built = _BUILT.get(key)
    if built is None:
        built = build()
        with _BUILT_LOCK:
            if len(_BUILT) >= _BUILT_MAX:
                _BUILT.pop(next(iter(_BUILT)))
            _BUILT[key] = built
    return built


def key_expr(F, config, types: dict[str, str]):
    """_hoodie_record_key (see _key_expr), built once per table's settings and key types."""
    return _memo("key", config, config.record_key_fields, types, lambda: _key_expr(F, config, types))


def partition_expr(F, config, types: dict[str, str]):
    """_hoodie_partition_path (see _partition_expr), built once per table's settings and
    partition field types."""
    return _memo("partition", config, config.partition_fields, types, lambda: _partition_expr(F, config, types))


def _key_expr(F, config, types: dict[str, str]):
    """_hoodie_record_key: one field's value text (`field:value` under a FIELD_PREFIXED
    ComplexKeyGenerator); several fields as `f1:v1,f2:v2` with __null__ for a null part and
    __empty__ for an empty one (KeyGenerator.constructRecordKey). Null for a row that has no
    key: its one field null or empty, or every part null or empty, which Hudi refuses
    (HoodieKeyException) and so does the writer (writer._refuse_nulls)."""
    fields = config.record_key_fields
    legacy = bool(config.legacy_value_text)
    texts = [value_text(F, F.col(f"`{f}`"), types.get(f, "string"), legacy) for f in fields]
    some = F.coalesce(*[F.nullif(t, F.lit("")) for t in texts]).isNotNull()
    if len(fields) == 1 and not single_key_prefixed(config):
        return F.when(some, texts[0])
    parts = [F.concat(F.lit(f"{f}:"), F.when(t.isNull(), F.lit(NULL_KEY)).when(t == "", F.lit(EMPTY_KEY)).otherwise(t))
             for f, t in zip(fields, texts)]
    return F.when(some, F.concat_ws(",", *parts))


def _partition_expr(F, config, types: dict[str, str]):
    """_hoodie_partition_path: the partition fields' value texts, URL-encoded when the table
    says so, `field=` before each with hive-style partitioning, joined with '/'; a null or
    empty value is __HIVE_DEFAULT_PARTITION__."""
    from runtime.table.layout import DEFAULT_PARTITION

    if not config.partition_fields:
        return F.lit("")
    parts = []
    for name in config.partition_fields:
        dtype = types.get(name, "string")
        value = value_text(F, F.col(f"`{name}`"), dtype, bool(config.legacy_value_text))
        plain = _base_type(dtype) in _PLAIN_TYPES and not (config.legacy_value_text and _base_type(dtype) in _JAVA_TEXT_TYPES)
        value = F.when(value.isNull() | (value == ""), F.lit(DEFAULT_PARTITION)).otherwise(url_encode(F, value) if config.url_encode and not plain else value)
        parts.append(F.concat(F.lit(f"{name}="), value) if config.hive_style else value)
    return F.concat_ws("/", *parts)


def url_encode(F, col):
    """Hudi's PartitionPathEncodeUtils.escapePathName as column replacements."""
    from runtime.table.layout import CONTROL, CONTROL_PATTERN, ESCAPED

    for ch in ESCAPED:  # '%' first: the escapes below add more
        col = F.replace(col, F.lit(ch), F.lit(f"%{ord(ch):02X}"))
    # The rare control characters as one fold over them rather than 32 more nested replacements:
    # a Spark Connect client cannot send an expression nested about 50 calls deep (protobuf's
    # limit of 100 levels). hex() of a one-byte character is its two upper-case digits.
    controlled = F.aggregate(F.array(*[F.lit(ch) for ch in CONTROL]), col,
                             lambda text, ch: F.replace(text, ch, F.concat(F.lit("%"), F.hex(ch))))
    return F.when(col.rlike(CONTROL_PATTERN), controlled).otherwise(col)


# --- which text an existing table holds ----------------------------------------------------


def _undecided(config, types: dict[str, str]) -> tuple[bool, bool]:
    """(is the single-key encoding undeclared, may the value text be pipe's old one)."""
    encoding = config.complex_single_key and not config.complex_key_encoding
    fields = set(config.record_key_fields) | set(config.partition_fields)
    legacy = config.legacy_value_text is None and any(_base_type(types.get(f, "")) in _JAVA_TEXT_TYPES for f in fields)
    return encoding, legacy


def settle(spark, storage, config, slices, struct):
    """`config` with the key text of the table's stored rows: the single-key encoding (when
    hoodie.table.complex.keygen.encoding does not declare it) and whether timestamps,
    decimals and binary values are Spark's text (pipe's before) or Java's. Both are read off
    one stored row: its stored key and partition path against the candidate texts of its own
    column values (a metadata-sized read of one base file). A table with no row gets the
    declared encoding (else FIELD_PREFIXED) and Java's text. Raises TableError for a table
    whose stored text is none of them: writing would duplicate its keys."""
    from pyspark.sql import functions as F

    if config.complex_single_key and config.complex_key_encoding not in (None, FIELD_PREFIXED, VALUE_ONLY):
        raise TableError(f"pipe cannot write into table {config.name}: {ENCODING_PROPERTY}={config.complex_key_encoding} is "
                         f"neither {FIELD_PREFIXED} nor {VALUE_ONLY}", "set it to the text its stored record keys have in .hoodie/hoodie.properties")
    if not config.populate_meta_fields or struct is None:
        return config
    types = {f.name: f.dataType.simpleString() for f in struct.fields}
    encoding, legacy = _undecided(config, types)
    if not encoding and not legacy:
        return config
    based = [s.base_file for s in slices if s.base_file is not None]
    if not based:
        return config
    from runtime.table.writer import KEY, PART

    columns = list(dict.fromkeys([*config.record_key_fields, *config.partition_fields]))
    if not set(columns) <= set(types):
        return config  # a key column the table's schema lacks: nothing to compare with
    sampled = max(based, key=lambda b: b.size)  # the largest file: one whose rows were not all deleted
    sample = spark.read.parquet(storage.full_path(sampled.path)).select(KEY, PART, *[F.col(f"`{c}`") for c in columns])
    sample = sample.where(F.col(KEY).isNotNull()).limit(1)
    stored_types = dict(sample.dtypes)  # the row's own types (the table's may have widened since)
    encodings = [config.complex_key_encoding] if not encoding else [FIELD_PREFIXED, VALUE_ONLY]
    candidates = [dataclasses.replace(config, complex_key_encoding=e, legacy_value_text=old)
                  for e in encodings for old in ((False, True) if legacy else (config.legacy_value_text,))]
    checks = [((key_expr(F, c, stored_types) == F.col(KEY)) if config.record_key_fields else F.lit(True))
              & (partition_expr(F, c, stored_types).eqNullSafe(F.col(PART)) if config.partition_fields else F.lit(True)) for c in candidates]
    row = sample.select(F.col(KEY), F.col(PART), *[ch.alias(f"_pipe_c{i}") for i, ch in enumerate(checks)]).first()
    if row is None:
        return config
    for i, c in enumerate(candidates):
        if row[f"_pipe_c{i}"]:
            return c
    raise TableError(
        f"pipe cannot write into table {config.name}: its stored record key {row[KEY]!r} (partition path {row[PART]!r}, "
        f"in {sampled.path}) is not the text pipe's key generator makes of that row's "
        f"{', '.join(columns)} (neither Hudi's Java key generators' text nor Spark's cast to string)",
        "a writer with other key generator settings made this table (for example Java Hudi with "
        "hoodie.datasource.write.keygenerator.consistent.logical.timestamp.enabled=true or a bulk_insert with its row writer, "
        "or pipe under a session time zone other than UTC); "
        "keep writing it with that writer, or rebuild it with pipe (pipe run --select TABLE --full-refresh)")
