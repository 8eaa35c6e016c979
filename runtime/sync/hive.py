"""A Hive metastore, reached with Hive's own metastore client inside the Spark driver's JVM
(the jars pyspark ships), as Hudi's HiveSyncTool does in HMS mode: the metastore that
`spark.hadoop.hive.metastore.uris` (or a hive-site.xml) names, or else an embedded Derby
database in the project folder, `metastore_db/`, where a Spark session started in the project
folder with Hive support finds it. pipe's own session needs no Hive support for this. Over Spark
Connect the driver's JVM is the server's: the client then runs in a JVM of pipe's own with the
same jars (runtime/spark/java.py java_gateway).

Thrift objects are built directly, so Hudi's input format classes, which pipe's JVM does not
have, are stored by name (Spark's own catalog API would load them)."""

from __future__ import annotations

import threading
from pathlib import Path

from runtime.spark.java import java_message
from runtime.sync import Definition, Stored, SyncError

_DERBY_DEFAULT = "jdbc:derby:;databaseName=metastore_db;create=true"


def _jvm_of(spark):
    """The JVM that holds the metastore client, and the Hadoop configuration it starts from: the
    classic session's own driver JVM, or, over Spark Connect (whose JVM is the server's, out of
    pipe's reach), a JVM of pipe's own with the same jars (runtime/spark/java.py java_gateway),
    started with the first sync of the process."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        return jvm, spark._jsc.hadoopConfiguration()
    from runtime.spark.java import SparkStartError, java_gateway

    try:
        jvm = java_gateway().jvm
    except SparkStartError as exc:
        raise SyncError(f"the Hive metastore's client needs a Java of pipe's own beside the Spark Connect session, "
                        f"which did not start: {exc}", exc.hint) from exc
    return jvm, jvm.org.apache.hadoop.conf.Configuration()


class HiveMetastore:
    def __init__(self, spark, project_root: Path, settings: dict[str, str] | None = None, local: bool = True):
        """`settings`: the target's `spark.hadoop.*` settings, which win over the session's
        Hadoop configuration (a session started before, for another target, lacks them).
        `local`: an embedded metastore may be made: the master is local and, over Spark Connect,
        the server is pipe's own (on a cluster or a remote server one must be named: an embedded
        one would live beside pipe alone)."""
        self._lock = threading.Lock()
        self.where = "the Hive metastore"
        jvm, hadoop_conf = _jvm_of(spark)
        self._jvm = jvm
        try:
            hive_conf_class = jvm.org.apache.hadoop.hive.conf.HiveConf
            conf = hive_conf_class(hadoop_conf, hive_conf_class._java_lang_class)
        except Exception as exc:  # noqa: BLE001 - a Spark without Hive's classes
            raise SyncError(f"this Spark has no Hive metastore client ({java_message(exc)})",
                            "pyspark's own jars have it; a Spark distribution built without Hive needs the spark-hive jars") from exc
        for key, value in (settings or {}).items():
            if key.startswith("spark.hadoop."):
                conf.set(key[len("spark.hadoop."):], str(value))
        factory = conf.get("hive.metastore.client.factory.class") or ""
        if factory and "SessionHiveMetaStoreClientFactory" not in factory:
            raise SyncError(f"the target's Hive configuration names another metastore client ({factory}), which pipe does not use",
                            "for EMR's Glue Data Catalog as metastore set `catalog: {kind: glue}`; for a Hive metastore name it in "
                            "spark.hadoop.hive.metastore.uris")
        uris = conf.get("hive.metastore.uris") or ""
        self.where = uris or self.where
        if not uris.strip() and not local:
            raise SyncError("no Hive metastore is named for this target, whose Spark is a cluster or a remote Spark Connect server: "
                            "an embedded one would live beside pipe alone",
                            "set spark.hadoop.hive.metastore.uris (thrift://host:9083) in the target's spark conf, or put the "
                            "cluster's hive-site.xml in SPARK_CONF_DIR", unreachable=True)
        if not uris.strip():
            # embedded: a Derby database in the project folder, created on first use
            if (conf.get("javax.jdo.option.ConnectionURL") or _DERBY_DEFAULT) == _DERBY_DEFAULT:
                conf.set("javax.jdo.option.ConnectionURL", f"jdbc:derby:;databaseName={project_root / 'metastore_db'};create=true")
            warehouse = conf.get("hive.metastore.warehouse.dir") or ""
            if warehouse in ("", "/user/hive/warehouse"):
                conf.set("hive.metastore.warehouse.dir", (project_root / "spark-warehouse").as_uri())
            conf.set("datanucleus.schema.autoCreateAll", "true")
            conf.set("hive.metastore.schema.verification", "false")
            if not jvm.java.lang.System.getProperty("derby.stream.error.file"):
                jvm.java.lang.System.setProperty("derby.stream.error.file", str(project_root / "derby.log"))
            self.where = "the Derby metastore in " + str(project_root / "metastore_db")
        try:
            self._client = jvm.org.apache.hadoop.hive.metastore.HiveMetaStoreClient(conf)
        except Exception as exc:  # noqa: BLE001 - unreachable or misconfigured metastore
            raise SyncError(f"cannot reach the Hive metastore ({self.where}): {java_message(exc)}",
                            "check hive.metastore.uris (spark.hadoop.hive.metastore.uris in the target's spark conf) "
                            "and that the metastore is up", unreachable=True) from exc

    # --- the operations a sync needs ------------------------------------------------------------

    def ensure_database(self, database: str) -> None:
        api = self._jvm.org.apache.hadoop.hive.metastore.api
        with self._calls(f"database {database}"):
            try:
                self._client.getDatabase(database)
                return
            except Exception as exc:  # noqa: BLE001
                if "NoSuchObjectException" not in str(exc):
                    raise
            self._client.createDatabase(api.Database(database, "created by pipe", None, self._jvm.java.util.HashMap()))

    def get_table(self, database: str, name: str) -> Stored | None:
        with self._calls(f"table {database}.{name}"):
            if not self._client.tableExists(database, name):
                return None
            t = self._client.getTable(database, name)
            cols = tuple((c.getName(), c.getType()) for c in t.getSd().getCols())
            keys = tuple((c.getName(), c.getType()) for c in t.getPartitionKeys())
            return Stored(columns=cols, partition_keys=keys, params=dict(t.getParameters() or {}))

    def create_table(self, d: Definition) -> None:
        with self._calls(f"table {d.full_name}"):
            self._client.createTable(self._table(d, {}))

    def update_table(self, d: Definition) -> None:
        """The table as stored, with `d`'s columns, formats, location and serde, its parameters
        merged with `d`'s (what others set stays: owner, comment, their parameters); the
        partitions take the new columns (CASCADE), as Hudi's HMS sync alters them."""
        api = self._jvm.org.apache.hadoop.hive.metastore.api
        with self._calls(f"table {d.full_name}"):
            table = self._client.getTable(d.database, d.name)
            params = dict(table.getParameters() or {})
            table.setParameters(self._map({**params, **d.params}))
            self._sd(d, table.getSd())
            context = api.EnvironmentContext()
            context.putToProperties("CASCADE", "true")
            self._client.alter_table_with_environmentContext(d.database, d.name, table, context)

    def drop_table(self, database: str, name: str) -> None:
        with self._calls(f"table {database}.{name}"):
            self._client.dropTable(database, name, False, True)  # the entry only, never the data

    def existing_partitions(self, d: Definition, values: list[tuple[str, ...]] | None) -> dict[tuple[str, ...], str | None]:
        """Which of the partitions `values` the table has, with their locations (None: all)."""
        with self._calls(f"the partitions of {d.full_name}"):
            if values is None:
                found = self._client.listPartitions(d.database, d.name, self._jvm.java.lang.Short.valueOf("-1"))
            else:
                if not values:
                    return {}
                warehouse = self._jvm.org.apache.hadoop.hive.metastore.Warehouse
                keys = self._list([self._field(n, t) for n, t in d.partition_keys])
                names = self._list([warehouse.makePartName(keys, self._list(list(v))) for v in values])
                found = self._client.getPartitionsByNames(d.database, d.name, names)
            return {tuple(p.getValues()): p.getSd().getLocation() for p in found}

    def add_partitions(self, d: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None:
        api = self._jvm.org.apache.hadoop.hive.metastore.api
        with self._calls(f"the partitions of {d.full_name}"):
            sd = self._sd(d)
            batch = []
            for values, location in partitions:
                p = api.Partition()
                p.setDbName(d.database)
                p.setTableName(d.name)
                p.setValues(self._list(list(values)))
                psd = api.StorageDescriptor(sd)
                psd.setLocation(location)
                p.setSd(psd)
                p.setParameters(self._jvm.java.util.HashMap())
                batch.append(p)
            for i in range(0, len(batch), 1000):
                self._client.add_partitions(self._list(batch[i:i + 1000]), True, False)

    def move_partitions(self, d: Definition, partitions: list[tuple[tuple[str, ...], str]]) -> None:
        with self._calls(f"the partitions of {d.full_name}"):
            moved = []
            for values, location in partitions:
                p = self._client.getPartition(d.database, d.name, self._list(list(values)))
                p.getSd().setLocation(location)
                moved.append(p)
            self._client.alter_partitions(d.database, d.name, self._list(moved))

    def drop_partitions(self, d: Definition, values: list[tuple[str, ...]]) -> None:
        with self._calls(f"the partitions of {d.full_name}"):
            for v in values:
                self._client.dropPartition(d.database, d.name, self._list(list(v)), False)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing an unreachable client
            pass

    # --- thrift objects -------------------------------------------------------------------------

    def _table(self, d: Definition, params: dict[str, str]):
        api = self._jvm.org.apache.hadoop.hive.metastore.api
        t = api.Table()
        t.setDbName(d.database)
        t.setTableName(d.name)
        t.setTableType("EXTERNAL_TABLE")
        t.setOwner(self._jvm.java.lang.System.getProperty("user.name"))
        t.setPartitionKeys(self._list([self._field(n, ty) for n, ty in d.partition_keys]))
        t.setParameters(self._map({**params, **d.params}))
        t.setSd(self._sd(d))
        return t

    def _sd(self, d: Definition, sd=None):
        """`d`'s storage descriptor: a new one, or `sd` (a stored table's) with `d`'s columns,
        location, formats and serde set, and the serde parameters others set kept."""
        api = self._jvm.org.apache.hadoop.hive.metastore.api
        if sd is None:
            sd = api.StorageDescriptor()
            sd.setSerdeInfo(api.SerDeInfo())
            sd.setBucketCols(self._list([]))
            sd.setSortCols(self._list([]))
            sd.setParameters(self._jvm.java.util.HashMap())
            sd.setNumBuckets(-1)
        sd.setCols(self._list([self._field(n, t) for n, t in d.columns]))
        sd.setLocation(d.location)
        sd.setInputFormat(d.input_format)
        sd.setOutputFormat(d.output_format)
        serde = sd.getSerdeInfo()
        serde.setSerializationLib(d.serde)
        serde.setParameters(self._map({**dict(serde.getParameters() or {}), **d.serde_params}))
        return sd

    def _field(self, name: str, type_: str):
        return self._jvm.org.apache.hadoop.hive.metastore.api.FieldSchema(name, type_, "")

    def _list(self, items):
        out = self._jvm.java.util.ArrayList()
        for item in items:
            out.add(item)
        return out

    def _map(self, items):
        out = self._jvm.java.util.HashMap()
        for k, v in items.items():
            out.put(k, v)
        return out

    def _calls(self, what: str):
        return _Calls(self, what)


class _Calls:
    """One guarded conversation with the metastore: one at a time (the client is not thread
    safe), and a Java failure becomes a SyncError naming what was being synced."""

    def __init__(self, store: HiveMetastore, what: str):
        self.store, self.what = store, what

    def __enter__(self):
        self.store._lock.acquire()
        return self

    def __exit__(self, kind, exc, tb):
        self.store._lock.release()
        if isinstance(exc, Exception) and not isinstance(exc, SyncError):  # not Ctrl-C
            text = java_message(exc)
            lost = any(w in text for w in ("TTransportException", "SocketException", "Connection refused", "Broken pipe"))
            raise SyncError(f"the Hive metastore ({self.store.where}) refused {self.what}: {text}",
                            "see the metastore's log; `pipe sync` tries again", unreachable=lost) from exc
        return False

