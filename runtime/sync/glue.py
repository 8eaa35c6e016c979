"""The AWS Glue Data Catalog, through boto3's Glue API, laid out as Hudi's
AwsGlueCatalogSyncTool lays it out: the same tables as a Hive metastore holds, with `s3://`
locations (Athena and EMR read `s3://`, not Hadoop's `s3a://`), partitions created 100 and
deleted 25 to a request (the API's limits)."""

from __future__ import annotations

from typing import Any

from runtime.sync import Definition, Stored, SyncError


def _s3(uri: str) -> str:
    return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri


class GlueCatalog:
    kind = "glue"

    def __init__(self, region: str | None = None, endpoint_url: str | None = None):
        import boto3
        from botocore.config import Config

        self.where = f"AWS Glue{' at ' + endpoint_url if endpoint_url else ''}{' in ' + region if region else ''}"
        try:
            self._glue = boto3.client("glue", region_name=region, endpoint_url=endpoint_url,
                                      config=Config(retries={"max_attempts": 5, "mode": "standard"}))
        except Exception as exc:  # noqa: BLE001 - no region, bad endpoint
            raise SyncError(f"cannot use {self.where}: {exc}", "set `region` in the target's catalog settings, or AWS_DEFAULT_REGION") from exc

    def _call(self, what: str, op: str, **kwargs) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._glue, op)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "EntityNotFoundException":
                raise _NotFound() from exc
            if code == "AlreadyExistsException":
                raise _Exists() from exc
            hint = ("the credentials need glue:GetTable, CreateTable, UpdateTable, GetDatabase, CreateDatabase, BatchGetPartition, "
                    "BatchCreatePartition and BatchDeletePartition" if code in ("AccessDeniedException", "UnrecognizedClientException")
                    else "`pipe sync` tries again")
            raise SyncError(f"{self.where} refused {what} ({op}): {code}: {exc.response.get('Error', {}).get('Message', '')}", hint) from exc
        except BotoCoreError as exc:
            raise SyncError(f"cannot reach {self.where} for {what}: {exc}", "check the network, the region and the credentials") from exc

    def ensure_database(self, database: str) -> bool:
        try:
            self._call(f"database {database}", "get_database", Name=database)
            return False
        except _NotFound:
            pass
        try:
            self._call(f"database {database}", "create_database", DatabaseInput={"Name": database, "Description": "created by pipe"})
        except _Exists:
            return False
        return True

    def get_table(self, database: str, name: str) -> Stored | None:
        try:
            t = self._call(f"table {database}.{name}", "get_table", DatabaseName=database, Name=name)["Table"]
        except _NotFound:
            return None
        cols = tuple((c["Name"], c["Type"]) for c in t.get("StorageDescriptor", {}).get("Columns", []))
        return Stored(columns=cols, params=dict(t.get("Parameters") or {}))

    def create_table(self, d: Definition) -> None:
        self._call(f"table {d.full_name}", "create_table", DatabaseName=d.database, TableInput=self._table(d, {}))

    def update_table(self, d: Definition) -> None:
        current = self._call(f"table {d.full_name}", "get_table", DatabaseName=d.database, Name=d.name)["Table"]
        self._call(f"table {d.full_name}", "update_table", DatabaseName=d.database,
                   TableInput=self._table(d, dict(current.get("Parameters") or {})), SkipArchive=True)

    def existing_partitions(self, d: Definition, values: list[tuple[str, ...]] | None) -> set[tuple[str, ...]]:
        found: set[tuple[str, ...]] = set()
        if values is None:
            pages = self._glue.get_paginator("get_partitions")
            try:
                for page in pages.paginate(DatabaseName=d.database, TableName=d.name, ExcludeColumnSchema=True):
                    found |= {tuple(p["Values"]) for p in page["Partitions"]}
            except Exception as exc:  # noqa: BLE001
                raise SyncError(f"{self.where} refused listing the partitions of {d.full_name}: {exc}", "`pipe sync` tries again") from exc
            return found
        for i in range(0, len(values), 1000):
            got = self._call(f"the partitions of {d.full_name}", "batch_get_partition", DatabaseName=d.database, TableName=d.name,
                             PartitionsToGet=[{"Values": list(v)} for v in values[i:i + 1000]])
            found |= {tuple(p["Values"]) for p in got.get("Partitions", [])}
        return found

    def add_partitions(self, d: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None:
        sd = self._sd(d)
        for i in range(0, len(partitions), 100):
            inputs = [{"Values": list(v), "StorageDescriptor": {**sd, "Location": _s3(loc)}} for v, loc in partitions[i:i + 100]]
            out = self._call(f"the partitions of {d.full_name}", "batch_create_partition", DatabaseName=d.database, TableName=d.name,
                             PartitionInputList=inputs)
            errors = [e for e in out.get("Errors", []) if e.get("ErrorDetail", {}).get("ErrorCode") != "AlreadyExistsException"]
            if errors:
                e = errors[0]
                raise SyncError(f"{self.where} refused partition {e.get('PartitionValues')} of {d.full_name}: "
                                f"{e.get('ErrorDetail', {}).get('ErrorCode')}: {e.get('ErrorDetail', {}).get('ErrorMessage')}",
                                "`pipe sync` tries again")

    def drop_partitions(self, d: Definition, values: list[tuple[str, ...]]) -> None:
        for i in range(0, len(values), 25):
            out = self._call(f"the partitions of {d.full_name}", "batch_delete_partition", DatabaseName=d.database, TableName=d.name,
                             PartitionsToDelete=[{"Values": list(v)} for v in values[i:i + 25]])
            errors = [e for e in out.get("Errors", []) if e.get("ErrorDetail", {}).get("ErrorCode") != "EntityNotFoundException"]
            if errors:
                e = errors[0]
                raise SyncError(f"{self.where} refused to drop partition {e.get('PartitionValues')} of {d.full_name}: "
                                f"{e.get('ErrorDetail', {}).get('ErrorMessage')}", "`pipe sync` tries again")

    def close(self) -> None:
        pass

    def _table(self, d: Definition, params: dict[str, str]) -> dict[str, Any]:
        return {"Name": d.name, "TableType": "EXTERNAL_TABLE", "Parameters": {**params, **d.params},
                "PartitionKeys": [{"Name": n, "Type": t} for n, t in d.partition_keys], "StorageDescriptor": self._sd(d)}

    def _sd(self, d: Definition) -> dict[str, Any]:
        return {"Columns": [{"Name": n, "Type": t} for n, t in d.columns], "Location": _s3(d.location),
                "InputFormat": d.input_format, "OutputFormat": d.output_format,
                "SerdeInfo": {"SerializationLibrary": d.serde, "Parameters": dict(d.serde_params)}}


class _NotFound(Exception):
    pass


class _Exists(Exception):
    pass
