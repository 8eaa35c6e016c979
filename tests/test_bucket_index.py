"""Hudi's simple bucket index (issue 41, part 3): pipe puts every record in the file group of its
bucket exactly as Java Hudi's hoodie.index.type=BUCKET does, so Java and pipe take turns on one
table without a new file group or a key twice: pipe's bucket tables written on by Java 0.15
(version 6) and 1.1 (version 9), and Java's bucket tables written on by pipe."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from runtime.table import Table, TableConfig, TableError
from runtime.table.bucket_index import bucket_of, java_list_hash_bucket
from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ
from tests.java_hudi.client import hudi_rs

SCHEMA = "id long, region string, ts long, amount decimal(12,2), v string"
REGIONS = ("eu", "us", "apac")
BUCKETS = 8


def rows(ids, r: int):
    return [(i, REGIONS[i % 3], 1_700_000_000_000 + r * 1000 + i, decimal.Decimal(f"{i}.{r:02d}"), f"Zoë \"{r}\" d'or {i}") for i in ids]


def arrow(batch) -> pa.Table:
    return pa.table({"id": pa.array([r[0] for r in batch], pa.int64()), "region": [r[1] for r in batch],
                     "ts": pa.array([r[2] for r in batch], pa.int64()), "amount": pa.array([r[3] for r in batch], pa.decimal128(12, 2)),
                     "v": [r[4] for r in batch]})


def java_options(version: int, table_type: str, operation: str = "upsert") -> dict:
    return {"hoodie.table.name": "ledger", "hoodie.datasource.write.operation": operation,
            "hoodie.datasource.write.table.type": table_type, "hoodie.datasource.write.recordkey.field": "id",
            "hoodie.datasource.write.partitionpath.field": "region", "hoodie.datasource.write.precombine.field": "ts",
            "hoodie.datasource.write.keygenerator.class": "org.apache.hudi.keygen.SimpleKeyGenerator",
            "hoodie.datasource.write.hive_style_partitioning": "true", "hoodie.datasource.write.partitionpath.urlencode": "true",
            "hoodie.write.table.version": str(version),
            "hoodie.index.type": "BUCKET", "hoodie.index.bucket.engine": "SIMPLE", "hoodie.bucket.index.num.buckets": str(BUCKETS)}


class Ledger:
    """What the table holds, by key, and its file groups as the three readers see them."""

    def __init__(self, spark, path):
        self.spark, self.path, self.model = spark, path, {}

    def apply(self, batch, delete: bool = False):
        for r in batch:
            if delete:
                self.model.pop(r[0], None)
            else:
                self.model[r[0]] = (r[1], r[4])

    def expected(self):
        return sorted((k, *v) for k, v in self.model.items())

    def check(self, java) -> set[tuple[str, str]]:
        """pipe, Java and hudi-rs read the model; every row is in its bucket's file group, one
        group per (partition, bucket). Returns the file groups."""
        got = Table.open(self.spark, str(self.path)).read().collect()
        assert sorted((r["id"], r["region"], r["v"]) for r in got) == self.expected()
        groups = {(r["_hoodie_partition_path"], r["_hoodie_file_name"].split("_")[0]) for r in got}
        wrong = [(r["id"], r["_hoodie_file_name"]) for r in got
                 if bucket_of(r["_hoodie_file_name"].split("_")[0]) != java_list_hash_bucket([str(r["id"])], BUCKETS)]
        assert not wrong, f"rows outside their bucket: {wrong[:5]}"
        per_bucket = {(p, bucket_of(f)) for p, f in groups}
        assert len(per_bucket) == len(groups), f"two file groups share a bucket: {sorted(groups)}"
        rs = hudi_rs(self.path)
        assert sorted(zip(rs.column("id").to_pylist(), rs.column("region").to_pylist(), rs.column("v").to_pylist())) == self.expected()
        j = java.read(self.path)
        assert sorted(zip(j.column("id").to_pylist(), j.column("region").to_pylist(), j.column("v").to_pylist())) == self.expected()
        return groups


@pytest.mark.java_hudi
@pytest.mark.parametrize("version,table_type", [(6, COPY_ON_WRITE), (9, MERGE_ON_READ)])
def test_java_writes_on_pipes_bucket_table_into_pipes_file_groups_and_pipe_after_java(spark, tmp_path, request, version, table_type):
    java = request.getfixturevalue("java_hudi_015" if version == 6 else "java_hudi_11")
    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", table_type=table_type, record_key_fields=("id",),
                                                       partition_fields=("region",), precombine_field="ts", create_version=version,
                                                       buckets=BUCKETS))
    ledger = Ledger(spark, path)
    df = lambda b: spark.createDataFrame(b, SCHEMA)  # noqa: E731
    first = rows(range(3000), 0)
    table.write(df(first), "bulk_insert")
    ledger.apply(first)
    for r in range(1, 4):  # updates and new keys, then deletes
        batch = rows(range(r * 500, r * 500 + 1500, 2), r)
        table.write(df(batch), "upsert", compact_after=3 if table_type == MERGE_ON_READ else None)
        ledger.apply(batch)
    gone = rows(range(7, 3000, 13), 9)
    table.write(df(gone), "delete")
    ledger.apply(gone, delete=True)
    groups = ledger.check(java)
    assert len(groups) == len(REGIONS) * BUCKETS
    # Java's bucket index finds pipe's file groups: its updates and new keys go into them
    batch = rows(range(1, 5000, 3), 20)
    java.write(path, arrow(batch), java_options(version, table_type))
    ledger.apply(batch)
    assert ledger.check(java) == groups, "Java's bucket index made file groups of its own"
    # and pipe writes on after Java, into the same groups
    batch = rows(range(2, 6000, 5), 21)
    Table.open(spark, str(path)).write(df(batch), "upsert", compact_after=1 if table_type == MERGE_ON_READ else None)
    ledger.apply(batch)
    assert ledger.check(java) == groups


@pytest.mark.java_hudi
@pytest.mark.parametrize("version,table_type", [(6, MERGE_ON_READ), (9, COPY_ON_WRITE)])
def test_pipe_writes_on_javas_bucket_table_into_javas_file_groups(spark, tmp_path, request, version, table_type):
    """A table Java made with its bucket index (which it keeps as a write setting only): pipe
    refuses to write into it without the number of buckets, and with it puts updates and new
    keys in Java's file groups; Java writes on."""
    java = request.getfixturevalue("java_hudi_015" if version == 6 else "java_hudi_11")
    path = tmp_path / "ledger"
    ledger = Ledger(spark, path)
    first = rows(range(0, 2400, 2), 0)
    java.write(path, arrow(first), java_options(version, table_type, "insert"), mode="overwrite")
    ledger.apply(first)
    groups = ledger.check(java)
    table = Table.open(spark, str(path))
    batch = rows(range(1, 3000, 3), 1)
    with pytest.raises(TableError, match="bucket index.*pipe writes it only knowing its number of buckets") as refused:
        table.write(spark.createDataFrame(batch, SCHEMA), "upsert")
    assert "`index: bucket` and `buckets:`" in refused.value.hint
    with pytest.raises(TableError, match="file group .* is not one of its 4 buckets"):
        table.write(spark.createDataFrame(batch, SCHEMA), "upsert", buckets=4)
    for r in (1, 2):
        batch = rows(range(r, 3000, 3), r)
        Table.open(spark, str(path)).write(spark.createDataFrame(batch, SCHEMA), "upsert", buckets=BUCKETS)
        ledger.apply(batch)
        now = ledger.check(java)
        assert groups <= now  # buckets no key had before may open; none twice (ledger.check)
        groups = now
    batch = rows(range(0, 3600, 7), 5)
    java.write(path, arrow(batch), java_options(version, table_type))
    ledger.apply(batch)
    assert ledger.check(java) >= groups


