#!/usr/bin/env python
"""What the bloom filter and key range in every base file's footer (runtime/table/bloom.py)
cost a write: pipe's bulk_insert of N rows with them (this tree) against the same write by
the code just before them (a git worktree of --without), side by side in one run on local[2].

Each variant runs in its own process with its own SparkSession, started once; the two take
turns writing, so drift hits both alike. Also measured in-process: the filter and key range
alone per million keys. Results go to the `bloom` section of bench/RESULTS.md.

    python bench/bloom_bench.py                  # 5,000,000 rows, 3 runs each
    python bench/bloom_bench.py --rows 1000000   # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))

from report import write_section  # noqa: E402

WITHOUT = "c8f3dd2"  # the last commit before base files carried the bloom filter


def serve(rows: int) -> None:
    """One variant: a SparkSession, the source cached, a warm-up write; then a timed
    bulk_insert into a fresh table for every `write` line read from stdin. The code under test
    is the tree on PYTHONPATH."""
    sys.path.remove(str(REPO))
    import runtime
    from runtime.spark.session import get_spark
    from runtime.table import Table, TableConfig
    from table_bench import source

    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "3g"}, app_name="pipe-bloom-bench")
    work = Path(tempfile.mkdtemp(prefix="pipe-bloom-bench-"))
    config = TableConfig(name="bench", record_key_fields=("id",), partition_fields=("part",), precombine_field="ts")
    df = source(spark, rows).cache()
    df.count()

    def write() -> tuple[float, float, int]:
        path = work / "t"
        shutil.rmtree(path, ignore_errors=True)
        cpu, started = tree_cpu(os.getpid()), time.perf_counter()
        result = Table.create(spark, str(path), config).write(df, "bulk_insert")
        return time.perf_counter() - started, tree_cpu(os.getpid()) - cpu, result.bytes

    try:
        write()  # warm-up: JIT and Python workers
        print(json.dumps({"ready": True, "runtime": runtime.__file__}), flush=True)
        for line in sys.stdin:
            if line.strip() != "write":
                break
            seconds, cpu, nbytes = write()
            print(json.dumps({"seconds": seconds, "cpu": cpu, "bytes": nbytes}), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system, with those of waited-for children) of a process and all its
    descendants: the driver, Spark's JVM and its Python workers."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))  # ppid; utime stime cutime cstime
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo += [p for p, (ppid, _) in stats.items() if ppid == pid]
    return total / ticks


class Variant:
    def __init__(self, label: str, tree: Path, rows: int):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.label, self.seconds, self.cpu, self.bytes = label, [], [], 0
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", "--rows", str(rows)], cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def write(self) -> None:
        self.proc.stdin.write("write\n")
        answer = self.answer()
        self.seconds.append(answer["seconds"])
        self.cpu.append(answer["cpu"])
        self.bytes = answer["bytes"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def per_million_keys() -> list[tuple[str, float]]:
    """CPU seconds per million keys of BloomFilterWriteSupport alone (filter and key range),
    as a task adds a base file's keys, median of 3 (CPU time: on a shared machine wall time
    measures the neighbours)."""
    import uuid

    import numpy as np
    import pyarrow as pa

    from runtime.table.bloom import BloomFilterWriteSupport

    kinds = {
        "integer keys as text (1 to 7 bytes)": pa.array(np.arange(1_000_000)).cast(pa.string()),
        "UUID keys (36 bytes)": pa.array([str(uuid.UUID(int=i * 0x9E3779B97F4A7C15 % 2**128)) for i in range(1_000_000)]),
        "two-field keys `id:N,name:userN` (~20 bytes)": pa.array([f"id:{i},name:user{i}" for i in range(1_000_000)]),
    }
    out = []
    for label, keys in kinds.items():
        runs = []
        for _ in range(3):
            started = time.process_time()
            support = BloomFilterWriteSupport()
            for at in range(0, len(keys), 1 << 18):  # as a file's row groups come
                support.add_keys(keys.slice(at, 1 << 18))
            support.finalize_metadata()
            runs.append(time.process_time() - started)
        out.append((label, _median(runs)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--without", default=WITHOUT, help="git revision of the code without the bloom filter")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.rows)
        return

    started = time.perf_counter()
    load_before = os.getloadavg()
    keys = per_million_keys()
    old = Path(tempfile.mkdtemp(prefix="pipe-without-bloom-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.without], check=True)
    variants = []
    try:
        variants = [Variant("with the bloom filter", REPO, args.rows), Variant(f"without ({args.without})", old, args.rows)]
        for v, tree in zip(variants, (REPO, old)):
            ready = v.answer()
            assert ready.get("ready") and Path(ready["runtime"]).is_relative_to(tree), (v.label, ready)
        for _ in range(args.repeats):
            for v in variants:
                v.write()
    finally:
        for v in variants:
            v.close()
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    whole = time.perf_counter() - started
    load_after = os.getloadavg()

    with_, without = variants
    overhead = _median(with_.seconds) / _median(without.seconds) - 1
    cpu_overhead = _median(with_.cpu) / _median(without.cpu) - 1
    lines = [
        "## Bloom filter and key range in base-file footers: what they cost a write",
        "",
        "Generated by `python bench/bloom_bench.py` — do not edit by hand; run the script again.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; Python {platform.python_version()}; Spark local[2]; whole run {whole:.0f} s",
        f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in load_before)}, after: {' / '.join(f'{x:.2f}' for x in load_after)}",
        f"- pipe bulk_insert of {args.rows:,} rows (bench/table_bench.py's source: key `id`, 10 partitions), into a fresh table each run; "
        f"median of {args.repeats} runs per variant after a warm-up write, the two variants taking turns, each in its own process and SparkSession. "
        f"\"without\" is the code at {args.without}, the last commit before the footers carried the filter.",
        "",
        "- CPU s: user + system CPU of the variant's whole process tree (driver, Spark's JVM, its Python workers) during the write.",
        "",
        "| variant | median wall s | runs wall s | median CPU s | runs CPU s | bytes written |",
        "|---|---:|---|---:|---|---:|",
    ]
    for v in variants:
        lines.append(f"| pipe bulk_insert, {v.label} | {_median(v.seconds):.1f} | {', '.join(f'{x:.1f}' for x in v.seconds)} | "
                     f"{_median(v.cpu):.1f} | {', '.join(f'{x:.1f}' for x in v.cpu)} | {v.bytes:,} |")
    lines += [
        "",
        f"Overhead of the bloom filter on the write: **{overhead * 100:+.0f}% wall time, {cpu_overhead * 100:+.0f}% CPU time** (median against median).",
        "",
        "The filter and key range alone, per million keys of one base file, in one Python process (as an executor task computes them):",
        "",
        "| keys | CPU s per million keys |",
        "|---|---:|",
        *[f"| {label} | {seconds:.2f} |" for label, seconds in keys],
        "",
        "The filter is Hudi's default (DYNAMIC_V0, 60,000 entries per row at fpp 1e-9, bounded at 100,000 entries): 30 MurmurHash hashes per key, "
        "vectorised with numpy over the keys of one byte length, the four-byte blocks mixed once for all 30 hashes. Each footer gains "
        "431 KB of text for a file of up to 60,000 keys and 862 KB above (two rows of bits, as Java writes); past 100,000 keys the filter "
        "saturates, as Java's does at these defaults.",
    ]
    write_section("bloom", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
