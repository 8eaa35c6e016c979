"""Hudi's simple bucket index (hoodie.index.type=BUCKET, hoodie.index.bucket.engine=SIMPLE):
each partition has a fixed number of buckets, and a record's bucket is a hash of its key, so a
writer finds a key's file group without reading any stored key.

As Java computes it (BucketIdentifier, KeyGenUtils.extractRecordKeysByFields):
- the hash keys are the record key's values: the key itself for a one-field key written as
  its value alone, the values of `f1:v1,f2:v2` for several fields (`__null__` is a null,
  `__empty__` an empty text);
- the bucket is `(List<String>.hashCode() & Integer.MAX_VALUE) % buckets`: Java's list hash
  (h = 31 * h + element hash, from 1; a null element hashes to 0) over String.hashCode, in
  32-bit arithmetic; String.hashCode is Java's own (`reflect`), evaluated in the executors;
- a bucket's file group has a file id whose first 8 characters are the bucket number,
  zero-padded (`00000003-<rest of a UUID>-0`), which is how Java maps a stored file group back
  to its bucket (bucketIdFromFileId).

What pipe refuses on such a table, with the reason (bucket_reason, value_reason_expr): a
one-field key written as `field:value` (Hudi 0.15 hashes the value, 1.1 the whole text), a
one-field key value holding a ':', and with several fields a key value holding a ',' (Hudi's
versions take those apart differently), so that every Hudi writer agrees with pipe on every new
record's bucket."""

from __future__ import annotations

import re

from runtime.table.keygen import EMPTY_KEY, NULL_KEY

INDEX_TYPE = "hoodie.index.type"
ENGINE = "hoodie.index.bucket.engine"
NUM_BUCKETS = "hoodie.bucket.index.num.buckets"
HASH_FIELD = "hoodie.bucket.index.hash.field"
_BUCKET_ID = re.compile(r"^\d{8}-")


def bucket_of(file_id: str) -> int | None:
    """The bucket of a file group of a bucket-index table (None: not a bucket's file id)."""
    return int(file_id[:8]) if _BUCKET_ID.match(file_id) else None


def new_file_id(bucket: int) -> str:
    """A new file id for `bucket`: a new UUID's first 8 characters replaced by the bucket
    number, and Hudi's `-0` (BucketIdentifier.newBucketFileIdPrefix, FSUtils.createNewFileId)."""
    from runtime.table.layout import new_file_id as uuid_file_id

    return f"{bucket:08d}{uuid_file_id()[8:]}"


def bucket_reason(config) -> str | None:
    """Why a table's records cannot be put in buckets exactly as every Hudi writer puts them."""
    if config.complex_single_key:
        return ("its one record key field is written as `field:value` (ComplexKeyGenerator), whose bucket Hudi 0.x "
                "and 1.x compute differently")
    return None


def java_string_hash(F, col):
    """Java's String.hashCode of a string column (a bigint column), computed by the JVM itself
    in the executors (`reflect` of java.util.Objects.hashCode); null stays null."""
    return F.call_function("reflect", F.lit("java.util.Objects"), F.lit("hashCode"), col).cast("bigint")


def hash_keys(F, config, key):
    """The hash keys of record key column `key` (extractRecordKeysByFields), as columns."""
    fields = config.record_key_fields
    if len(fields) == 1 and not config.complex_single_key:
        return [key]
    parts = F.split(key, ",")
    out = []
    for i, f in enumerate(fields):
        value = F.substring(F.element_at(parts, i + 1), len(f) + 2, 1 << 30)
        out.append(F.when(value == NULL_KEY, F.lit(None).cast("string")).when(value == EMPTY_KEY, F.lit("")).otherwise(value))
    return out


def value_reason_expr(F, config, key):
    """True on a row whose key Hudi's versions take apart differently, so that its bucket
    would be a guess: a one-field key holding a ':' (0.15 splits it, 1.1 hashes it whole), or
    with several fields a value holding a ','."""
    if len(config.record_key_fields) == 1:
        return F.instr(key, ":") > 0
    return F.size(F.split(key, ",")) != len(config.record_key_fields)


def bucket_expr(F, config, buckets: int, key):
    """The bucket of each row's record key `key`, as Java's BucketIdentifier.getBucketId."""
    h = F.lit(1).cast("bigint")
    for part in hash_keys(F, config, key):
        element = F.coalesce(java_string_hash(F, part), F.lit(0).cast("bigint"))
        h = F.pmod(h * 31 + element, F.lit(1 << 32).cast("bigint"))  # 32-bit arithmetic, kept unsigned
    return F.pmod(h.bitwiseAND(F.lit(0x7FFFFFFF).cast("bigint")), F.lit(buckets)).cast("int")


def java_list_hash_bucket(values: list[str | None], buckets: int) -> int:
    """The same in Python (for tests and checks): Java's List<String>.hashCode bucket."""
    h = 1
    for v in values:
        e = 0
        if v is not None:
            data = v.encode("utf-16-be")
            for i in range(0, len(data), 2):
                e = (31 * e + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
        h = (31 * h + e) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % buckets
