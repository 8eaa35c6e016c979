"""The storage interface behaves the same on a local folder and on S3 (a real moto server):
atomic writes, exclusive creates (how instants complete), listing and deletes."""

from __future__ import annotations

import pytest

from runtime.storage import StorageSpec, open_storage
from runtime.table.timeline import COMMIT, INFLIGHT, REQUESTED, Instant, Timeline, new_instant_time


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(StorageSpec(str(tmp_path / "root")))
    bucket, endpoint = request.getfixturevalue("s3_bucket")
    return open_storage(StorageSpec(f"s3://{bucket}/lake/t", (("endpoint_url", endpoint), ("region", "us-east-1"))))


def test_exclusive_create_succeeds_once_and_keeps_the_first_content(storage):
    assert storage.create_exclusive(".hoodie/1.commit", b"first") is True
    assert storage.create_exclusive(".hoodie/1.commit", b"second") is False
    assert storage.read_bytes(".hoodie/1.commit") == b"first"


def test_atomic_write_replaces_and_lists(storage):
    storage.write_atomic("p=a/f1.parquet", b"abc")
    storage.write_atomic("p=a/f1.parquet", b"abcd")
    storage.write_atomic("p=b/x/f2.parquet", b"z")
    storage.write_atomic(".hoodie/hoodie.properties", b"k=v")
    files = {f.path: f.size for f in storage.list_files("")}
    assert files == {"p=a/f1.parquet": 4, "p=b/x/f2.parquet": 1, ".hoodie/hoodie.properties": 3}
    assert [f.path for f in storage.list_files("p=a", recursive=False)] == ["p=a/f1.parquet"]
    assert storage.list_dirs("") == [".hoodie", "p=a", "p=b"]
    assert storage.exists("p=a/f1.parquet") and not storage.exists("p=a/nope")
    storage.delete("p=a/f1.parquet")
    storage.delete("p=a/f1.parquet")  # deleting twice is fine
    assert not storage.exists("p=a/f1.parquet")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("p=a/f1.parquet")


def test_timeline_on_storage(storage):
    t1 = new_instant_time()
    t2 = new_instant_time(t1)
    assert len(t1) == 17 and t2 > t1
    storage.write_atomic(f".hoodie/{t1}.commit.requested", b"")
    storage.write_atomic(f".hoodie/{t1}.inflight", b"{}")
    storage.create_exclusive(f".hoodie/{t1}.commit", b'{"operationType": "UPSERT", "extraMetadata": {"pipe.checkpoint.s": "42"}}')
    storage.write_atomic(f".hoodie/{t2}.commit.requested", b"")
    timeline = Timeline.load(storage)
    assert timeline.instants == [Instant(t1, COMMIT, "completed"), Instant(t2, COMMIT, REQUESTED)]
    assert timeline.pending() == [Instant(t2, COMMIT, REQUESTED)]
    assert timeline.commit_metadata(timeline.completed()[0]).checkpoints() == {"s": "42"}
    assert Instant(t2, COMMIT, INFLIGHT).file_name() == f"{t2}.inflight"


def test_instant_times_strictly_increase_back_to_back():
    times = [new_instant_time() for _ in range(2000)]
    assert times == sorted(set(times))


def test_markers_and_heartbeats_work_the_same_on_both_storages(storage):
    import time

    from runtime.table import heartbeat, markers

    markers.create(storage, "20260101000000001", "city=S%C3%A3o Paulo/f1_0-1-0_20260101000000001.parquet", markers.CREATE)
    markers.create(storage, "20260101000000001", ".f2_20251231000000000.log.1_0-1-0", markers.APPEND)
    # Java's timeline-server markers for another instant
    storage.write_atomic(".hoodie/.temp/20260101000000002/MARKERS.type", b"TIMELINE_SERVER_BASED")
    storage.write_atomic(".hoodie/.temp/20260101000000002/MARKERS0", b"p/f3_1-0-1_20260101000000002.parquet.marker.MERGE\n")
    assert [(m.path, m.io_type) for m in markers.read(storage, "20260101000000001")] == [
        (".f2_20251231000000000.log.1_0-1-0", "APPEND"), ("city=S%C3%A3o Paulo/f1_0-1-0_20260101000000001.parquet", "CREATE")]
    assert [(m.path, m.io_type) for m in markers.read(storage, "20260101000000002")] == [("p/f3_1-0-1_20260101000000002.parquet", "MERGE")]
    names = [f.path for f in storage.list_files(".hoodie/.temp")]
    assert not [n for n in names if n.endswith(".tmp")]  # Java takes every file there for a marker
    markers.delete_dir(storage, "20260101000000001")
    assert markers.read(storage, "20260101000000001") == [] and markers.read(storage, "20260101000000002")

    storage.write_atomic(".hoodie/.heartbeat/20260101000000003", b"")  # a Java writer's
    heartbeat.beat(storage, "20260101000000004", "host:1:abc")  # a (dead) pipe writer's
    now = int(time.time() * 1000)
    live = heartbeat.live_foreign(storage, ["20260101000000003", "20260101000000004", "20260101000000005"], now)
    assert list(live) == ["20260101000000003"]
    assert heartbeat.live_foreign(storage, ["20260101000000003"], now + heartbeat.EXPIRY_MS + 5_000) == {}
    heartbeat.stop(storage, "20260101000000004")
    assert not storage.exists(".hoodie/.heartbeat/20260101000000004")


