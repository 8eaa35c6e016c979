"""Every key a project file may hold: its type, default, allowed values and meaning.

This is the one home of the project format. `project.py` checks files against it,
`docs/project.md` documents it (a test keeps the two in step), and defaults are filled in here so
that the plan always states every setting explicitly."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.errors import Collector, did_you_mean
from compiler.yamlsrc import Doc, Path

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CATALOG_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")  # Hive and Glue keep names in lower case

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(value: Any) -> int | None:
    """Bytes from an int or a string such as "120MB" (binary units, as Hudi counts them)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = m.group(2).upper().replace("I", "").rstrip("B") or ""
            if unit in _SIZE_UNITS:
                return int(float(m.group(1)) * _SIZE_UNITS[unit])
    return None


@dataclass(frozen=True)
class Key:
    """One key of a section. `type` is one of: string, integer, boolean, string_list, mapping,
    size, columns, any, section, sections (a mapping of names to `section`)."""

    name: str
    type: str
    doc: str
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] | tuple[int, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    section: "Section | None" = None
    # choices are matched without regard to case and stored in the case given here
    fold_case: bool = False


@dataclass(frozen=True)
class Section:
    title: str
    keys: tuple[Key, ...]
    doc: str = ""
    by_name: dict[str, Key] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {k.name: k for k in self.keys})


# --- the format --------------------------------------------------------------------------------

SPARK = Section(
    "spark",
    (
        Key("master", "string", "Spark master URL: `local[*]`, `local[4]`, `yarn`, `spark://host:7077`, `k8s://...`.", default="local[*]"),
        Key("conf", "mapping", "Spark configuration passed to the SparkSession builder (`spark.executor.memory: 8g`).", default={}),
    ),
    "Spark settings of a target.",
)

CATALOG_KINDS = ("none", "spark", "glue")

CATALOG = Section(
    "catalog",
    (
        Key("kind", "string", "Where each table is registered after every commit: `none`; `spark`, the Hive metastore of Spark's session catalog (a local Derby `metastore_db` in the project folder, or the metastore `spark.hadoop.hive.metastore.uris` names); `glue`, the AWS Glue Data Catalog.", default="none", choices=CATALOG_KINDS),
        Key("database", "string", "The database the tables are registered in; created when missing. Default: the project's name.", default=None),
        Key("table_prefix", "string", "Put before each table's name in the catalog (`raw_` registers table orders as `raw_orders`).", default=""),
        Key("region", "string", "`glue`: the AWS region of the catalog. Default: AWS_DEFAULT_REGION, as boto3 finds it.", default=None),
        Key("endpoint_url", "string", "`glue`: the Glue API's endpoint, for a VPC endpoint or a test server. Default: AWS's.", default=None),
    ),
    "The catalog a target registers its tables in (docs/catalog.md).",
)

TARGET = Section(
    "target",
    (
        Key("lake", "string", "Root of this target's tables; overrides the project's `lake`. A local folder (relative to the project) or `s3://bucket/prefix`.", default=None),
        Key("spark", "section", "Spark settings.", default={}, section=SPARK),
        Key("shared_paths", "string_list", "Folders mounted at the same path on the driver and on every node of the cluster (NFS, EFS, a cluster's shared disk). With a master that is not `local`, a lake or a `files` source on a local path must lie under one of them; otherwise the run is refused, since the executors could not reach it.", default=[]),
        Key("vars", "mapping", "Variables for this target; they override the project's `vars`, and `--vars` overrides both.", default={}),
        Key("catalog", "section", "The catalog the target's tables are registered in after every commit.", default={}, section=CATALOG),
    ),
    "One environment the project runs in (`dev`, `prod`, ...).",
)