ACCOUNTS_YML = """
    tables:
      accounts:
        type: merge_on_read
        key: [account_id, branch]
        precombine: updated_ms
        partition_by: [region]
        index: bucket
        buckets: 4
    """


def test_a_project_with_a_bucket_index_runs_round_after_round_into_its_buckets(spark, tmp_path, capsys):
    """`index: bucket` in a table's YAML: each run (new keys, updates, a multi-field key with
    accents and quotes) writes into the file group of each key's bucket, four per partition."""
    from tests.test_run import project, run_ok, write_jsonl

    root = project(tmp_path, {
        "sources/s.yml": """
            sources:
              raw: {kind: files, path: data, format: json, schema: "account_id BIGINT, branch STRING, region STRING, updated_ms BIGINT, balance DECIMAL(12,2)"}
            """,
        "tables/accounts.yml": ACCOUNTS_YML,
        "tables/accounts.sql": "select * from {{ source('raw') }}\n",
    })
    model = {}
    for r in range(3):
        batch = [{"account_id": i, "branch": ("Zoë's", 'Nord "N"', "São")[i % 3], "region": ("EU", "US")[i % 2],
                  "updated_ms": 1_700_000_000_000 + r * 1000 + i, "balance": f"{i}.{r:02d}"} for i in range(r * 150, r * 150 + 400)]
        write_jsonl(root / f"data/accounts-{r}.json", batch)
        run_ok(capsys, root)
        for b in batch:
            model[(b["account_id"], b["branch"])] = b["balance"]
    got = Table.open(spark, str(root / "lake/accounts")).read().collect()
    assert sorted((r["account_id"], r["branch"], str(r["balance"])) for r in got) == sorted((k[0], k[1], v) for k, v in model.items())
    for r in got:
        assert bucket_of(r["_hoodie_file_name"].split("_")[0]) == java_list_hash_bucket([str(r["account_id"]), r["branch"]], 4), r
    groups = {(r["_hoodie_partition_path"], r["_hoodie_file_name"].split("_")[0]) for r in got}
    assert len(groups) == 2 * 4
    props = (root / "lake/accounts/.hoodie/hoodie.properties").read_text()
    assert "hoodie.index.type=BUCKET" in props and "hoodie.bucket.index.num.buckets=4" in props


