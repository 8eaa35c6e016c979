#!/usr/bin/env python
"""Does an upsert's cost follow the data it touches, or the table's size? A fixed upsert of
50,000 rows (25,000 updates of recent keys, 25,000 new keys) into tables of 1M and 16M rows
built the same way, copy-on-write and merge-on-read, in one warm pipe session on local[2].

The tables are an order ledger growing by day: keys from a sequence (`order-000000001234`,
time-ordered as database ids are), 100,000 rows per day partition, bulk-inserted with
GLOBAL_SORT, so every day is one file group of the same size whatever the table's size (1M
rows: 10 days; 16M: 160 days). An upsert updates keys of the latest day and adds new keys to
it, so the data it touches is the same at both sizes; the lookup's range pruning
(runtime/table/bloom_index.py) is what lets it skip the other days' files. With
`--keys random` the keys are hashes instead (no order): every file's range spans the key
space, nothing is pruned by ranges, and the bloom filters are asked instead. With
`--index record` the tables keep Hudi's record index in their metadata table (`index: record`,
runtime/table/record_index.py; built by the unmeasured warm-up upsert): the lookup reads only the
file groups the index names for the batch's keys, whatever the keys look like. `--index
global,global-general` races the global index against itself with its partition tasks turned
off (`writer._keys_stay_put` answering no): the general path's joins, as every global upsert
took before a batch whose keys stay put was decided in partition tasks.

Repeats are interleaved (1M, 16M, 1M, ...), each after one unmeasured warm-up upsert per
table. Wall and CPU seconds (the process tree: the driver and its JVM) and peak memory; the
machine's load is recorded, and a run during which other processes took more than a tenth of
the machine is marked as no result. Results go to the `scale` section of bench/RESULTS.md.

    python bench/scale_bench.py                          # 1M and 16M, 3 repeats (~25 min)
    python bench/scale_bench.py --sizes 200000,1000000 --repeats 1 --section scratch   # quick
    python bench/scale_bench.py --keys random --index global,record --section scale-record-index
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH_DIR))

from report import Load, Measure, median, tree, write_section

PER_DAY = 100_000
UPDATES = NEW = 25_000
BASE_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z in epoch millis
DAY = 86_400_000
CONF = {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "3g", "spark.driver.extraJavaOptions": "-XX:+UseG1GC"}
TYPES = ("COPY_ON_WRITE", "MERGE_ON_READ")


def key_sql(seq: str, keys: str) -> str:
    if keys == "random":
        return f"sha2(cast({seq} as string), 256)"
    return f"concat('order-', lpad(cast({seq} as string), 12, '0'))"


def rows(spark, start: int, end: int, keys: str, version: int, where: str | None = None):
    """Orders start..end-1 (sequence numbers): day partition from the sequence, ts in epoch millis."""
    df = spark.range(start, end)
    if where:
        df = df.where(where)
    return df.selectExpr(
        f"{key_sql('id', keys)} as order_id",
        f"date_format(timestamp_millis({BASE_TS} + (id div {PER_DAY}) * {DAY}), 'yyyy-MM-dd') as day",
        f"{BASE_TS} + (id div {PER_DAY}) * {DAY} + (id % {PER_DAY}) * 800 + {version} as ts",
        "cast((id * 7919) % 1000000 as decimal(12, 2)) / 100 as amount",
        f"concat('note é \"', cast(id % 97 as string), '\" v{version}') as note")


def build(spark, root: Path, size: int, table_type: str, keys: str, index: str = "global"):
    from runtime.table import Table, TableConfig

    record = index == "record"
    config = TableConfig(f"orders_{size}_{table_type.lower()}_{index}", table_type=table_type, record_key_fields=("order_id",),
                         partition_fields=("day",), precombine_field="ts", metadata_table=record, record_index=record)
    table = Table.create(spark, str(root / config.name), config)
    table.write(rows(spark, 0, size, keys, 0), "bulk_insert", bulk_insert_sort_mode="GLOBAL_SORT")
    return table


@contextlib.contextmanager
def general_path(on: bool):
    """With `on`: global upserts take the general path even when their keys stay put."""
    from runtime.table import writer

    real = writer._keys_stay_put
    if on:
        writer._keys_stay_put = lambda *args: False
    try:
        yield
    finally:
        writer._keys_stay_put = real


def upsert(spark, table, size: int, round_: int, keys: str):
    """25,000 updates of the latest day's keys (a different quarter each round) and 25,000 new keys."""
    last_day = (size - 1) // PER_DAY * PER_DAY
    updates = rows(spark, last_day, size, keys, round_, where=f"id % 4 = {round_ % 4}").limit(UPDATES)
    new = rows(spark, size + round_ * NEW, size + (round_ + 1) * NEW, keys, round_)
    # the new keys stay in the latest day: a table keeps its size class
    new = new.selectExpr("order_id", f"date_format(timestamp_millis({BASE_TS + last_day // PER_DAY * DAY}), 'yyyy-MM-dd') as day",
                         "ts", "amount", "note")
    return table.write(updates.unionByName(new), "upsert", clean_inline=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,16000000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", choices=("sequence", "random"), default="sequence")
    ap.add_argument("--index", default="global",
                    help="global, record, global-general (global without its partition tasks), or several (global,record), raced side by side")
    ap.add_argument("--section", default="scale")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    indexes = args.index.split(",")
    if not set(indexes) <= {"global", "record", "global-general"}:
        ap.error("--index takes global, record, global-general or several of them (global,record)")
    kinds = [(t, i) for t in TYPES for i in indexes]  # (table type, index)

    from runtime.spark.session import get_spark

    spark = get_spark("local[2]", CONF, app_name="scale-bench")
    work = Path(tempfile.mkdtemp(prefix="pipe-scale-", dir=os.environ.get("BENCH_TMP")))
    tables, built = {}, {}
    try:
        for size in sizes:
            for table_type, index in kinds:
                with Measure(lambda: tree([os.getpid()])) as m:
                    tables[(size, table_type, index)] = build(spark, work, size, table_type, args.keys, index)
                built[(size, table_type, index)] = m
                print(f"built {size:>10,} {table_type:<14} {index:<7} {m.seconds:7.1f} s", flush=True)
                with general_path(index == "global-general"), Measure(lambda: tree([os.getpid()])) as m:  # warm-up, unmeasured (it builds a record index)
                    upsert(spark, tables[(size, table_type, index)], size, 0, args.keys)
                print(f"warm-up {size:>10,} {table_type:<14} {index:<7} {m.seconds:7.1f} s", flush=True)
        load = Load(every=2.0)
        load.start()
        times: dict[tuple[int, str, str], list[Measure]] = {k: [] for k in tables}
        for r in range(1, args.repeats + 1):
            for size in (sizes if r % 2 else sizes[::-1]):
                for table_type, index in (kinds if r % 2 else kinds[::-1]):
                    with general_path(index == "global-general"), Measure(lambda: tree([os.getpid()])) as m:
                        upsert(spark, tables[(size, table_type, index)], size, r, args.keys)
                    times[(size, table_type, index)].append(m)
                    print(f"upsert {size:>10,} {table_type:<14} {index:<7} {m.seconds:6.2f} s  cpu {m.cpu:6.1f} s  peak {m.peak:6.0f} MB",
                          flush=True)
        load.stop()
        files = {k: len(t.view().latest_slices()) for k, t in tables.items()}
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    whole = load.others / max(1e-9, sum(m.seconds for ms in times.values() for m in ms)) / (os.cpu_count() or 1)
    busy = whole > 0.1
    lines = [f"{dt.date.today()}, {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
             f"keys: {args.keys}; index: {args.index}; {args.repeats} interleaved repeats per table after one warm-up upsert; load average "
             f"{load.before[0]:.2f} before, {median(load.loads) if load.loads else 0:.2f} median, {max(load.loads or [0]):.2f} max; "
             f"other processes took {100 * whole:.0f}% of the machine" + (" — **busy: not a result**" if busy else ""),
             "", "Command: `python bench/scale_bench.py" + (f" --sizes {args.sizes}" if args.sizes != "1000000,16000000" else "")
             + (f" --keys {args.keys}" if args.keys != "sequence" else "") + (f" --index {args.index}" if args.index != "global" else "")
             + (f" --repeats {args.repeats}" if args.repeats != 3 else "") + "`", "",
             "| table | index | rows | file groups | build s | upsert wall s (median) | upsert CPU s (median) | peak MB | wall / smallest | CPU / smallest |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for table_type, index in kinds:
        wall0 = median([m.seconds for m in times[(sizes[0], table_type, index)]])
        cpu0 = median([m.cpu for m in times[(sizes[0], table_type, index)]])
        for size in sizes:
            k = (size, table_type, index)
            ms = times[k]
            wall, cpu = median([m.seconds for m in ms]), median([m.cpu for m in ms])
            lines.append(f"| {table_type.lower().replace('_', '-')} | {index} | {size:,} | {files[k]} | {built[k].seconds:.0f} | "
                         f"{wall:.2f} | {cpu:.1f} | {max(m.peak for m in ms):.0f} | {wall / wall0:.2f}x | {cpu / cpu0:.2f}x |")
    body = "\n".join(lines)
    print(body)
    title = (f"An upsert of 50,000 rows into tables of {' and '.join(f'{s:,}' for s in sizes)} rows ({args.keys} keys"
             + (f"; index {args.index})" if args.index != "global" else ")"))
    write_section(args.section, f"## {title}\n\n{__doc__.split(chr(10) + chr(10))[0].strip()}\n\n{body}\n")


if __name__ == "__main__":
    main()