PROJECT = Section(
    "pipe_project.yml",
    (
        Key("name", "string", "Project name: letters, digits and `_`, starting with a letter or `_`.", required=True),
        Key("lake", "string", "Root under which every table lives (`<lake>/<table>`): a folder relative to the project, an absolute path, or `s3://bucket/prefix`.", default="lake"),
        Key("default_target", "string", "Target used when `--target` is not given.", default="dev"),
        Key("targets", "sections", "Targets by name. Without any, a single `dev` target with the defaults exists.", default={}, section=TARGET),
        Key("vars", "mapping", "Variables for `var()` in SQL: `{name: value}`.", default={}),
    ),
    "The project file at the root of the project folder.",
)

SOURCE_KINDS = ("files", "s3_events", "s3_incremental", "table", "hudi", "kafka", "jdbc")
FORMATS = ("json", "csv", "parquet")

_TESTS = (
    Key("columns", "any", "Columns described and tested, as in dbt: a list of `- name: <column>` entries, each with `description` and `tests` (docs/testing.md). Metadata for the table's writes: a change to it changes no data.", default=None),
    Key("tests", "any", "Data tests of the whole table or source: `unique`, `not_null`, `accepted_values`, `relationships`, `expression`, with `column:` (docs/testing.md). Run by `pipe test` and `pipe build`.", default=None),
    Key("data_tests", "any", "Another name for `tests` (dbt 1.8's); use one of the two.", default=None),
)

_EXPECT = Key("expect", "any", "Checks on every batch before it is committed, by name: a SQL condition each row must meet, and an `action` for the rows that fail it: `warn` (count them), `drop` (leave them out), `quarantine` (write them to `<table>__quarantine` instead) or `fail` (commit nothing) (docs/testing.md).", default=None)

_SOURCE_COMMON = (
    Key("kind", "string", "What the source reads.", required=True, choices=SOURCE_KINDS),
    Key("description", "string", "Free text for people; metadata only.", default=""),
    Key("tags", "string_list", "Tags for selection (`--select tag:x`); metadata only.", default=[]),
) + _TESTS

_READ_FORMAT = (
    Key("format", "string", "File format of the data.", required=True, choices=FORMATS, fold_case=True),
    Key("schema", "columns", "Columns of the data: a Spark DDL string (`\"id BIGINT, name STRING\"`) or a mapping `{column: type}`. Without it the schema is inferred.", default=None),
    Key("options", "mapping", "Options for Spark's reader of that format (`multiLine: true`, `header: true`, ...).", default={}),
    Key("on_bad_record", "string", "A record that does not fit `schema` (a value that does not convert to its column's type, a CSV row with too few or too many fields, a line that is not JSON): `fail` stops the step naming file, line, column and value; `drop` leaves it out and counts it in the step's output.", default="fail", choices=("fail", "drop")),
)

FAN_OUT = Section(
    "fan_out",
    (
        Key("table_prefix", "string", "Prefix of the generated tables' names; `<source>_` when unset.", default=None),
        Key("table", "mapping", "Settings every generated table takes: any table setting (`type`, `tombstone_days`, `partition_by`, `tags`, `clean`, ...) but `key`, `precombine` and `operation`, which the capture decides.", default={}),
    ),
    "Fan-out of a change-data-capture source into one table per captured table.",
)

SCHEMA_REGISTRY = Section(
    "schema_registry",
    (
        Key("url", "string", "The registry's base URL, where `/schemas/ids/<id>` answers (`https://registry:8081`, `http://apicurio:8080/apis/ccompat/v7`).", required=True),
        Key("username", "string", "User of HTTP basic authentication.", default=None),
        Key("password", "string", "Password of HTTP basic authentication: give it with `env_var()`.", default=None),
    ),
    "The schema registry the executors fetch Avro schemas from, by the id each message names.",
)

_AWS = (
    Key("region", "string", "AWS region of the bucket or queue; the AWS default chain when unset.", default=None),
    Key("endpoint_url", "string", "Endpoint of an S3- or SQS-compatible service (MinIO, localstack, moto).", default=None),
)