def test_bucket_index_settings_are_checked_with_their_line(tmp_path):
    from tests.conftest import compile_errors, write_project

    def errors(yml: str) -> list[str]:
        root = write_project(tmp_path / str(len(list(tmp_path.iterdir()))), {
            "sources/s.yml": "sources:\n  raw: {kind: files, path: data, format: json, schema: \"id BIGINT, v STRING\"}\n",
            "tables/t.yml": yml, "tables/t.sql": "select * from {{ source('raw') }}\n"})
        return [str(d) for d in compile_errors(root)]

    got = errors("tables:\n  t:\n    key: [id]\n    index: bucket\n")
    assert any("t.yml:4" in e and "index: bucket needs buckets" in e for e in got), got
    got = errors("tables:\n  t:\n    key: [id]\n    buckets: 4\n")
    assert any("t.yml:4" in e and "buckets applies to index: bucket" in e for e in got), got
    got = errors("tables:\n  t:\n    key: [id]\n    index: bucket\n    buckets: 4\n    operation: insert_overwrite\n")
    assert any("index: bucket cannot go with operation insert_overwrite" in e for e in got), got
    got = errors("tables:\n  t:\n    index: bucket\n    buckets: 0\n")
    assert any("needs a key" in e for e in got) and any("buckets" in e and "t.yml:4" in e for e in got), got


@pytest.mark.parametrize("fields,key,sign", [(("code",), "A:1", "':'"), (("code", "branch"), "A,1", "','")])
def test_a_key_whose_bucket_hudis_versions_disagree_on_is_refused_naming_it_and_nothing_is_committed(spark, tmp_path, fields, key, sign):
    path = tmp_path / "codes"
    table = Table.create(spark, str(path), TableConfig(name="codes", record_key_fields=fields, partition_fields=("region",),
                                                       buckets=4))
    good = [("B2", "n", "eu", "fine"), ("Zoë 7", "s", "us", "fine")]
    table.write(spark.createDataFrame(good, "code string, branch string, region string, v string"), "upsert")
    done = [i.time for i in Table.open(spark, str(path)).timeline().completed()]
    with pytest.raises(Exception, match=f"2 new key\\(s\\) hold a {sign} in a key value \\(e.g. '"):
        table.write(spark.createDataFrame([(key, "n", "eu", "bad"), (key + "x", "n", "us", "bad"), ("C3", "n", "eu", "ok")],
                                          "code string, branch string, region string, v string"), "upsert")
    reopened = Table.open(spark, str(path))
    assert sorted(r["v"] for r in reopened.read().collect()) == ["fine", "fine"]
    assert [i.time for i in reopened.timeline().completed() if i.action != "rollback"] == done


def _files(path) -> list[tuple]:
    return sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file())


def test_a_bucket_with_two_file_groups_or_a_partition_level_bucket_index_is_refused_before_anything_is_written(spark, tmp_path):
    """Two stored file groups of one bucket (another writer wrote without the bucket index, or
    with another number of buckets) and Hudi 1.1's partition-level bucket index
    (.hoodie/.hashing_meta/, per-partition bucket numbers from Java regular expressions) are
    refused with the reason: no file changes, no instant is added."""
    import shutil

    from pipe.doctor import READ_ONLY, audit_table

    path = tmp_path / "ledger"
    table = Table.create(spark, str(path), TableConfig(name="ledger", record_key_fields=("id",), partition_fields=("region",),
                                                       precombine_field="ts", buckets=4))
    table.write(spark.createDataFrame(rows(range(300), 1), SCHEMA), "upsert", buckets=4)
    base = sorted((path / "region=eu").glob("00000002-*.parquet"))[0]
    file_id, rest = base.name.split("_", 1)
    twin = base.with_name(f"00000002-{'7' * 8}-{'7' * 4}-{'7' * 4}-{'7' * 4}-{'7' * 12}-0_{rest}")
    shutil.copy(base, twin)  # a second file group of bucket 2, as a writer without the bucket index would add one
    before = _files(path)
    with pytest.raises(TableError, match=r"two file groups for bucket 2 in region=eu \(00000002-.*another writer wrote this table without it"):
        Table.open(spark, str(path)).write(spark.createDataFrame(rows(range(0, 300, 7), 2), SCHEMA), "upsert", buckets=4)
    assert _files(path) == before
    twin.unlink()

    hashing = path / ".hoodie/.hashing_meta"
    hashing.mkdir()
    (hashing / "00000000000000000.hashing_config").write_text(  # what Hudi 1.1's DDL writes (PartitionBucketIndexHashingConfig)
        '{\n  "expressions" : "eu,8",\n  "defaultBucketNumber" : 4,\n  "rule" : "regex",\n  "version" : 1,\n  "instant" : "00000000000000000"\n}')
    before = _files(path)
    with pytest.raises(TableError, match=r"partition-level bucket index \(.hoodie/.hashing_meta/\)"):
        Table.open(spark, str(path)).write(spark.createDataFrame(rows(range(0, 300, 7), 2), SCHEMA), "upsert", buckets=4)
    assert _files(path) == before
    found = audit_table(str(path))
    assert found.verdict == READ_ONLY and "hashing_meta" in found.reason, (found.verdict, found.reason)
