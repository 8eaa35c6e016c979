"""Avro timeline files (rollback, clean and restore plans and metadata, savepoint metadata, the
requested replacecommit):
object-container files with the null codec and one record, as Hudi's Java writers produce them
(HUDI_FORMAT.md section 2).
The record schemas follow Hudi's `org.apache.hudi.avro.model` definitions, field for field."""

from __future__ import annotations

import io
from typing import Any

import fastavro

_NS = "org.apache.hudi.avro.model"
_STR = "string"
_STRS = {"type": "array", "items": "string"}

INSTANT_INFO = {"type": "record", "name": "HoodieInstantInfo", "namespace": _NS,
                "fields": [{"name": "commitTime", "type": _STR}, {"name": "action", "type": _STR}]}

ROLLBACK_PLAN = {
    "type": "record", "name": "HoodieRollbackPlan", "namespace": _NS,
    "fields": [
        {"name": "instantToRollback", "type": ["null", INSTANT_INFO], "default": None},
        {"name": "RollbackRequests", "default": None, "type": ["null", {"type": "array", "items": {
            "type": "record", "name": "HoodieRollbackRequest", "namespace": _NS,
            "fields": [
                {"name": "partitionPath", "type": _STR},
                {"name": "fileId", "type": ["null", _STR], "default": None},
                {"name": "latestBaseInstant", "type": ["null", _STR], "default": None},
                {"name": "filesToBeDeleted", "type": _STRS, "default": []},
                {"name": "logBlocksToBeDeleted", "type": ["null", {"type": "map", "values": "long"}], "default": None},
            ]}}]},
        {"name": "version", "type": ["int", "null"], "default": 1},
    ],
}

ROLLBACK_METADATA = {
    "type": "record", "name": "HoodieRollbackMetadata", "namespace": _NS,
    "fields": [
        {"name": "startRollbackTime", "type": _STR},
        {"name": "timeTakenInMillis", "type": "long"},
        {"name": "totalFilesDeleted", "type": "int"},
        {"name": "commitsRollback", "type": _STRS},
        {"name": "partitionMetadata", "type": {"type": "map", "values": {
            "type": "record", "name": "HoodieRollbackPartitionMetadata", "namespace": _NS,
            "fields": [
                {"name": "partitionPath", "type": _STR},
                {"name": "successDeleteFiles", "type": _STRS},
                {"name": "failedDeleteFiles", "type": _STRS},
                {"name": "rollbackLogFiles", "type": ["null", {"type": "map", "values": "long"}], "default": None},
                {"name": "logFilesFromFailedCommit", "type": ["null", {"type": "map", "values": "long"}], "default": None},
            ]}}},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "instantsRollback", "type": {"type": "array", "items": INSTANT_INFO}, "default": []},
    ],
}

CLEAN_PARTITION_METADATA = {
    "type": "record", "name": "HoodieCleanPartitionMetadata", "namespace": _NS,
    "fields": [
        {"name": "partitionPath", "type": _STR},
        {"name": "policy", "type": _STR},
        {"name": "deletePathPatterns", "type": _STRS},
        {"name": "successDeleteFiles", "type": _STRS},
        {"name": "failedDeleteFiles", "type": _STRS},
        {"name": "isPartitionDeleted", "type": ["null", "boolean"], "default": None},
    ],
}

CLEANER_PLAN = {
    "type": "record", "name": "HoodieCleanerPlan", "namespace": _NS,
    "fields": [
        {"name": "earliestInstantToRetain", "default": None, "type": ["null", {
            "type": "record", "name": "HoodieActionInstant", "namespace": _NS,
            "fields": [{"name": "timestamp", "type": _STR}, {"name": "action", "type": _STR}, {"name": "state", "type": _STR}]}]},
        {"name": "policy", "type": _STR},
        {"name": "filesToBeDeletedPerPartition", "type": ["null", {"type": "map", "values": _STRS}], "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "filePathsToBeDeletedPerPartition", "default": None, "type": ["null", {"type": "map", "values": {"type": "array", "items": {
            "type": "record", "name": "HoodieCleanFileInfo", "namespace": _NS,
            "fields": [{"name": "filePath", "type": ["null", _STR], "default": None},
                       {"name": "isBootstrapBaseFile", "type": ["null", "boolean"], "default": None}]}}}]},
        {"name": "partitionsToBeDeleted", "type": ["null", _STRS], "default": None},
    ],
}

CLEAN_METADATA = {
    "type": "record", "name": "HoodieCleanMetadata", "namespace": _NS,
    "fields": [
        {"name": "policy", "type": _STR, "default": ""},
        {"name": "startCleanTime", "type": _STR},
        {"name": "timeTakenInMillis", "type": "long"},
        {"name": "totalFilesDeleted", "type": "int"},
        {"name": "earliestCommitToRetain", "type": _STR},
        {"name": "lastCompletedCommitTimestamp", "type": _STR, "default": ""},
        {"name": "partitionMetadata", "type": {"type": "map", "values": CLEAN_PARTITION_METADATA}},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "bootstrapPartitionMetadata", "type": ["null", {"type": "map", "values": "HoodieCleanPartitionMetadata"}], "default": None},
    ],
}

