"""Bootstrap: an existing Parquet dataset (a folder, partitioned or not) becomes a pipe table.

Full-record mode: the dataset's rows are read by Spark and written as the table's first commit
(operationType BOOTSTRAP), a bulk_insert: meta columns added, rows sorted by the table's
`bulk_insert_sort_mode`, files under their Hudi names. The original dataset is not touched.

`partition_regex` chooses which partitions are bootstrapped: a partition is the folder of a
data file relative to the dataset (`region=eu`, `2024/01/02`), and it is taken when the
expression matches that whole path.

Metadata-only mode (skeleton files of meta columns pointing at the original files through a
bootstrap index) is not offered: see docs/tables.md, "Bootstrap"."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runtime.storage import StorageSpec, open_storage


class BootstrapError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass
class Dataset:
    uri: str
    partitions: list[str]  # folders (relative) with the data files taken; "" for files at the top
    skipped: list[str] = field(default_factory=list)  # partitions partition_regex left out
    files: int = 0
    bytes: int = 0

    def describe(self) -> str:
        where = f"{len(self.partitions)} partition(s)" if self.partitions != [""] else "no partitions"
        left = f", {len(self.skipped)} partition(s) left out by partition_regex" if self.skipped else ""
        return f"{self.files} Parquet file(s), {self.bytes:,} bytes in {where} of {self.uri}{left}"


def _hidden(part: str) -> bool:
    # what Spark's file index skips too (_SUCCESS, _temporary, .crc files), except k=v folders
    return part.startswith((".", "_")) and "=" not in part


def scan(uri: str, partition_regex: str | None = None, storage_options: tuple = ()) -> Dataset:
    """Lists the dataset's Parquet files (metadata only) and selects its partitions."""
    storage = open_storage(StorageSpec(uri, storage_options))
    try:
        listed = storage.list_files("", recursive=True)
    except FileNotFoundError:
        listed = []
    by_partition: dict[str, list[int]] = {}
    for f in listed:
        parts = f.path.split("/")
        if any(_hidden(p) for p in parts) or not parts[-1].endswith(".parquet"):
            continue
        by_partition.setdefault("/".join(parts[:-1]), []).append(f.size)
    if not by_partition:
        raise BootstrapError(f"bootstrap.path {uri} holds no Parquet files",
                             "point bootstrap.path at the folder of the Parquet dataset (its files end in .parquet)")
    if "" in by_partition and len(by_partition) > 1:
        raise BootstrapError(f"the dataset at {uri} has Parquet files both at its top and in folders, so its partitions are unclear",
                             "move the top-level files into a partition folder, or bootstrap from one of the folders")
    nested = [p for p in by_partition if p and any(q != p and q.startswith(p + "/") for q in by_partition)]
    if nested:
        raise BootstrapError(f"the dataset at {uri} has Parquet files in {nested[0]} and in folders below it",
                             "every data file of a partitioned dataset sits at the same depth")
    partitions = sorted(by_partition)
    skipped: list[str] = []
    if partition_regex:
        if partitions == [""]:
            raise BootstrapError(f"bootstrap.partition_regex is set, but the dataset at {uri} is not partitioned",
                                 "remove partition_regex")
        pattern = re.compile(partition_regex)
        skipped = [p for p in partitions if not pattern.fullmatch(p)]
        partitions = [p for p in partitions if pattern.fullmatch(p)]
        if not partitions:
            sample = ", ".join(skipped[:5]) + (", ..." if len(skipped) > 5 else "")
            raise BootstrapError(f"bootstrap.partition_regex {partition_regex!r} matches none of the {len(skipped)} partitions of {uri} ({sample})",
                                 "the expression must match a whole partition path, e.g. 'region=(eu|us)' or '2024/.*'")
    sizes = [s for p in partitions for s in by_partition[p]]
    return Dataset(uri.rstrip("/"), partitions, skipped, len(sizes), sum(sizes))


def read(spark, dataset: Dataset):
    """The dataset's rows as a DataFrame; partition columns of `column=value` folders are
    discovered by Spark (relative to the dataset's root)."""
    if dataset.partitions == [""]:
        return spark.read.parquet(dataset.uri)
    paths = [f"{dataset.uri}/{p}" for p in dataset.partitions]
    return spark.read.option("basePath", dataset.uri).parquet(*paths)
