"""The run lock: a second `pipe run` of the same lake is refused at once, before Spark starts,
naming the run that holds the lock; a lock left by a dead process is taken over."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from runtime import run_lock
from tests.test_run import ONE_SOURCE, pipe, project, run_ok, run_results, write_jsonl

TABLE = {"sources/s.yml": ONE_SOURCE, "tables/t.yml": "tables:\n  t:\n    key: [id]\n", "tables/t.sql": "select id, v from {{ source('s') }}\n"}


def _lock(root, pid: int, started_at: str = "2026-11-24T01:02:03+00:00", expires_in_s: float = 600) -> None:
    path = root / "lake" / run_lock.LOCK_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started_at": started_at,
                                "expires_ms": int((time.time() + expires_in_s) * 1000), "token": "x", "command": "pipe run"}))


def test_a_second_run_is_refused_at_once_naming_the_first(tmp_path, capsys):
    root = project(tmp_path, TABLE)
    write_jsonl(root / "data/s/s-1.json", [{"id": 1, "v": "a"}])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock(root, other.pid)
        started = time.monotonic()
        code, out, err = pipe(capsys, root, "run")
        took = time.monotonic() - started
    finally:
        other.kill()
        other.wait()
    assert code == 1, out + err
    assert f"another run is in progress (pid {other.pid}, host {socket.gethostname()}, since 2026-11-24 01:02:03 UTC)" in err
    assert "nothing was run" in err and "Traceback" not in err
    assert took < 10, "refused before any step (or Spark) started"
    assert not (root / "target/run_results.json").exists() and not (root / "lake/t").exists()
    assert (root / "lake" / run_lock.LOCK_PATH).exists(), "the other run's lock stays"
    # a dry run writes nothing and is not held up
    code, out, err = pipe(capsys, root, "run", "--dry-run")
    assert code == 0, err


def test_a_lock_of_a_dead_process_is_taken_over_and_released_after_the_run(spark, tmp_path, capsys):
    root = project(tmp_path, TABLE)
    write_jsonl(root / "data/s/s-1.json", [{"id": 1, "v": "a"}])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _lock(root, gone.pid)
    run_ok(capsys, root)
    assert run_results(root)["steps"][-1]["inserts"] == 1
    assert not (root / "lake" / run_lock.LOCK_PATH).exists(), "released at the end of the run"


def test_an_expired_lock_of_another_host_is_stale_and_a_live_one_is_not():
    now = time.time() * 1000
    other = run_lock.Holder(1, "some-other-host", "2026-11-24T01:02:03+00:00", int(now + 60_000), "t")
    assert not other.is_stale(now)
    assert other.is_stale(now + 120_000)


def test_a_lake_that_cannot_be_written_stops_the_run_with_where(tmp_path, capsys):
    root = project(tmp_path, TABLE)
    (root / "lake").write_text("a file where the lake's folder should be")
    code, out, err = pipe(capsys, root, "run")
    assert code == 1, out + err
    assert "cannot take the run lock" in err and str(root / "lake" / run_lock.LOCK_PATH) in " ".join(err.split()), err
    assert "nothing was run" in err and "Traceback" not in err and "internal error" not in err


def test_a_run_whose_lock_was_taken_over_knows_it(tmp_path):
    """A run that looked dead and lost its lock to another run does not write the lake's record of
    its latest successful run (runtime/run_record.py): run_lock.still_holds says so."""
    lake = tmp_path / "lake"
    lake.mkdir()
    with run_lock.hold(str(lake), ()) as me:
        assert run_lock.still_holds(str(lake), (), me)
        other = json.loads((lake / run_lock.LOCK_PATH).read_text())
        (lake / run_lock.LOCK_PATH).write_text(json.dumps({**other, "token": "someone-else"}))
        assert not run_lock.still_holds(str(lake), (), me)
    assert not run_lock.still_holds(str(lake), (), me)