SAVEPOINT_METADATA = {
    "type": "record", "name": "HoodieSavepointMetadata", "namespace": _NS,
    "fields": [
        {"name": "savepointedBy", "type": _STR},
        {"name": "savepointedAt", "type": "long"},
        {"name": "comments", "type": _STR},
        {"name": "partitionMetadata", "type": {"type": "map", "values": {
            "type": "record", "name": "HoodieSavepointPartitionMetadata", "namespace": _NS,
            "fields": [{"name": "partitionPath", "type": _STR}, {"name": "savepointDataFile", "type": _STRS}]}}},
        {"name": "version", "type": ["int", "null"], "default": 1},
    ],
}

RESTORE_PLAN = {
    "type": "record", "name": "HoodieRestorePlan", "namespace": _NS,
    "fields": [
        {"name": "instantsToRollback", "type": {"type": "array", "items": INSTANT_INFO}, "default": []},
        {"name": "version", "type": ["int", "null"], "default": 2},
        {"name": "savepointToRestoreTimestamp", "type": ["string", "null"], "default": None},
    ],
}

# the rollback metadata of every instant a restore undid, by instant
RESTORE_METADATA = {
    "type": "record", "name": "HoodieRestoreMetadata", "namespace": _NS,
    "fields": [
        {"name": "startRestoreTime", "type": _STR},
        {"name": "timeTakenInMillis", "type": "long"},
        {"name": "instantsToRollback", "type": _STRS},
        {"name": "hoodieRestoreMetadata", "type": {"type": "map", "values": {"type": "array", "items": ["null", ROLLBACK_METADATA]}}},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "restoreInstantInfo", "type": {"type": "array", "items": f"{_NS}.HoodieInstantInfo"}, "default": []},  # defined in ROLLBACK_METADATA
        {"name": "extraMetadata", "type": ["null", {"type": "map", "values": _STR}], "default": None},
    ],
}

_OPT_STR = ["null", _STR]
_OPT_STR_MAP = ["null", {"type": "map", "values": _STR}]