SOURCES: dict[str, Section] = {
    "files": Section(
        "source (kind: files)",
        _SOURCE_COMMON
        + (Key("path", "string", "Folder or glob of input files, relative to the project or absolute (`data/orders`, `data/orders/*.json`).", required=True),)
        + _READ_FORMAT
        + (
            Key("max_files_per_run", "integer", "Read at most this many new files per run; the rest wait for the next run.", default=None, minimum=1),
            Key("max_bytes_per_run", "size", "Read at most about this many bytes of new files per run (`\"512MB\"`); at least one file is always read.", default=None),
        ),
        "Files in a folder; each run reads only the files not yet ingested.",
    ),
    "table": Section(
        "source (kind: table)",
        _SOURCE_COMMON
        + (
            Key("table", "string", "Name of the pipe table to read incrementally.", required=True),
            Key("on_checkpoint_lost", "string", "What to do when the last consumed instant has been cleaned away: `fail` with the command to recover, or `full_read` of the table.", default="fail", choices=("fail", "full_read")),
            Key("changes", "boolean", "Read the table's change feed instead of the rows its new commits wrote: each changed record once per image, with `_change_type` (`insert`, `update_preimage`, `update_postimage`, `delete`) and `_commit_time`; deleted rows and the old partition of a moved row included (docs/run.md).", default=False),
        ),
        "The rows another pipe table gained since the last run (an incremental read of its timeline).",
    ),
    "hudi": Section(
        "source (kind: hudi)",
        _SOURCE_COMMON
        + (
            Key("path", "string", "Base path of a Hudi table another writer keeps (Hudi Streamer, a Spark or Flink job): relative to the project, absolute, or `s3://bucket/prefix`.", required=True),
            Key("on_checkpoint_lost", "string", "What to do when the last consumed commit is gone (archived past reach, rolled back, the table rebuilt): `fail` with the command to recover, or `full_read` of the table.", default="fail", choices=("fail", "full_read")),
            Key("changes", "boolean", "Read the table's change feed instead of the rows its new commits wrote, as `kind: table` does (on versions 8 and 9 by completion time).", default=False),
        ),
        "The rows a Hudi table written by another tool gained since the last run: an incremental read of its timeline (table versions 6, 8 and 9; by completion time on 8 and 9).",
    ),
    "s3_events": Section(
        "source (kind: s3_events)",
        _SOURCE_COMMON
        + (Key("queue_url", "string", "URL of the SQS queue that receives the bucket's event notifications.", required=True),)
        + _AWS
        + (
            Key("long_poll_wait_s", "integer", "SQS long-poll wait per receive, in seconds.", default=20, minimum=0, maximum=20),
            Key("visibility_timeout_s", "integer", "How long a received message stays hidden from other readers, in seconds.", default=30, minimum=0, maximum=43200),
            Key("max_messages_per_batch", "integer", "Messages asked for per receive call (SQS allows at most 10).", default=5, minimum=1, maximum=10),
            Key("max_messages_per_run", "integer", "Stop receiving after this many messages in one run; unset drains the queue.", default=None, minimum=1),
            Key("max_receive_count", "integer", "A malformed message (not an S3 event notification) received this many times goes to the dead-letter table `<source>_dead_letter` and leaves the queue.", default=5, minimum=1),
        ),
        "S3 event notifications read from an SQS queue (the S3 metadata table's input).",
    ),
    "s3_incremental": Section(
        "source (kind: s3_incremental)",
        _SOURCE_COMMON
        + (Key("metadata_table", "string", "Name of the pipe table holding the S3 events (fed by an `s3_events` source).", required=True),
           Key("buckets", "string_list", "The buckets whose objects the source reads; an event naming another bucket is not followed (it is counted, named in the step's output and recorded in the dead-letter table `<source>_dead_letter`).", required=True))
        + _READ_FORMAT
        + _AWS
        + (
            Key("key_prefix", "string", "Only objects whose key starts with this.", default=None),
            Key("key_suffix", "string", "Only objects whose key ends with this (`.json`).", default=None),
            Key("key_glob", "string", "Only objects whose key matches this glob (`landing/*/orders-*.json`).", default=None),
            Key("min_object_size", "size", "Skip objects smaller than this.", default=None),
            Key("max_object_size", "size", "Skip objects larger than this.", default=None),
            Key("max_bytes_per_run", "size", "Read at most about this many bytes of objects per run.", default=None),
            Key("read_latest_on_missing_checkpoint", "boolean", "On the first run, start from the latest events instead of all of them.", default=False),
        ),
        "The objects named by new events in an S3 metadata table, read incrementally.",
    ),
    "kafka": Section(
        "source (kind: kafka)",
        _SOURCE_COMMON
        + (
            Key("bootstrap_servers", "string", "The brokers to reach first, `host:port[,host:port...]` (Kafka's `bootstrap.servers`).", required=True),
            Key("topic", "string", "The topic to read. Give `topic` or `topic_pattern`.", default=None),
            Key("topic_pattern", "string", "A regular expression (Python's, matching the whole name) of the topics to read; a topic created later that matches is read from its earliest offset. Give `topic` or `topic_pattern`.", default=None),
            Key("format", "string", "What a message's value holds: `json`, a JSON object per message; `avro`, an Avro record in Confluent's wire format (its schema from `schema_registry`); `debezium`, a Debezium change event (Kafka Connect's JsonConverter, with or without schemas, or Avro with `schema_registry`); `dms`, an AWS DMS change record (its Kafka target's `data` and `metadata`, or a row with `Op` I/U/D). A change event is one row of the changed table with `_cdc_op`, `_cdc_position`, `_cdc_ts`, `_cdc_table` and `_hoodie_is_deleted`.", required=True, choices=("json", "avro", "debezium", "dms"), fold_case=True),
            Key("schema", "columns", "Columns of the messages' values (of the changed rows, for `debezium`): a Spark DDL string or a mapping `{column: type}`. Without it the columns are those of the new messages of each run: the schemas the change events carry, or what Spark infers from JSON.", default=None),
            Key("options", "mapping", "Options of Spark's JSON parser (`timestampFormat`, `allowComments`, ...).", default={}),
            Key("properties", "mapping", "Settings of the Kafka client (librdkafka's names, as in a consumer's properties): `security.protocol`, `sasl.mechanism`, `sasl.username`, `sasl.password` (give secrets with `env_var()`: they are masked in every output), `ssl.ca.location`, ...", default={}),
            Key("starting_offsets", "string", "Where a table's first run starts in each partition: `earliest` (every message there is) or `latest` (only messages produced after it).", default="earliest", choices=("earliest", "latest")),
            Key("max_records_per_run", "integer", "Read at most about this many messages per run, every partition in proportion to its backlog; the rest wait for the next run.", default=None, minimum=1),
            Key("on_checkpoint_lost", "string", "What to do when the offsets stored in the table's last commit are no longer in the topic (retention or compaction removed them, the topic was made anew): `fail` naming topic, partition and offsets; `earliest` or `latest` to go on from there (the step says what was skipped).", default="fail", choices=("fail", "earliest", "latest")),
            Key("on_bad_record", "string", "A message whose value is not a JSON object of the declared schema (for `debezium`: not a change event pipe applies): `fail` stops the step naming topic, partition, offset and why; `drop` leaves it out and counts it; `dead_letter` leaves it out and writes it (topic, partition, offset, key, reason, value) to the table `<source>_dead_letter` with the commit.", default="fail", choices=("fail", "drop", "dead_letter")),
            Key("schema_registry", "section", "The schema registry of Avro messages (Confluent's API: Confluent Schema Registry, Apicurio's ccompat API, Karapace, Redpanda): `url`, and `username` and `password` when it asks for them.", default=None, section=SCHEMA_REGISTRY),
            Key("fan_out", "section", "One table per database table the change events capture (`format: debezium` with a `topic_pattern`): the captured tables are written down by `pipe discover <source>` in `<source>.captured.yml` beside this file; each becomes a source `<source>__<table>` and a table `<table_prefix><table>` keyed by its primary key, changes applied in log order.", default=None, section=FAN_OUT),
            Key("fetch_timeout_s", "integer", "A task reading a partition fails when no message arrives for this many seconds before its range is read; the metadata calls of a run wait this long for the brokers, 30 s at most.", default=120, minimum=1),
        ),
        "The messages of a Kafka topic (or of the topics a pattern matches) since the offsets stored in the table's last commit.",
    ),
    "jdbc": Section(
        "source (kind: jdbc)",
        _SOURCE_COMMON
        + (
            Key("url", "string", "The database's JDBC URL (`jdbc:postgresql://host:5432/shop`). Credentials go in `user` and `password`, not in the URL.", required=True),
            Key("dbtable", "string", "The database table to read (`public.orders`; Spark's JDBC option of that name). Give `dbtable` or `query`.", default=None),
            Key("query", "string", "A SELECT whose rows are the source's (`select o.*, c.region from orders o join customers c using (customer_id)`). Give `dbtable` or `query`.", default=None),
            Key("user", "string", "The database user.", default=None),
            Key("password", "string", "The user's password: give it with `env_var()` (masked in every output).", default=None),
            Key("incremental_column", "string", "A column whose value only grows for new and changed rows (an `updated_at` timestamp, an id): each run reads the rows at or above the largest value the last commit stored. Without it every run reads the whole table.", default=None),
            Key("lookback", "integer", "Each run reads again this far below the stored high-water mark (seconds for a timestamp or date column, the column's units for a number): rows of transactions that committed late with an older value are read too.", default=0, minimum=0),
            Key("partition_column", "string", "A numeric, date or timestamp column that splits the read into `num_partitions` parallel queries over its range.", default=None),
            Key("num_partitions", "integer", "How many parallel queries read the rows (with `partition_column`).", default=4, minimum=1, maximum=1024),
            Key("driver", "string", "The JDBC driver's class; known for PostgreSQL, MySQL, MariaDB, SQL Server and Oracle URLs.", default=None),
            Key("driver_package", "string", "Maven coordinates of the JDBC driver (`group:artifact:version`), added to `spark.jars.packages` when pipe starts Spark; known for PostgreSQL, MySQL, MariaDB, SQL Server and Oracle URLs.", default=None),
            Key("properties", "mapping", "Options of Spark's JDBC source and the driver (`fetchsize`, `sessionInitStatement`, `ssl`, ...).", default={}),
        ),
        "The rows of a database table or query, read with Spark's JDBC source: those past the high-water mark of `incremental_column` stored in the table's last commit.",
    ),
}

