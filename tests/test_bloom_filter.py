"""Every base file pipe writes carries Hudi's bloom filter and record-key range in its Parquet
footer, exactly as Java Hudi writes them, so Java's BLOOM and GLOBAL_BLOOM indexes can look keys
up in pipe tables. Checked with Hudi's own Java code: tests/java/BloomFilterCheck.java, run on
the Hudi 0.15.0 Spark bundle (fetched with Maven into the ignored .java-hudi/), without Spark."""

from __future__ import annotations

import base64
import fcntl
import shutil
import subprocess
import zipfile
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.table import Table, TableConfig, bloom
from runtime.table.config import MERGE_ON_READ

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / ".java-hudi"
BUNDLE = "org.apache.hudi:hudi-spark3.5-bundle_2.12:0.15.0"
JAR = HOME / "jars" / "hudi-spark3.5-bundle_2.12-0.15.0.jar"
SOURCE = Path(__file__).with_name("java") / "BloomFilterCheck.java"
FIXTURES = REPO.parent / "shared" / "fixtures" / "hudi"  # as tests/test_fixtures.py finds them

# keys as users have them: several fields, punctuation, accents, a euro sign (3 UTF-8 bytes), and
# characters past U+FFFF beside U+FF21, whose order differs between code points and Java's UTF-16
SPECIAL_KEYS = ["id:1,name:Zoë", "id:2,name:O'Brien, Jr.", "€100", "ｚenkaku", "😀smile", "a😀", "\uffefbom", "x" * 41]
ABSENT = [f"absent-{i}" for i in range(3000)] + ["id:1,name:Zoe", "😁smile", "ｚenkakU"]