# `T.replacecommit.requested`. For insert_overwrite(_table) and delete_partition Hudi writes
# `new HoodieRequestedReplaceMetadata()`: every field null, version included (the fixture
# cow_v6_simplekeygen_nonhivestyle_overwritetable); only clustering fills in a plan.
REQUESTED_REPLACE_METADATA = {
    "type": "record", "name": "HoodieRequestedReplaceMetadata", "namespace": _NS,
    "fields": [
        {"name": "operationType", "type": _OPT_STR, "default": None},
        {"name": "clusteringPlan", "default": None, "type": ["null", {
            "type": "record", "name": "HoodieClusteringPlan", "namespace": _NS,
            "fields": [
                {"name": "inputGroups", "default": None, "type": ["null", {"type": "array", "items": {
                    "type": "record", "name": "HoodieClusteringGroup", "namespace": _NS,
                    "fields": [
                        {"name": "slices", "default": None, "type": ["null", {"type": "array", "items": {
                            "type": "record", "name": "HoodieSliceInfo", "namespace": _NS,
                            "fields": [
                                {"name": "dataFilePath", "type": _OPT_STR, "default": None},
                                {"name": "deltaFilePaths", "type": ["null", _STRS], "default": None},
                                {"name": "fileId", "type": _OPT_STR},
                                {"name": "partitionPath", "type": _OPT_STR, "default": None},
                                {"name": "bootstrapFilePath", "type": _OPT_STR, "default": None},
                                {"name": "version", "type": ["int", "null"], "default": 1},
                            ]}}]},
                        {"name": "metrics", "type": ["null", {"type": "map", "values": "double"}], "default": None},
                        {"name": "numOutputFileGroups", "type": ["int", "null"], "default": 1},
                        {"name": "extraMetadata", "type": _OPT_STR_MAP, "default": None},
                        {"name": "version", "type": ["int", "null"], "default": 1},
                    ]}}]},
                {"name": "strategy", "default": None, "type": ["null", {
                    "type": "record", "name": "HoodieClusteringStrategy", "namespace": _NS,
                    "fields": [
                        {"name": "strategyClassName", "type": _OPT_STR, "default": None},
                        {"name": "strategyParams", "type": _OPT_STR_MAP, "default": None},
                        {"name": "version", "type": ["int", "null"], "default": 1},
                    ]}]},
                {"name": "extraMetadata", "type": _OPT_STR_MAP, "default": None},
                {"name": "version", "type": ["int", "null"], "default": 1},
                {"name": "preserveHoodieMetadata", "type": ["null", "boolean"], "default": None},
            ]}]},
        {"name": "extraMetadata", "type": _OPT_STR_MAP, "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
    ],
}
EMPTY_REPLACE_REQUEST = {"operationType": None, "clusteringPlan": None, "extraMetadata": None, "version": None}

# `T.compaction.requested`: one operation per file slice to compact. Version 2 plans name the
# base and log files by file name only (Hudi's CompactionUtils), relative to the partition.
COMPACTION_PLAN = {
    "type": "record", "name": "HoodieCompactionPlan", "namespace": _NS,
    "fields": [
        {"name": "operations", "default": None, "type": ["null", {"type": "array", "items": {
            "type": "record", "name": "HoodieCompactionOperation", "namespace": _NS,
            "fields": [
                {"name": "baseInstantTime", "type": _OPT_STR},
                {"name": "deltaFilePaths", "type": ["null", _STRS], "default": None},
                {"name": "dataFilePath", "type": _OPT_STR, "default": None},
                {"name": "fileId", "type": _OPT_STR},
                {"name": "partitionPath", "type": _OPT_STR, "default": None},
                {"name": "metrics", "type": ["null", {"type": "map", "values": "double"}], "default": None},
                {"name": "bootstrapFilePath", "type": _OPT_STR, "default": None},
            ]}}]},
        {"name": "extraMetadata", "type": _OPT_STR_MAP, "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
    ],
}

# Timeline layout 2 (Hudi 1.x, table versions 8 and 9): the commit metadata of a commit,
# deltacommit or compaction is Avro too, in the schema Hudi 1.1's HoodieCommitMetadata class
# carries (the fields of 0.x's JSON, less `recordsStats`); a replacecommit's adds
# partitionToReplaceFileIds. Every field is optional: Java resolves them by name.
_OPT_LONG = ["null", "long"]
WRITE_STAT = {
    "type": "record", "name": "HoodieWriteStat", "namespace": _NS,
    "fields": [{"name": n, "type": t, "default": None} for n, t in (
        ("fileId", _OPT_STR), ("path", _OPT_STR), ("prevCommit", _OPT_STR), ("numWrites", _OPT_LONG),
        ("numDeletes", _OPT_LONG), ("numUpdateWrites", _OPT_LONG), ("totalWriteBytes", _OPT_LONG),
        ("totalWriteErrors", _OPT_LONG), ("partitionPath", _OPT_STR), ("totalLogRecords", _OPT_LONG),
        ("totalLogFiles", _OPT_LONG), ("totalUpdatedRecordsCompacted", _OPT_LONG), ("numInserts", _OPT_LONG),
        ("totalLogBlocks", _OPT_LONG), ("totalCorruptLogBlock", _OPT_LONG), ("totalRollbackBlocks", _OPT_LONG),
        ("fileSizeInBytes", _OPT_LONG), ("logVersion", ["null", "int"]), ("logOffset", _OPT_LONG), ("baseFile", _OPT_STR),
        ("logFiles", ["null", _STRS]), ("cdcStats", ["null", {"type": "map", "values": "long"}]), ("prevBaseFile", _OPT_STR),
        ("minEventTime", _OPT_LONG), ("maxEventTime", _OPT_LONG),
        ("runtimeStats", ["null", {"type": "record", "name": "HoodieRuntimeStats", "namespace": _NS, "fields": [
            {"name": n, "type": _OPT_LONG, "default": None} for n in ("totalScanTime", "totalCreateTime", "totalUpsertTime")]}]),
        ("totalLogFilesCompacted", _OPT_LONG), ("totalLogReadTimeMs", _OPT_LONG), ("totalLogSizeCompacted", _OPT_LONG),
        ("tempPath", _OPT_STR), ("numUpdates", _OPT_LONG),
    )],
}


def _commit_metadata(name: str, replace: bool) -> dict:
    fields = [
        {"name": "partitionToWriteStats", "type": ["null", {"type": "map", "values": {"type": "array", "items": WRITE_STAT}}], "default": None},
        {"name": "compacted", "type": ["null", "boolean"], "default": None},
        {"name": "extraMetadata", "type": _OPT_STR_MAP, "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "operationType", "type": _OPT_STR, "default": None},
    ]
    if replace:
        fields.append({"name": "partitionToReplaceFileIds", "type": ["null", {"type": "map", "values": _STRS}], "default": None})
    return {"type": "record", "name": name, "namespace": _NS, "fields": fields}


COMMIT_METADATA = _commit_metadata("HoodieCommitMetadata", replace=False)
REPLACE_COMMIT_METADATA = _commit_metadata("HoodieReplaceCommitMetadata", replace=True)

_PARSED: dict[str, Any] = {}


def parsed_schema(schema: dict) -> Any:
    # each schema defines every record it names, so the file header is self-contained
    name = schema["name"]
    if name not in _PARSED:
        _PARSED[name] = fastavro.parse_schema(schema, named_schemas={})
    return _PARSED[name]


def to_bytes(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, parsed_schema(schema), [record], codec="null")
    return out.getvalue()


def from_bytes(data: bytes) -> dict:
    return next(iter(fastavro.reader(io.BytesIO(data))))