OPERATIONS = (
    "upsert", "insert", "bulk_insert", "delete", "insert_overwrite",
    "insert_overwrite_table", "delete_partition", "bootstrap",
)
TABLE_TYPES = ("copy_on_write", "merge_on_read")

CLEAN = Section(
    "clean",
    (
        Key("policy", "string", "Which file versions cleaning keeps.", default="keep_latest_commits", choices=("keep_latest_commits", "keep_latest_file_versions")),
        Key("retain", "integer", "Commits (or file versions) kept.", default=10, minimum=1),
        Key("inline", "boolean", "Clean right after each commit.", default=True),
    ),
    "Removal of file versions no retained instant needs.",
)

ARCHIVE = Section(
    "archive",
    (
        Key("min_instants", "integer", "Instants kept on the active timeline after archiving.", default=20, minimum=1),
        Key("max_instants", "integer", "Archive once the active timeline holds more than this.", default=30, minimum=2),
    ),
    "Moving old instants out of the active timeline.",
)

COMPACTION = Section(
    "compaction",
    (
        Key("inline", "boolean", "Compact right after a deltacommit when due.", default=True),
        Key("max_delta_commits", "integer", "Compact once this many deltacommits followed the last compaction.", default=5, minimum=1),
    ),
    "Folding log files into base files (merge_on_read only).",
)