@pytest.fixture(scope="module")
def java_check(tmp_path_factory):
    """check(footers) -> per base file, what Hudi's Java code says of its footer (see
    BloomFilterCheck.java): answers, identical, min, max, footer_keys, default_type."""
    HOME.mkdir(exist_ok=True)
    with open(HOME / ".setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be fetching the bundle
        if not JAR.is_file():
            subprocess.run([shutil.which("mvn") or "mvn", "-q", "-B", "dependency:copy", f"-Dartifact={BUNDLE}",
                            f"-DoutputDirectory={JAR.parent}"], check=True, capture_output=True)
    import pyspark

    # Hudi's config classes log through slf4j, which Spark provides beside the bundle
    slf4j = sorted((Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))
    classes = tmp_path_factory.mktemp("bloom-java")
    subprocess.run(["javac", "-cp", str(JAR), "-d", str(classes), str(SOURCE)], check=True, capture_output=True)

    def check(footers: list[tuple[dict, list[str]]]) -> list[dict]:
        """`footers`: (footer key-value metadata, record keys in file order) per base file."""
        folders = []
        for n, (meta, keys) in enumerate(footers):
            folder = classes / f"case{len(list(classes.iterdir()))}-{n}"
            folder.mkdir()
            (folder / "filter").write_text(meta[bloom.BLOOM_FILTER_KEY], encoding="utf-8")
            (folder / "type").write_text(meta.get(bloom.TYPE_CODE_KEY, bloom.SIMPLE), encoding="utf-8")
            (folder / "keys").write_text(_b64_lines(keys), encoding="ascii")
            (folder / "absent").write_text(_b64_lines(ABSENT), encoding="ascii")
            folders.append(str(folder))
        done = subprocess.run(["java", "-cp", ":".join(map(str, [JAR, *slf4j, classes])), "BloomFilterCheck", *folders], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        out = [{} for _ in footers]
        for line in done.stdout.splitlines():
            n, _, pair = line.partition(" ")
            name, _, value = pair.partition("=")
            out[int(n)][name] = value
        return out

    return check


def _footer(path: Path) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in pq.ParquetFile(path).metadata.metadata.items()}


def _keys(path: Path) -> list[str]:
    return pq.read_table(path, columns=["_hoodie_record_key"]).column(0).to_pylist()


def _b64_lines(keys: list[str]) -> str:
    return "".join(base64.b64encode(k.encode("utf-8")).decode("ascii") + "\n" for k in keys)


def _text(b64: str) -> str | None:
    return base64.b64decode(b64).decode("utf-8") if b64 else None


def _base_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet") if ".hoodie" not in p.parts and not p.name.startswith("."))


def _python_answers(meta: dict, keys: list[str]) -> str:
    found = bloom.footer_bloom_filter(meta).might_contain_keys(pa.array(keys + ABSENT, pa.string()))
    return "".join("1" if f else "0" for f in found)


def _assert_java_agrees(footers: list[tuple[dict, list[str]]], java: list[dict]) -> None:
    """Hudi's Java code reads each footer's filter, finds every key of the file, answers for
    absent keys as pipe's reader does, builds the very same filter from those keys, and
    orders the keys as the footer's range says (String.compareTo: UTF-16)."""
    for (meta, keys), said in zip(footers, java):
        assert said["footer_keys"].split(",") == [bloom.BLOOM_FILTER_KEY, bloom.TYPE_CODE_KEY, bloom.MIN_RECORD_KEY, bloom.MAX_RECORD_KEY]
        assert meta[bloom.TYPE_CODE_KEY] == said["default_type"] == "DYNAMIC_V0"
        assert said["identical"] == "true", "Java builds another filter from the same keys"
        assert said["answers"][: len(keys)] == "1" * len(keys), "Java misses keys of the file"
        assert said["answers"] == _python_answers(meta, keys)
        if len(keys) <= bloom.NUM_ENTRIES:
            assert "1" not in said["answers"][len(keys):], "a false positive at fpp 1e-9"
        assert meta.get(bloom.MIN_RECORD_KEY) == _text(said["min"])
        assert meta.get(bloom.MAX_RECORD_KEY) == _text(said["max"])


@pytest.mark.spark
def test_java_finds_every_key_of_every_base_file_pipe_writes(spark, tmp_path, java_check):
    """bulk_insert, upsert (a file group rewritten), a merge-on-read compaction and an empty
    base file (every row of a group deleted): each footer has the bloom filter Java would
    write for its keys, and their range in Java's order."""
    schema = "key string, region string, ts long, amount decimal(12,2)"
    cow = Table.create(spark, str(tmp_path / "orders"), TableConfig("orders", record_key_fields=("key",),
                                                                    partition_fields=("region",), precombine_field="ts"))
    rows = [(k, "US", 1700000000000 + i, Decimal(i) / 4) for i, k in enumerate(SPECIAL_KEYS)]
    cow.write(spark.createDataFrame(rows + [(f"order-{i}/é", "EU", 1700000000000 + i, None) for i in range(300)], schema), "bulk_insert")
    cow.write(spark.createDataFrame([("€100", "US", 1700000000009, Decimal("5.10")), ("new/ключ", "US", 1700000000009, None)], schema), "upsert")

    # a write's bytes per record leave the footers' filters out: a later insert of many rows
    # is not cut into files of a few thousand rows (431 KB over 10 rows is 43 KB a row)
    assert cow.record_size_estimate(1024) < 10_000

    mor = Table.create(spark, str(tmp_path / "trips"), TableConfig("trips", table_type=MERGE_ON_READ, record_key_fields=("key",),
                                                                   partition_fields=("region",), precombine_field="ts"))
    mor.write(spark.createDataFrame([(k, "EU", 1, None) for k in SPECIAL_KEYS] + [("gone", "US", 1, None)], schema), "upsert")
    mor.write(spark.createDataFrame([("😀smile", "EU", 2, Decimal("2.00"))], schema), "upsert")
    mor.write(spark.createDataFrame([("gone", "US", 3, None)], schema), "delete")
    assert mor.compact() is not None

    files = _base_files(tmp_path / "orders") + _base_files(tmp_path / "trips")
    assert any(pq.ParquetFile(f).metadata.num_rows == 0 for f in files), "the delete left an empty base file"
    assert all(bloom.BLOOM_FILTER_KEY in _footer(f) for f in files), "a base file without a bloom filter"
    footers = [(_footer(f), _keys(f)) for f in files]
    _assert_java_agrees(footers, java_check(footers))
    # where code points and UTF-16 disagree (😀 past U+FFFF, U+FFEF below it), the footer says what Java says
    assert any(keys and meta[bloom.MAX_RECORD_KEY] != max(keys) for meta, keys in footers)


@pytest.mark.spark
def test_a_rewritten_file_keeps_its_rows_in_place_and_its_filter_is_javas_for_them(spark, tmp_path, java_check):
    """A file group of 130,000 keys (a filter of two rows, past its bound) rewritten twice by
    upserts: the stored rows stay in their order with updates in their place, the new keys
    come after them, as Java's merge handle writes them, and the footer's filter (the stored
    filter, the new keys added) is the one Java builds from the new file's keys. A rewrite
    that deletes keys builds its filter from its rows."""
    schema = "key string, region string, ts long, amount decimal(12,2)"
    table = Table.create(spark, str(tmp_path / "accounts"), TableConfig("accounts", record_key_fields=("key",),
                                                                        partition_fields=("region",), precombine_field="ts"))
    first = [(f"acct:{i * 7919 % 130_000:06d}/é", "EU", 1_700_000_000_000, Decimal(i) / 100) for i in range(130_000)]
    table.write(spark.createDataFrame(first, schema).coalesce(1), "bulk_insert")
    [stored] = _base_files(tmp_path / "accounts")
    before = _keys(stored)
    updated = [before[i] for i in range(3, 130_000, 9_001)]
    new = [f"acct:new-{i}/ключ" for i in range(25)]
    table.write(spark.createDataFrame([(k, "EU", 1_700_000_000_001, Decimal("-1.50")) for k in updated + new], schema), "upsert")
    [rewritten] = [f for f in _base_files(tmp_path / "accounts") if f != stored]
    keys = _keys(rewritten)
    assert keys == before + sorted(new), "stored rows moved"
    values = dict(zip(keys, pq.read_table(rewritten, columns=["amount"]).column(0).to_pylist()))
    assert {k for k, v in values.items() if v == Decimal("-1.50")} == set(updated + new)
    gone = keys[10:20]
    table.write(spark.createDataFrame([(k, "EU", 1_700_000_000_002, None) for k in gone], schema), "delete")
    [last] = [f for f in _base_files(tmp_path / "accounts") if f not in (stored, rewritten)]
    assert _keys(last) == keys[:10] + keys[20:]
    footers = [(_footer(f), _keys(f)) for f in (rewritten, last)]
    assert all(len(bloom.footer_bloom_filter(meta).bits) == 2 for meta, _ in footers)
    _assert_java_agrees(footers, java_check(footers))


def test_a_stored_filter_goes_on_only_when_it_is_the_one_built_for_its_rows():
    """BloomFilterWriteSupport.continue_from: a filter of Java's defaults holding one key per
    stored row goes on, and after the new keys it is bit for bit the filter built from all
    the keys in that order (past the dynamic bound too); another filter, or another count,
    is not taken."""
    keys = pa.array([f"id:{i},é" if i % 3 else str(i) for i in range(125_000)], pa.string())
    for stored_rows in (10, 59_990, 99_000, 120_000):
        fresh = bloom.BloomFilterWriteSupport()
        fresh.add_keys(keys)
        stored = bloom.BloomFilterWriteSupport()
        stored.add_keys(keys[:stored_rows])
        footer = stored.finalize_metadata()
        went_on = bloom.BloomFilterWriteSupport()
        assert not went_on.continue_from(footer, stored_rows + 1) and not went_on.continued
        assert went_on.continue_from(footer, stored_rows)
        for start in range(stored_rows, len(keys), 997):  # in pieces, small ones set bits in place
            went_on.add_new_keys(keys[start:start + 997])
        went_on.add_keys(keys)  # the written rows' key range only
        assert went_on.finalize_metadata() == fresh.finalize_metadata()
    simple = bloom.BloomFilter.create(bloom.SIMPLE)
    simple.add(keys[:10])
    assert not bloom.BloomFilterWriteSupport().continue_from({bloom.BLOOM_FILTER_KEY: simple.serialize_to_string()}, 10)
    assert not bloom.BloomFilterWriteSupport().continue_from({bloom.BLOOM_FILTER_KEY: "not base64!"}, 10)
    assert not bloom.BloomFilterWriteSupport().continue_from({}, 10)


def test_java_reads_a_dynamic_filter_past_its_bound(java_check):
    """A base file of 130,000 keys: its filter has grown a second row at 60,000 keys and,
    past 100,000, adds keys to its rows in turn, as InternalDynamicBloomFilter does."""
    keys = [f"id:{i},name:user-{i * 7919 % 100003}" for i in range(130_000)]
    written = bloom.BloomFilterWriteSupport()
    for start in range(0, len(keys), 50_000):  # in pieces, as a file's row groups come
        written.add_keys(pa.array(keys[start:start + 50_000], pa.string()))
    meta = written.finalize_metadata()
    assert len(bloom.footer_bloom_filter(meta).bits) == 2
    _assert_java_agrees([(meta, keys)], java_check([(meta, keys)]))


def test_java_written_bloom_filters_read_the_same_in_pipe(tmp_path, java_check):
    """The filters in the base files of Java-written fixtures: pipe reads them and answers
    mightContain as Java does, and builds byte-identical ones from the same keys."""
    files = []
    for name in ("cow_v6_complexkeygen_hivestyle", "mor_avro_v6_trips_8i3d", "cow_v6_nonpartitioned"):
        with zipfile.ZipFile(FIXTURES / f"{name}.zip") as z:
            z.extractall(tmp_path / name)
        files += [f for f in _base_files(tmp_path / name) if "__MACOSX" not in f.parts]
    assert len(files) >= 6
    footers = [(_footer(f), _keys(f)) for f in files]
    for (meta, keys), java in zip(footers, java_check(footers)):
        assert java["answers"] == _python_answers(meta, keys)
        assert java["answers"][: len(keys)] == "1" * len(keys)
        written = bloom.BloomFilterWriteSupport()
        written.add_keys(pa.array(keys, pa.string()))
        assert written.finalize_metadata() == {k: meta[k] for k in written.finalize_metadata()}
