"""`pipe doctor`: the audit of an existing lake before pipe writes to it (issue 41, part 5), on
tables Hudi's Java writers made (the fixtures), on pipe's own tables with writes under way, and
on what is not a table at all. Java 1.1's version 8 and 9 tables: test_java_interop.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from runtime.table import Table, TableConfig
from runtime.table.config import MERGE_ON_READ
from tests.conftest import REPO, write_project

FIXTURES = REPO.parent / "shared" / "fixtures" / "hudi"


def doctor(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pipe", "doctor", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def tables(done: subprocess.CompletedProcess) -> dict[str, dict]:
    return {Path(t["path"]).name: t for t in json.loads(done.stdout)["tables"]}


@pytest.fixture(scope="module")
def java_lake(tmp_path_factory) -> Path:
    """Every table of the fixtures (written by Hudi 0.14/0.15's Java writers) in one lake."""
    lake = tmp_path_factory.mktemp("doctor") / "lake"
    for z in sorted(FIXTURES.glob("*.zip")):
        with zipfile.ZipFile(z) as f:
            f.extractall(lake / z.stem)
    return lake


def test_every_table_of_a_java_lake_is_found_and_judged_by_the_rules_pipe_writes_by(java_lake, tmp_path):
    done = doctor(tmp_path, str(java_lake), "--output", "json")
    assert done.returncode == 1, done.stdout + done.stderr  # some table needs a change before pipe writes it
    found = json.loads(done.stdout)["tables"]
    assert len(found) == len(list(FIXTURES.glob("*.zip")))  # one per fixture, none twice, no metadata table taken for one
    by_fixture = {Path(t["path"]).parent.name: t for t in found}
    assert all(t["version"] == 6 and t["timeline_layout"] == 1 for t in found)
    meta = by_fixture["cow_v6_simplekeygen_hivestyle_no_metafields"]
    assert meta["verdict"] == "read_only" and "hoodie.populate.meta.fields=false" in meta["reason"] and meta["meta_fields"] is False
    timed = by_fixture["cow_v6_timebasedkeygen_nonhivestyle"]
    assert timed["verdict"] == "read_only" and "TimestampBasedKeyGenerator" in timed["reason"]
    complex_ = by_fixture["cow_v6_complexkeygen_hivestyle"]
    assert complex_["verdict"] == "ready" and complex_["reason"] is None
    assert (complex_["record_key"], complex_["partition_fields"], complex_["key_generator"]) == (["id", "name"], ["byteField", "shortField"],
                                                                                                 "ComplexKeyGenerator")
    assert complex_["hive_style"] is True and complex_["ordering_fields"] == ["longField"] and complex_["instants"] == 2
    mor = by_fixture["mor_parquet_v6_nonpartitioned_rollback"]
    assert mor["type"] == "merge_on_read" and mor["partition_fields"] == [] and mor["instants"] == 3
    # Java's tables keep local time: said, as what pipe does about it
    assert complex_["timeline_timezone"] == "LOCAL" and any("local time" in n for n in complex_["notes"])

    text = doctor(tmp_path, str(java_lake))
    assert text.returncode == 1 and "Traceback" not in text.stdout + text.stderr
    assert "read only: pipe reads it, and will not write it: its key generator TimestampBasedKeyGenerator" in text.stdout
    # read only: the two tables without meta fields (copy-on-write and merge-on-read) and the time-based key generator's
    assert sorted(k for k, t in by_fixture.items() if t["verdict"] != "ready") == [
        "cow_v6_simplekeygen_hivestyle_no_metafields", "cow_v6_timebasedkeygen_nonhivestyle", "mor_parquet_v6_simplekeygen_hivestyle_no_metafields"]
    assert text.stdout.rstrip().endswith(f"{len(found)} tables: {len(found) - 3} ready, 3 read only, 0 not readable by pipe")


@pytest.mark.spark
def test_a_project_lake_is_audited_by_default_with_the_writes_under_way(spark, tmp_path):
    """pipe's own tables are ready; a write whose Java writer still beats is named as a running
    writer, one whose writer is gone as a failed write pipe rolls back; exit 0."""
    root = write_project(tmp_path / "p", {})
    orders = Table.create(spark, str(root / "lake" / "orders"),
                          TableConfig(name="orders", table_type=MERGE_ON_READ, record_key_fields=("id", "region"),
                                      partition_fields=("region",), precombine_field="ts"))
    rows = [(i, ["emea", "apac", "amer"][i % 3], 1_700_000_000_000 + i, f"naïve \"{i}\"") for i in range(2000)]
    for n in range(3):
        orders.write(spark.createDataFrame(rows[n * 500:(n + 1) * 500 + 100], "id bigint, region string, ts bigint, v string"), "upsert")
    hoodie = root / "lake" / "orders" / ".hoodie"
    (hoodie / "20990101000000000.deltacommit.requested").write_bytes(b"")  # a Java writer's, beating now
    (hoodie / ".heartbeat").mkdir(exist_ok=True)
    (hoodie / ".heartbeat" / "20990101000000000").write_bytes(b"")
    (hoodie / "20990101000000001.deltacommit.requested").write_bytes(b"")  # one whose heartbeat stopped long ago
    stale = hoodie / ".heartbeat" / "20990101000000001"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))

    done = doctor(root, "--output", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    t = tables(done)["orders"]
    assert (t["verdict"], t["version"], t["type"], t["timeline_timezone"]) == ("ready", 6, "merge_on_read", "UTC")
    assert t["instants"] == 3 and t["record_key"] == ["id", "region"] and t["metadata_table"] is None
    pending = {p["instant"]: p for p in t["pending"]}
    assert set(pending) == {"20990101000000000", "20990101000000001"}
    assert "writer_alive_ms" in pending["20990101000000000"] and "writer_alive_ms" not in pending["20990101000000001"]
    assert any("20990101000000000" in n and "writer is alive" in n for n in t["notes"])
    assert any("20990101000000001" in n and "pipe rolls back" in n for n in t["notes"])
    text = doctor(root)
    assert text.returncode == 0 and "1 table: 1 ready, 0 read only, 0 not readable by pipe" in text.stdout
    assert "lake/orders" in text.stdout and "id, region (ComplexKeyGenerator)" in text.stdout


def test_what_is_not_a_lake_is_said_in_one_line_and_exits_2(tmp_path):
    missing = doctor(tmp_path, str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no folder" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "raw" / "2024").mkdir(parents=True)
    (tmp_path / "raw" / "2024" / "a.json").write_text("{}")
    empty = doctor(tmp_path, str(tmp_path / "raw"))
    assert empty.returncode == 2 and "no Hudi table under" in empty.stdout


def test_a_damaged_table_is_reported_not_a_traceback_and_junk_in_its_timeline_is_ignored(java_lake, tmp_path):
    lake = tmp_path / "lake [prod]"  # rich markup characters in a path print as they are
    bad = lake / "broken" / ".hoodie"
    bad.mkdir(parents=True)
    (bad / "hoodie.properties").write_bytes(b"hoodie.table.type=COPY_ON_WRITE\n\xff\xfe not a name\n")
    odd = lake / "odd" / ".hoodie"  # another writer's text that is rich markup, and a layout that is no number
    odd.mkdir(parents=True)
    (odd / "hoodie.properties").write_text("hoodie.table.name=[/x]odd[bold]\nhoodie.table.type=COPY_ON_WRITE\n"
                                           "hoodie.table.version=6\nhoodie.timeline.layout.version=x\n"
                                           "hoodie.table.recordkey.fields=[/k]\n")
    good = lake / "good"
    with zipfile.ZipFile(FIXTURES / "cow_v6_nonpartitioned.zip") as f:
        f.extractall(good)
    table = next(good.glob("*/.hoodie")).parent
    for junk in ("..commit", "2024.commit.requested.x", "../../etc.commit", "99999999999999999999.commit", "20240101000000000.unknown"):
        try:
            (table / ".hoodie" / junk).write_text("")
        except OSError:
            pass
    done = doctor(tmp_path, str(lake))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "lake [prod]/broken" in done.stdout and "not readable by pipe: its .hoodie/hoodie.properties cannot be read" in done.stdout
    assert "[/x]odd[bold]: version 6" in done.stdout and "[/k]" in done.stdout
    found = tables(doctor(tmp_path, str(lake), "--output", "json"))
    assert found["broken"]["verdict"] == "unreadable" and found["odd"]["verdict"] != "ready"
    assert found[table.name]["instants"] == 2 and found[table.name]["pending"] == []


def test_a_lake_on_s3_is_audited_through_the_targets_s3a_settings(moto_server, tmp_path):
    """Tables in a bucket (the fixtures, uploaded as Java wrote them), found and judged through
    the endpoint and credentials of the target's fs.s3a settings, which appear nowhere in what
    pipe prints."""
    import boto3
    import yaml

    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    s3.create_bucket(Bucket="doctor-lake")
    for name in ("cow_v6_complexkeygen_hivestyle", "cow_v6_timebasedkeygen_nonhivestyle"):
        with zipfile.ZipFile(FIXTURES / f"{name}.zip") as f:
            for entry in f.infolist():
                if not entry.is_dir():
                    s3.put_object(Bucket="doctor-lake", Key=f"prod/{name}/{entry.filename}", Body=f.read(entry))
    secret = "s3cr3t-for-doctor"
    conf = {"spark.hadoop.fs.s3a.endpoint": moto_server, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.access.key": "testing",
            "spark.hadoop.fs.s3a.secret.key": secret}
    root = write_project(tmp_path / "p", {"pipe_project.yml": yaml.safe_dump(
        {"name": "d", "default_target": "prod", "targets": {"prod": {"lake": "s3a://doctor-lake/prod", "spark": {"master": "local[2]", "conf": conf}}}})})
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "AWS_ACCESS_KEY_ID": "nope", "AWS_SECRET_ACCESS_KEY": "nope"}
    done = subprocess.run([sys.executable, "-m", "pipe", "doctor", "--output", "json"], capture_output=True, text=True, cwd=root,
                          env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    found = {t["path"].split("/")[-2]: t for t in json.loads(done.stdout)["tables"]}
    assert sorted(found) == ["cow_v6_complexkeygen_hivestyle", "cow_v6_timebasedkeygen_nonhivestyle"]
    assert found["cow_v6_complexkeygen_hivestyle"]["path"].startswith("s3a://doctor-lake/prod/")
    assert (found["cow_v6_complexkeygen_hivestyle"]["verdict"], found["cow_v6_complexkeygen_hivestyle"]["instants"]) == ("ready", 2)
    assert found["cow_v6_timebasedkeygen_nonhivestyle"]["verdict"] == "read_only"
    text = subprocess.run([sys.executable, "-m", "pipe", "doctor", "s3://doctor-lake/prod/cow_v6_complexkeygen_hivestyle"],
                          capture_output=True, text=True, cwd=root, env=env, timeout=120)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "1 table: 1 ready" in text.stdout and secret not in text.stdout + text.stderr + done.stdout + done.stderr
