"""Rules a project must meet beyond the shape of each key: settings that must fit the chosen
operation, table type and declared columns, and references between sources and tables.

`schema.py` already checked keys and types; here every rule looks at a whole source or table.
References made from SQL (ref(), source()) and cycles are checked where they are found, in
`render.py` and `graph.py`."""

from __future__ import annotations

import re

from compiler.columns import CDC_COLUMNS, KAFKA_COLUMNS, avro_name_problem
from compiler.errors import Collector, did_you_mean
from compiler.project import Project, Source, Table

# Which operations a setting applies to; setting it elsewhere is a mistake worth stopping for.
_KEYED = ("upsert", "delete")
_INSERTS = ("insert", "bulk_insert")
_NO_SQL = ("bootstrap", "delete_partition")
_META_COLUMNS = ("_hoodie_commit_time", "_hoodie_commit_seqno", "_hoodie_record_key", "_hoodie_partition_path", "_hoodie_file_name")
_LAKE_SCHEMES = ("s3://", "s3a://", "file://")


def validate(project: Project, errors: Collector) -> None:
    _validate_lake(project, errors)
    for table in project.tables.values():
        _validate_table(project, table, errors)
    for source in project.sources.values():
        _validate_source(project, source, errors)


def _written(node: Source | Table, key: str) -> bool:
    """Whether the user wrote `key` (as opposed to it holding its default)."""
    body = node.doc.value_at(node.path)
    return isinstance(body, dict) and key in body


def _validate_lake(project: Project, errors: Collector) -> None:
    lake = project.target.lake
    if "://" in lake and not lake.startswith(_LAKE_SCHEMES) and "{{" not in lake:
        loc = project.project_doc.at(("targets", project.target.name, "lake")) if target_sets_lake(project) else project.project_doc.at(("lake",))
        errors.error(loc, f"lake '{lake}' uses a storage pipe cannot write to", "use a local folder or s3://bucket/prefix")


def target_sets_lake(project: Project) -> bool:
    """Whether the chosen target overrides the project's lake (for pointing at the right line)."""
    body = project.project_doc.value_at(("targets", project.target.name))
    return isinstance(body, dict) and "lake" in body


