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
    def __init__(self, region: str | None = None, endpoint_url: str | None = None):
        from botocore.config import Config

        from runtime import s3

        self.where = f"AWS Glue{' at ' + endpoint_url if endpoint_url else ''}{' in ' + region if region else ''}"
        try:
            # boto3's default session must not make two clients at once (runtime/s3.py); a short
            # connect timeout: an unreachable endpoint is found in seconds, once per run
            with s3.clients_lock():
                import boto3

                self._glue = boto3.client("glue", region_name=region, endpoint_url=endpoint_url,
                                          config=Config(connect_timeout=10, retries={"max_attempts": 3, "mode": "standard"}))
        except Exception as exc:  # noqa: BLE001 - no region, bad endpoint
            raise SyncError(f"cannot use {self.where}: {exc}", "set `region` in the target's catalog settings, or AWS_DEFAULT_REGION",
                            unreachable=True) from exc

    def _call(self, what: str, op: str, **kwargs) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._glue, op)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            text = f"{self.where} refused {what} ({op}): {code}: {exc.response.get('Error', {}).get('Message', '')}"
            if code == "EntityNotFoundException":
                raise _NotFound(text, "it was dropped while pipe synced it; `pipe sync` registers it again") from exc
            if code == "AlreadyExistsException":
                raise _Exists(text, "another process registered it at the same time; `pipe sync` brings it up to date") from exc
            hint = ("the credentials need glue:GetDatabase, CreateDatabase, GetTable, CreateTable, UpdateTable, DeleteTable, "
                    "GetPartitions, BatchGetPartition, BatchCreatePartition, BatchUpdatePartition and BatchDeletePartition"
                    if code in ("AccessDeniedException", "UnrecognizedClientException") else "`pipe sync` tries again")
            raise SyncError(text, hint) from exc
        except BotoCoreError as exc:
            raise SyncError(f"cannot reach {self.where} for {what}: {exc}", "check the network, the region and the credentials",
                            unreachable=True) from exc

    def ensure_database(self, database: str) -> None:
        try:
            self._call(f"database {database}", "get_database", Name=database)
            return
        except _NotFound:
            pass
        try:
            self._call(f"database {database}", "create_database", DatabaseInput={"Name": database, "Description": "created by pipe"})
        except _Exists:
            pass

    def get_table(self, database: str, name: str) -> Stored | None:
        try:
            t = self._call(f"table {database}.{name}", "get_table", DatabaseName=database, Name=name)["Table"]
        except _NotFound:
            return None
        cols = tuple((c["Name"], c["Type"]) for c in t.get("StorageDescriptor", {}).get("Columns", []))
        keys = tuple((k["Name"], k["Type"]) for k in t.get("PartitionKeys", []))
        return Stored(columns=cols, partition_keys=keys, params=dict(t.get("Parameters") or {}))

    def create_table(self, d: Definition) -> None:
        try:
            self._call(f"table {d.full_name}", "create_table", DatabaseName=d.database, TableInput=self._table(d, {}))
        except _Exists:  # registered by another process meanwhile: brought up to date instead
            self.update_table(d)

    def update_table(self, d: Definition) -> None:
        current = self._call(f"table {d.full_name}", "get_table", DatabaseName=d.database, Name=d.name)["Table"]
        self._call(f"table {d.full_name}", "update_table", DatabaseName=d.database,
                   TableInput=self._table(d, dict(current.get("Parameters") or {}), current), SkipArchive=True)

    def drop_table(self, database: str, name: str) -> None:
        try:
            self._call(f"table {database}.{name}", "delete_table", DatabaseName=database, Name=name)
        except _NotFound:
            pass

    def existing_partitions(self, d: Definition, values: list[tuple[str, ...]] | None) -> dict[tuple[str, ...], str | None]:
        found: dict[tuple[str, ...], str | None] = {}
        if values is None:
            token = None
            while True:
                page = self._call(f"the partitions of {d.full_name}", "get_partitions", DatabaseName=d.database, TableName=d.name,
                                  **({"NextToken": token} if token else {}))
                found.update({tuple(p["Values"]): p.get("StorageDescriptor", {}).get("Location") for p in page["Partitions"]})
                token = page.get("NextToken")
                if not token:
                    return found
        for i in range(0, len(values), 1000):
            ask = [{"Values": list(v)} for v in values[i:i + 1000]]
            for _ in range(3):  # keys Glue left unprocessed (throttling) are asked again
                got = self._call(f"the partitions of {d.full_name}", "batch_get_partition", DatabaseName=d.database, TableName=d.name,
                                 PartitionsToGet=ask)
                found.update({tuple(p["Values"]): p.get("StorageDescriptor", {}).get("Location") for p in got.get("Partitions", [])})
                ask = got.get("UnprocessedKeys") or []
                if not ask:
                    break
            if ask:
                raise SyncError(f"{self.where} left {len(ask)} partition(s) of {d.full_name} unanswered (BatchGetPartition)",
                                "Glue is throttling; `pipe sync` tries again")
        return found

    def add_partitions(self, d: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None:
        sd = self._sd(d)
        for i in range(0, len(partitions), 100):
            inputs = [{"Values": list(v), "StorageDescriptor": {**sd, "Location": _s3(loc)}} for v, loc in partitions[i:i + 100]]
            out = self._call(f"the partitions of {d.full_name}", "batch_create_partition", DatabaseName=d.database, TableName=d.name,
                             PartitionInputList=inputs)
            self._check(d, "add", out, ignore="AlreadyExistsException")

    def move_partitions(self, d: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None:
        sd = self._sd(d)
        for i in range(0, len(partitions), 100):
            entries = [{"PartitionValueList": list(v), "PartitionInput": {"Values": list(v), "StorageDescriptor": {**sd, "Location": _s3(loc)}}}
                       for v, loc in partitions[i:i + 100]]
            out = self._call(f"the partitions of {d.full_name}", "batch_update_partition", DatabaseName=d.database, TableName=d.name,
                             Entries=entries)
            self._check(d, "move", out)

    def drop_partitions(self, d: Definition, values: list[tuple[str, ...]]) -> None:
        for i in range(0, len(values), 25):
            out = self._call(f"the partitions of {d.full_name}", "batch_delete_partition", DatabaseName=d.database, TableName=d.name,
                             PartitionsToDelete=[{"Values": list(v)} for v in values[i:i + 25]])
            self._check(d, "drop", out, ignore="EntityNotFoundException")

    def _check(self, d: Definition, what: str, out: dict[str, Any], ignore: str | None = None) -> None:
        errors = [e for e in out.get("Errors", []) if e.get("ErrorDetail", {}).get("ErrorCode") != ignore]
        if errors:
            e = errors[0]
            detail = e.get("ErrorDetail", {})
            raise SyncError(f"{self.where} refused to {what} partition {e.get('PartitionValues') or e.get('PartitionValueList')} of "
                            f"{d.full_name}: {detail.get('ErrorCode')}: {detail.get('ErrorMessage')}", "`pipe sync` tries again")

    def close(self) -> None:
        pass

    def _table(self, d: Definition, params: dict[str, str], current: dict[str, Any] | None = None) -> dict[str, Any]:
        """A TableInput: `d`'s layout, `params` merged under `d`'s, and what others set on the
        table (its description, owner) kept."""
        out = {k: v for k, v in (current or {}).items() if k in ("Description", "Owner", "Retention", "TargetTable")}
        out.update({"Name": d.name, "TableType": "EXTERNAL_TABLE", "Parameters": {**params, **d.params},
                    "PartitionKeys": [{"Name": n, "Type": t} for n, t in d.partition_keys], "StorageDescriptor": self._sd(d)})
        return out

    def _sd(self, d: Definition) -> dict[str, Any]:
        return {"Columns": [{"Name": n, "Type": t} for n, t in d.columns], "Location": _s3(d.location),
                "InputFormat": d.input_format, "OutputFormat": d.output_format,
                "SerdeInfo": {"SerializationLibrary": d.serde, "Parameters": dict(d.serde_params)}}


class _NotFound(SyncError):
    pass


class _Exists(SyncError):
    pass