BOOTSTRAP = Section(
    "bootstrap",
    (
        Key("path", "string", "Folder of the existing Parquet dataset, relative to the project or absolute.", required=True),
        Key("mode", "string", "`full_record` rewrites the data with meta columns; `metadata_only` keeps the original files.", default="full_record", choices=("full_record", "metadata_only")),
        Key("partition_regex", "string", "Only partitions whose path matches this regular expression are bootstrapped.", default=None),
    ),
    "Turning an existing Parquet dataset into a pipe table (`operation: bootstrap`).",
)

TABLE = Section(
    "table",
    (
        Key("description", "string", "Free text for people; metadata only.", default=""),
        Key("tags", "string_list", "Tags for selection (`--select tag:x`); metadata only.", default=[]),
        Key("type", "string", "Storage layout of the Hudi table.", default="copy_on_write", choices=TABLE_TYPES),
        Key("operation", "string", "Write operation of each run. Default: `upsert` when the table has a `key`, else `insert`.", default=None, choices=OPERATIONS),
        Key("key", "string_list", "Record key column(s). Keys are unique across the table.", default=[]),
        Key("precombine", "string", "Column ordering versions of a row: the largest wins within a batch and a stored newer row is never overwritten by an older one.", default=None),
        Key("tombstone_days", "integer", "A deleted key keeps its precombine value this many days: an older event for it, arriving in a later run, is ignored instead of inserting the key again (deletes that stay deleted, whatever the batch boundaries). Unset: a deleted key is forgotten, as in Hudi.", default=None, minimum=1),
        Key("precombine_nulls", "string", "A row whose precombine value is null: `fail` stops the write naming table, column and key; `lowest` orders it below every value (it loses within the batch and to any stored version).", default="fail", choices=("fail", "lowest")),
        Key("partition_by", "string_list", "Partition column(s), in path order.", default=[]),
        Key("hive_style_partitioning", "boolean", "Partition folders named `column=value` (else just `value`).", default=True),
        Key("table_version", "integer", "Hudi table version pipe creates the table with: 6 (Hudi 0.14 and later read it), or 8 or 9 (Hudi 1.x's, with completion times). An existing table keeps the version it has.", default=6, choices=(6, 8, 9)),
        Key("metadata_table", "boolean", "Keep a Hudi metadata table for the table (its `files` partition, in step with every commit), which Java readers and writers and hudi-rs list files from instead of listing storage. A table that has one keeps it in step either way.", default=False),
        Key("cdc_logging", "string", "Keep Hudi's change data capture log for the table (`hoodie.table.cdc.enabled`, `.cdc` files beside every rewritten base file) in this supplemental-logging mode, so that Java Hudi's CDC queries (`hoodie.datasource.query.incremental.format=cdc`) return every insert, update and delete with its images: `data_before_after` (both images in the log; Hudi's default), `data_before`, or `op_key_only` (the smallest log; readers look the images up). Set when the table is created; unset, a new table has none and an existing one keeps what it has.", default=None, choices=("op_key_only", "data_before", "data_before_after"), fold_case=True),
        Key("index", "string", "`global`: a key is unique across the table and a changed partition value moves the row. `partition`: keys are unique within a partition only (faster; for keys that never change partition). `bucket`: Hudi's simple bucket index, keys unique within a partition, each in the file group of its hashed bucket, as Java Hudi's `hoodie.index.type=BUCKET` puts them (needs `buckets`). `record`: as `global`, with Hudi's record index (`hoodie.index.type=RECORD_INDEX`) kept in the table's metadata table, so a write reads only the file groups holding its keys.", default="global", choices=("global", "partition", "bucket", "record")),
        Key("buckets", "integer", "With `index: bucket`: the number of buckets (file groups) per partition, Hudi's `hoodie.bucket.index.num.buckets`; fixed for the table's life.", default=None, minimum=1),
        Key("delete_when", "string", "SQL predicate; rows matching it are deleted from the table instead of written (`status = 'cancelled'`).", default=None),
        Key("schema", "columns", "Declared output columns (DDL string or `{column: type}`); checked against key, precombine and partition columns.", default=None),
        Key("insert_duplicates", "string", "For insert/bulk_insert: `none` writes rows as they come, `drop` skips rows whose key is already stored, `fail` stops the run.", default="none", choices=("none", "drop", "fail")),
        Key("combine_before_insert", "boolean", "For insert/bulk_insert: deduplicate the batch by key first (precombine decides).", default=False),
        Key("bulk_insert_sort_mode", "string", "For bulk_insert: how rows are sorted before files are written.", default="NONE", choices=("NONE", "GLOBAL_SORT", "PARTITION_SORT"), fold_case=True),
        Key("partitions_to_delete", "string_list", "For delete_partition: partition paths to drop; `*` wildcards allowed (`region=EU`, `dt=2024-*`).", default=[]),
        Key("max_file_size", "size", "Target largest size of a base file (at least 1MB).", default="120MB", minimum=1024 * 1024),
        Key("small_file_limit", "size", "Files below this size take new inserts before a new file group opens; 0 turns it off.", default="100MB"),
        Key("clean", "section", "Cleaning of old file versions.", default={}, section=CLEAN),
        Key("archive", "section", "Archiving of the timeline.", default={}, section=ARCHIVE),
        Key("compaction", "section", "Compaction (merge_on_read only).", default={}, section=COMPACTION),
        Key("bootstrap", "section", "Source dataset for `operation: bootstrap`.", default=None, section=BOOTSTRAP),
        _EXPECT,
    ) + _TESTS,
    "A table pipe writes. Its SELECT lives in `<name>.sql` beside the YAML file.",
)