def _validate_table(project: Project, table: Table, errors: Collector) -> None:
    c = table.config
    op = c["operation"]
    name = table.name
    what = f"table '{name}'"

    if op in _KEYED and not c["key"]:
        errors.error(table.at("operation") if _written(table, "operation") else table.location,
                     f"{what} uses operation '{op}', which needs a record key",
                     "add `key: [column]` (the column(s) that identify a row), or use operation: insert")
    if op == "delete_partition":
        if not c["partition_by"]:
            errors.error(table.at("operation"), f"{what} uses delete_partition but has no partition_by", "add `partition_by: [column]`: only a partitioned table has partitions to delete")
        if not c["partitions_to_delete"] and table.sql_text is None and table.python_text is None:
            errors.error(table.at("operation"), f"{what} uses delete_partition but names no partitions", f"add `partitions_to_delete: [...]`, or a {name}.sql whose rows name the partitions")
    if op == "bootstrap":
        if c["bootstrap"] is None:
            errors.error(table.at("operation"), f"{what} uses operation bootstrap but has no bootstrap settings", "add `bootstrap: {path: <folder of the Parquet dataset>}`")
        if table.sql_text is not None or table.python_text is not None:
            code = table.sql_file or table.python_file
            errors.error(table.at("operation"), f"{what} is bootstrapped from bootstrap.path, so {code} is not used", f"remove {code}, or choose another operation")
        if c["bootstrap"] is not None and c["bootstrap"].get("mode") == "metadata_only":
            errors.error(table.at("bootstrap", "mode"), f"{what}: metadata_only bootstrap is not supported: independent Hudi readers "
                         "(hudi-rs) cannot read skeleton files that point at the original files",
                         "use `mode: full_record` (the default), which rewrites the dataset once; see docs/services.md, Bootstrap")
    elif c["bootstrap"] is not None:
        errors.error(table.at("bootstrap"), f"{what} has bootstrap settings but operation '{op}'", "set `operation: bootstrap`, or remove `bootstrap:`")
    if op not in _NO_SQL and table.sql_text is None and table.python_text is None and not c.get("seed"):  # a seed's rows are its CSV
        sql = f"{_folder(table.file)}{name}.sql"
        errors.error(table.location, f"{what} has no SQL: {sql} does not exist",
                     f"create {sql} with the SELECT that produces the table's rows (or {sql[:-4]}.py with a Python model)")

    # Settings that only some operations read.
    if c["precombine"] and not c["key"]:
        errors.error(table.at("precombine"), f"{what} sets precombine but has no key", "precombine orders versions of the same key: add `key:` or remove precombine")
    if c.get("tombstone_days") and not c["precombine"]:
        errors.error(table.at("tombstone_days"), f"{what} sets tombstone_days but has no precombine",
                     "a tombstone keeps the precombine value of a deleted key: add `precombine:` or remove tombstone_days")
    elif c.get("tombstone_days") and op not in ("upsert", "delete"):
        errors.warning(table.at("tombstone_days"), f"tombstone_days has no effect on {what}: only upsert and delete (and --full-refresh) keep tombstones")
    if c["precombine"] and op in ("insert_overwrite", "insert_overwrite_table", "delete_partition"):
        errors.warning(table.at("precombine"), f"precombine has no effect on {what}: {op} replaces file groups without merging")
    if _written(table, "precombine_nulls") and not c["precombine"]:
        errors.error(table.at("precombine_nulls"), f"{what} sets precombine_nulls but has no precombine", "remove precombine_nulls, or add `precombine: <column>`")
    if _written(table, "insert_duplicates") and c["insert_duplicates"] != "none" and op not in _INSERTS:
        errors.error(table.at("insert_duplicates"), f"insert_duplicates applies to insert and bulk_insert, not to {op} ({what})", "remove it: upsert never duplicates a key")
    if c["insert_duplicates"] in ("drop", "fail") and not c["key"]:
        errors.error(table.at("insert_duplicates"), f"insert_duplicates: {c['insert_duplicates']} needs a key to find duplicates ({what})", "add `key:`")
    if c["combine_before_insert"] and op not in (*_INSERTS, "bootstrap"):
        errors.error(table.at("combine_before_insert"), f"combine_before_insert applies to insert, bulk_insert and bootstrap, not to {op} ({what})", "remove it: upsert always combines a batch by key")
    if c["combine_before_insert"] and not c["key"]:
        errors.error(table.at("combine_before_insert"), f"combine_before_insert needs a key to combine by ({what})", "add `key:`")
    if _written(table, "bulk_insert_sort_mode") and op not in ("bulk_insert", "bootstrap"):
        errors.error(table.at("bulk_insert_sort_mode"), f"bulk_insert_sort_mode applies to bulk_insert and bootstrap, not to {op} ({what})", "remove it, or set operation: bulk_insert")
    if c["partitions_to_delete"] and op != "delete_partition":
        errors.error(table.at("partitions_to_delete"), f"partitions_to_delete applies to delete_partition, not to {op} ({what})", "set operation: delete_partition, or remove partitions_to_delete")
    if c["delete_when"] is not None and op != "upsert":
        errors.error(table.at("delete_when"), f"delete_when needs operation upsert, but {what} uses {op}", "deletes are routed to the stored rows by key: use operation: upsert with a key")
    if c["index"] == "bucket" and not c["key"]:
        errors.error(table.at("index"), f"index: bucket needs a key to hash into buckets ({what})", "add `key:`")
    if c["index"] == "bucket" and c.get("buckets") is None:
        errors.error(table.at("index"), f"index: bucket needs buckets: the number of buckets per partition ({what})",
                     "add e.g. `buckets: 16` (Hudi's hoodie.bucket.index.num.buckets; it cannot change later)")
    if c.get("buckets") is not None and c["index"] != "bucket":
        errors.error(table.at("buckets"), f"buckets applies to index: bucket ({what})", "set `index: bucket`, or remove `buckets:`")
    if c.get("cdc_logging") and c["index"] == "bucket":
        errors.error(table.at("cdc_logging"), f"cdc_logging cannot go with index: bucket ({what}): Java's CDC reader cannot follow a "
                     "bucket table's log-only file groups, so pipe writes a table with one or the other",
                     "remove `cdc_logging:` or use another index")
    if c["index"] == "bucket" and op in ("insert_overwrite", "insert_overwrite_table", "bootstrap"):
        errors.error(table.at("index"), f"index: bucket cannot go with operation {op} ({what}): pipe writes a bucket's file group in place",
                     "use upsert, insert, bulk_insert, delete or delete_partition")
    if c["index"] == "record" and not c["key"]:
        errors.error(table.at("index"), f"index: record keeps each key's place in a record index, and needs a key ({what})", "add `key:`")
    if c["index"] == "record" and op in ("bulk_insert", "insert_overwrite", "insert_overwrite_table", "bootstrap", "delete_partition"):
        errors.error(table.at("index"), f"index: record is kept in step by upsert, insert and delete; {op} does not say which keys "
                     f"moved where, so it would drop the index at every run ({what})", "use `index: global`, or operation upsert, insert or delete")
    if c["index"] == "record" and op == "insert" and c["insert_duplicates"] == "none":
        errors.error(table.at("insert_duplicates"), f"index: record with operation insert needs insert_duplicates drop or fail ({what}): "
                     "an insert that looks nothing up stores a key again, and the record index can name only one of its copies",
                     "set `insert_duplicates: drop` (or fail), or use operation upsert")
    if c["index"] == "record" and c.get("metadata_table") is False and _written(table, "metadata_table"):
        errors.error(table.at("metadata_table"), f"index: record keeps its index in the metadata table, which metadata_table: false turns off ({what})",
                     "remove `metadata_table: false`")
    if c["index"] == "partition" and not c["partition_by"]:
        errors.error(table.at("index"), f"index: partition needs partition_by ({what})", "remove `index: partition` or add `partition_by:`")
    if c["type"] == "copy_on_write" and _written(table, "compaction"):
        errors.error(table.at("compaction"), f"compaction applies to merge_on_read tables; {what} is copy_on_write", "remove `compaction:` or set `type: merge_on_read`")
    if c["small_file_limit"] is not None and c["max_file_size"] is not None and c["small_file_limit"] > c["max_file_size"]:
        errors.error(table.at("small_file_limit"), f"small_file_limit is larger than max_file_size ({what})", "a small file must be smaller than the largest file: lower small_file_limit")
    if c["archive"]["min_instants"] >= c["archive"]["max_instants"]:
        errors.error(table.at("archive", "min_instants"), f"archive.min_instants ({c['archive']['min_instants']}) must be below archive.max_instants ({c['archive']['max_instants']}) ({what})")
    if c["clean"]["policy"] == "keep_latest_commits" and c["archive"]["min_instants"] <= c["clean"]["retain"]:
        errors.error(table.at("archive", "min_instants") if _written(table, "archive") else table.at("clean", "retain"),
                     f"archive.min_instants ({c['archive']['min_instants']}) must be above clean.retain ({c['clean']['retain']}) ({what})",
                     "archiving must not remove instants whose files cleaning still keeps; raise min_instants or lower retain")

    # Columns named in settings must exist when the output columns are declared.
    cols = table.columns
    by_name = isinstance(table.doc.value_at(table.path + ("schema",)), dict)
    for col in cols or ():
        problem = avro_name_problem(col["name"], what)
        if problem:
            errors.error(table.at("schema", col["name"]) if by_name else table.at("schema"), *problem)
    for key_name in ("key", "partition_by", "precombine"):
        names = c[key_name] if isinstance(c[key_name], list) else ([c[key_name]] if c[key_name] else [])
        for i, col in enumerate(names):
            if col in _META_COLUMNS:
                errors.error(_item_at(table, key_name, i), f"'{col}' in {key_name} of {what} is a Hudi meta column", "use a column of your data")
            elif cols is not None and col not in {x["name"] for x in cols}:
                hint = did_you_mean(col, [x["name"] for x in cols]) or "declared columns: " + ", ".join(x["name"] for x in cols)
                errors.error(_item_at(table, key_name, i), f"{key_name} column '{col}' of {what} is not in its declared schema", hint)
    for i, pattern in enumerate(c["partitions_to_delete"]):
        if not pattern.strip() or pattern.startswith("/"):
            errors.error(_item_at(table, "partitions_to_delete", i), f"'{pattern}' is not a partition path ({what})", "write paths relative to the table, e.g. region=EU or 2024/01/*")
    if c["bootstrap"] and c["bootstrap"].get("partition_regex"):
        try:
            re.compile(c["bootstrap"]["partition_regex"])
        except re.error as exc:
            errors.error(table.at("bootstrap", "partition_regex"), f"bootstrap.partition_regex of {what} is not a valid regular expression: {exc}")


