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