def test_a_file_pipe_replaces_or_deletes_loses_the_crc_javas_local_file_system_kept(tmp_path):
    """Java Hudi on a local disk (Hadoop's LocalFileSystem) writes `.<name>.crc` beside each file
    and refuses to read a file that no longer matches it: after pipe rewrote hoodie.properties of
    a table Java had written, Java failed with "Could not load Hoodie properties"."""
    storage = open_storage(StorageSpec(str(tmp_path)))
    hoodie = tmp_path / ".hoodie"
    hoodie.mkdir()
    for name in ("hoodie.properties", "20240101000000000.commit", "gone.parquet"):
        (hoodie / name).write_bytes(b"java's bytes")
        (hoodie / f".{name}.crc").write_bytes(b"crc of java's bytes")
    storage.write_atomic(".hoodie/hoodie.properties", b"pipe's bytes")
    assert storage.create_exclusive(".hoodie/new.commit", b"{}")
    storage.delete(".hoodie/gone.parquet")
    assert (hoodie / "hoodie.properties").read_bytes() == b"pipe's bytes"
    assert sorted(p.name for p in hoodie.iterdir()) == [".20240101000000000.commit.crc", "20240101000000000.commit",
                                                         "hoodie.properties", "new.commit"]


def test_a_path_that_leaves_the_root_is_refused_before_any_io(storage, tmp_path):
    """Paths read from a table's own files (markers, plans) reach the storage: `..` never
    leaves the table, on a local folder or in a bucket."""
    from runtime.storage import PathOutsideRoot

    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    storage.write_atomic("p=a/f1.parquet", b"abc")
    for bad in ("../precious.txt", "p=a/../../precious.txt", "p=a/../../../t/p=a/f1.parquet", "..", "p=a/f1\0.parquet"):
        for op in (storage.delete, storage.read_bytes, storage.exists, lambda p: storage.write_atomic(p, b"x"),
                   lambda p: storage.create_exclusive(p, b"x"), storage.full_path, storage.list_files):
            with pytest.raises(PathOutsideRoot, match="leaves the table's folder"):
                op(bad)
    assert outside.read_text() == "keep me" and storage.read_bytes("p=a/f1.parquet") == b"abc"
    # what stays inside the root is still served: a leading / is the root, `.` parts are ignored
    assert storage.read_bytes("/p=a/./f1.parquet") == b"abc"
    assert [f.path for f in storage.list_files("")] == ["p=a/f1.parquet"]


def test_a_parquet_files_key_column_is_read_in_ranges_on_both_storages(storage):
    """bloom_index reads a base file's record keys only, through RangedFile on S3: a few ranged
    reads of the footer and the key column's chunk, never the whole file."""
    import io
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from runtime.storage import RangedFile
    from runtime.table import bloom_index

    keys = [f"k-{i:06d}-é'\"" for i in range(20_000)]
    table = pa.table({"_hoodie_record_key": keys, "payload": [os.urandom(100).hex() for _ in range(20_000)]})  # 4 MB that do not compress
    out = io.BytesIO()
    pq.write_table(table, out, compression="snappy")
    data = out.getvalue()
    storage.write_atomic("p=1/base.parquet", data)
    assert bloom_index._stored_keys(storage, "p=1/base.parquet", len(data)).to_pylist() == keys
    reads = []
    real = storage.read_range

    def counted(path, start, end):
        reads.append(end - start)
        return real(path, start, end)

    storage.read_range = counted
    got = pq.read_table(RangedFile(storage, "p=1/base.parquet", len(data)), columns=["_hoodie_record_key"]).column(0).to_pylist()
    assert got == keys
    assert 0 < sum(reads) < len(data) / 3 and len(reads) <= 6  # the payload column is never read
    assert bloom_index._stored_keys(storage, "p=1/missing.parquet", 100) is None