def _item_at(table: Table, key: str, index: int):
    # string_list accepts a bare string; its position is the key's value itself
    return table.at(key, index) if isinstance(table.doc.value_at(table.path + (key,)), list) else table.at(key)


def _folder(file: str) -> str:
    return file.rsplit("/", 1)[0] + "/" if "/" in file else ""


def _validate_source(project: Project, source: Source, errors: Collector) -> None:
    c = source.config
    what = f"source '{source.name}'"
    for key in ("table", "metadata_table"):
        ref = c.get(key)
        if ref is not None and ref not in project.tables:
            hint = did_you_mean(ref, project.tables) or (
                f"'{ref}' is a source; a {c['kind']} source reads a pipe table" if ref in project.sources else "declare the table in tables/*.yml"
            )
            errors.error(source.at(key), f"{what} reads table '{ref}', which does not exist", hint)
    if c["kind"] == "s3_events":
        url = c["queue_url"] or ""
        if url and "{{" not in url and not url.startswith(("https://", "http://")):
            errors.error(source.at("queue_url"), f"queue_url of {what} is not a URL: '{url}'", "use the queue URL SQS shows, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/my-queue")
    if c["kind"] == "kafka":
        _validate_kafka(source, what, errors)
    if c["kind"] == "jdbc":
        _validate_jdbc(source, what, errors)
    if c["kind"] == "s3_incremental":
        lo, hi = c.get("min_object_size"), c.get("max_object_size")
        if lo is not None and hi is not None and lo > hi:
            errors.error(source.at("min_object_size"), f"min_object_size is larger than max_object_size ({what})")