# --- checking a value against a section -------------------------------------------------------

_TYPE_WORDS = {
    "string": "a string", "integer": "an integer", "boolean": "true or false",
    "string_list": "a string or a list of strings", "mapping": "a mapping", "size": "a size such as 120MB or a number of bytes",
    "columns": "a DDL string or a mapping of column to type", "section": "a mapping", "sections": "a mapping",
}


def type_name(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}.get(
        type(value), type(value).__name__
    )


@dataclass
class Checker:
    """Checks values of one YAML document against sections, collecting every problem."""

    doc: Doc
    errors: Collector
    # Optional extra names offered in "did you mean" hints, e.g. keys of other source kinds.
    elsewhere: Callable[[str], str | None] | None = None

    def section(self, section: Section, value: Any, path: Path, what: str) -> dict[str, Any]:
        """Returns the section's values, coerced, with defaults for absent keys. Keys with
        errors get their default so that later stages can still run and report more."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.errors.error(self.doc.at(path), f"{what} must be a mapping of settings, not {type_name(value)}")
            value = {}
        out: dict[str, Any] = {}
        for name in value:
            if name not in section.by_name:
                hint = self.elsewhere(str(name)) if self.elsewhere is not None else None
                if hint is None:
                    hint = did_you_mean(str(name), section.by_name)
                if hint is None:
                    hint = "known keys: " + ", ".join(sorted(section.by_name))
                self.errors.error(self.doc.at(path + (name,), key=True), f"unknown key '{name}' in {what}", hint)
        for key in section.keys:
            if key.name in value:
                out[key.name] = self.value(key, value[key.name], path + (key.name,), what)
            elif key.required:
                self.errors.error(
                    self.doc.at(path, key=True),
                    f"{what} is missing required key '{key.name}'",
                    f"add `{key.name}:` ({key.doc[0].lower() + key.doc[1:]})",
                )
                out[key.name] = None
            else:
                out[key.name] = self._default(key, path + (key.name,), what)
        return out

    def _default(self, key: Key, path: Path, what: str) -> Any:
        if key.type == "section" and key.default is not None:
            return self.section(key.section, {}, path, what)
        if key.type == "size" and key.default is not None:
            return parse_size(key.default)
        if isinstance(key.default, (dict, list)):
            return type(key.default)(key.default)
        return key.default

    def value(self, key: Key, value: Any, path: Path, what: str) -> Any:
        label = f"'{key.name}' in {what}"

        def wrong() -> Any:
            self.errors.error(self.doc.at(path), f"{label} must be {_TYPE_WORDS.get(key.type, key.type)}, not {type_name(value)}", key.doc)
            return self._default(key, path, what)

        if value is None and not key.required:
            return self._default(key, path, what)  # `key:` with nothing after it: the default
        t = key.type
        if t == "string":
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                return wrong()
            value = str(value)
            if key.choices:
                return self._choice(key, value, path, label)
            return value
        if t == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                return wrong()
            if key.minimum is not None and value < key.minimum or key.maximum is not None and value > key.maximum:
                bounds = f"between {key.minimum} and {key.maximum}" if key.maximum is not None else f"at least {key.minimum}"
                self.errors.error(self.doc.at(path), f"{label} is {value}; it must be {bounds}", key.doc)
                return self._default(key, path, what)
            if key.choices and value not in key.choices:
                self.errors.error(self.doc.at(path), f"{label} is {value}; it must be one of {', '.join(map(str, key.choices))}", key.doc)
                return self._default(key, path, what)
            return value
        if t == "boolean":
            return value if isinstance(value, bool) else wrong()
        if t == "string_list":
            if value is None:
                return []
            items = [value] if isinstance(value, (str, int)) and not isinstance(value, bool) else value
            if not isinstance(items, list) or any(isinstance(i, (bool, list, dict)) or i is None for i in items):
                return wrong()
            items = [str(i) for i in items]
            seen: set[str] = set()
            for i, item in enumerate(items):
                if item in seen:
                    self.errors.error(self.doc.at(path + (i,)), f"'{item}' is listed twice in {label}")
                seen.add(item)
            return items
        if t == "mapping":
            if value is None:
                return {}
            if not isinstance(value, dict):
                return wrong()
            return {str(k): v for k, v in value.items()}
        if t == "size":
            size = parse_size(value)
            if size is None:
                return wrong()
            if key.minimum is not None and size < key.minimum:
                self.errors.error(self.doc.at(path), f"{label} is {value}; it must be at least {key.minimum} bytes", key.doc)
                return self._default(key, path, what)
            return size
        if t == "columns":
            return self._columns(value, path, label) if isinstance(value, (str, dict)) else wrong()
        if t == "section":
            return self.section(key.section, value, path, f"'{key.name}' of {what}")
        if t == "sections":
            if value is None:
                value = {}
            if not isinstance(value, dict):
                return wrong()
            return {str(n): self.section(key.section, v, path + (n,), f"{key.section.title} '{n}'") for n, v in value.items()}
        return value  # "any"

    def _choice(self, key: Key, value: str, path: Path, label: str) -> str | None:
        choices = key.choices or ()
        probe = {c.lower(): c for c in choices} if key.fold_case else {c: c for c in choices}
        found = probe.get(value.lower() if key.fold_case else value)
        if found is not None:
            return found
        hint = did_you_mean(value, choices) or ""
        self.errors.error(self.doc.at(path), f"unknown value '{value}' for {label}", (hint + " " if hint else "") + "choose one of: " + ", ".join(choices))
        return None

    def _columns(self, value: Any, path: Path, label: str) -> list[dict[str, str]] | None:
        from compiler.columns import ColumnsError, parse_columns  # small, but keeps this module readable

        if isinstance(value, dict):
            cols = []
            for name, typ in value.items():
                if not isinstance(typ, str):
                    self.errors.error(self.doc.at(path + (name,)), f"type of column '{name}' in {label} must be a string such as BIGINT")
                    continue
                text = f"`{name}` {typ}"
                try:
                    cols.extend(parse_columns(text))
                except ColumnsError as exc:
                    self.errors.error(self.doc.at(path + (name,)), f"column '{name}' in {label}: {exc}", exc.hint)
            return cols
        try:
            return parse_columns(value)
        except ColumnsError as exc:
            self.errors.error(self.doc.at(path), f"{label}: {exc}", exc.hint)
            return None