_JDBC_OWN = ("url", "user", "password", "dbtable", "query", "driver", "partitioncolumn", "lowerbound", "upperbound", "numpartitions")


def _validate_jdbc(source: Source, what: str, errors: Collector) -> None:
    """One of `dbtable` and `query`; a JDBC URL; no password written into the project."""
    c = source.config
    if (c.get("dbtable") is None) == (c.get("query") is None):
        errors.error(source.at("dbtable" if c.get("dbtable") is not None else "kind"),
                     f"{what} needs one of `dbtable` and `query`" + (", not both" if c.get("dbtable") is not None else ""),
                     "`dbtable: public.orders` reads a table; `query: select ...` the rows of a query")
    url = str(c.get("url") or "")
    if url and "{{" not in url and not url.lower().startswith("jdbc:"):
        errors.error(source.at("url"), f"url of {what} is not a JDBC URL: {url[:60]!r}", "write it as jdbc:<database>://host:port/name, e.g. jdbc:postgresql://db:5432/shop")
    if c.get("password") and "{{" not in str(c["password"]):
        errors.error(source.at("password"), f"the password of {what} is written in the project",
                     "give it with env_var(): `password: \"{{ env_var('SHOP_DB_PASSWORD') }}\"` (the value is then masked in every output)")
    if "{{" not in url and (re.search(r"[?;&:](password|pwd)=", url, re.I) or re.search(r"//[^/@:]+:[^/@]+@", url)
                            or re.search(r":thin:[^@/]+/[^@]+@", url, re.I)):
        errors.error(source.at("url"), f"the url of {what} holds a password", "move it to `password`, given with env_var()")
    for key in c.get("properties") or {}:
        if str(key).lower() in _JDBC_OWN:
            errors.error(source.at("properties"), f"property {key} of {what} is pipe's to set", "use the source's own keys (url, dbtable, query, user, password, driver, partition_column, num_partitions)")
    if c.get("incremental_column") is None and c.get("lookback"):
        errors.warning(source.at("lookback"), f"lookback of {what} has no effect without incremental_column")


def _validate_kafka(source: Source, what: str, errors: Collector) -> None:
    """One of `topic` and `topic_pattern`; a topic name Kafka allows; a pattern that compiles."""
    import re

    c = source.config
    topic, pattern = c.get("topic"), c.get("topic_pattern")
    if (topic is None) == (pattern is None):
        errors.error(source.at("topic" if topic is not None else "kind"),
                     f"{what} needs one of `topic` and `topic_pattern`" + (", not both" if topic is not None else ""),
                     "`topic: orders` reads one topic; `topic_pattern: 'shop\\..*'` every topic whose whole name matches")
    if topic is not None and "{{" not in topic and not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
        errors.error(source.at("topic"), f"topic of {what} is not a Kafka topic name: {topic!r}",
                     "a topic name has up to 249 letters, digits, '.', '_' and '-'")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.error(source.at("topic_pattern"), f"topic_pattern of {what} is not a regular expression: {exc}",
                         "write a Python regular expression, e.g. 'shop\\.public\\..*'")
    if c.get("starting_offsets") == "latest" and not c.get("schema"):
        errors.error(source.at("starting_offsets"), f"starting_offsets: latest of {what} needs a declared `schema`",
                     "a first run that starts at the latest offsets may find no message to infer the columns from, and must "
                     "still commit where it started: declare the messages' columns in `schema`")
    added = KAFKA_COLUMNS + (CDC_COLUMNS if str(c.get("format")).lower() in ("debezium", "dms") else ())
    for col in source.columns or []:
        if isinstance(col, dict) and str(col.get("name", "")).lower() in added:
            errors.error(source.at("schema"), f"the schema of {what} declares {col['name']}, a column pipe adds to every message",
                         "remove it from `schema`: pipe fills " + ", ".join(added) + " itself")
            break
    reg = c.get("schema_registry") or {}
    if str(c.get("format")).lower() == "avro" and not reg:
        errors.error(source.at("format"), f"format: avro of {what} needs `schema_registry`",
                     "Avro messages in Confluent's wire format name their schema by an id: give the registry's `url`")
    if reg.get("password") and "{{" not in str(reg["password"]):
        errors.error(source.at("schema_registry", "password"), f"the schema registry password of {what} is written in the project",
                     "give it with env_var(): `password: \"{{ env_var('SCHEMA_REGISTRY_PASSWORD') }}\"`")
    if c.get("on_checkpoint_lost") == "latest" and not c.get("schema"):
        errors.error(source.at("on_checkpoint_lost"), f"on_checkpoint_lost: latest of {what} needs a declared `schema`",
                     "the run that skips to the latest offsets commits them with no rows, and without a schema there are no "
                     "columns to commit (every later run would skip again): declare the messages' columns in `schema`, or use "
                     "`on_checkpoint_lost: earliest`")
    for key, value in (c.get("properties") or {}).items():
        if str(key) in ("bootstrap.servers", "group.id", "enable.auto.commit", "isolation.level", "auto.offset.reset"):
            errors.error(source.at("properties"), f"property {key} of {what} is pipe's to set",
                         "offsets live in the table's commits, not in a consumer group: remove it "
                         + ("(give the brokers in `bootstrap_servers`)" if key == "bootstrap.servers" else ""))
