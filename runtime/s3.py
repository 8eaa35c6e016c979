"""How pipe reaches S3: one configuration, Hadoop's `fs.s3a.*` settings, for Spark's own file
system (s3a) and for pipe's own boto3 clients, and the check that Spark can read a lake on S3.

pipe reads and writes table files on S3 in two ways: Spark reads data files through its Hadoop
file system (`s3a://`, and `s3://` mapped to S3A when Spark has no file system of its own for
it), and pipe's code (the timeline on the driver; data files written, merged and compacted in
the tasks) through boto3. A user configures S3 once, in the target's `spark.hadoop.fs.s3a.*`
settings (or per bucket, `spark.hadoop.fs.s3a.bucket.<bucket>.*`, as S3A reads them); boto3
takes endpoint, region, path-style access and credentials from them, and boto3's own defaults
(environment, ~/.aws, instance or pod role) for what they leave out. The settings travel to the
tasks as the options of a StorageSpec, never through the driver's environment."""

from __future__ import annotations

import threading
from typing import Any, Mapping

S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
SDK_CLASS = "software.amazon.awssdk.services.s3.S3Client"  # S3A's AWS SDK (v2)
SCHEMES = ("s3://", "s3a://")
PREFIX = "spark.hadoop.fs.s3a."

# fs.s3a key -> option of a StorageSpec (and of `client`)
_KEYS = (
    ("endpoint", "endpoint_url"),
    ("endpoint.region", "region"),
    ("path.style.access", "path_style"),
    ("access.key", "access_key_id"),
    ("secret.key", "secret_access_key"),
    ("session.token", "session_token"),
)


def is_s3(uri: str) -> bool:
    return uri.startswith(SCHEMES)


def bucket_of(uri: str) -> str:
    return uri.split("://", 1)[1].partition("/")[0]


def s3a_settings(spark_conf: Mapping[str, Any]) -> dict[str, str]:
    """The `fs.s3a.*` entries of a target's Spark settings (`spark.hadoop.` taken off)."""
    return {k[len("spark.hadoop."):]: str(v) for k, v in spark_conf.items() if k.startswith(PREFIX) and v is not None}


def client_options(settings: Mapping[str, str], bucket: str) -> tuple[tuple[str, str], ...]:
    """boto3's options for `bucket` from the s3a settings: a per-bucket setting wins over the
    general one, as in S3A. An endpoint without a scheme is https unless
    fs.s3a.connection.ssl.enabled is false."""

    def get(key: str) -> str | None:
        value = settings.get(f"fs.s3a.bucket.{bucket}.{key}", settings.get(f"fs.s3a.{key}"))
        return value.strip() if value is not None and value.strip() else None

    out = []
    for key, option in _KEYS:
        value = get(key)
        if value is None:
            continue
        if option == "endpoint_url" and "://" not in value:
            value = ("http://" if (get("connection.ssl.enabled") or "true").lower() == "false" else "https://") + value
        if option == "path_style":
            value = "true" if value.lower() == "true" else "false"
        out.append((option, value))
    return tuple(out)


_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def clients_lock() -> threading.Lock:
    """Held while a boto3 client is made from the default session (which must not make two at
    once); for clients of other services (Glue: runtime/sync/glue.py)."""
    return _clients_lock


def client(options=()):
    """A boto3 S3 client with the options of `client_options` (or a StorageSpec's): one per
    options in a process (clients are thread-safe; making one takes a while, and boto3's
    default session must not make two at once)."""
    key = tuple(options)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = _new_client(key)
        return _clients[key]


def _new_client(options: tuple):
    import boto3
    from botocore.config import Config

    opts = dict(options)
    kwargs: dict[str, Any] = {}
    for option, arg in (("endpoint_url", "endpoint_url"), ("region", "region_name"), ("access_key_id", "aws_access_key_id"),
                        ("secret_access_key", "aws_secret_access_key"), ("session_token", "aws_session_token")):
        if opts.get(option):
            kwargs[arg] = opts[option]
    if opts.get("path_style") == "true":
        kwargs["config"] = Config(s3={"addressing_style": "path"})
    return boto3.client("s3", **kwargs)


class SparkCannotReadS3(Exception):
    """Spark has no file system for the lake's scheme; `hint` says what to add."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


_checked: dict[tuple[int, str], bool] = {}
_checked_lock = threading.Lock()


def has_s3a(spark) -> bool:
    """Whether Spark itself can read s3a:// (hadoop-aws and the AWS SDK on its classpath)."""
    return _can_read(spark, "s3a")


def _can_read(spark, scheme: str) -> bool:
    """Whether Spark's Hadoop configuration has a file system for `scheme` (one set by the
    target, by the cluster's core-site.xml - EMRFS on EMR - or found on the classpath). For
    `s3` with none, S3A is mapped to it when Spark has S3A."""
    from runtime.spark import api as spark_api

    if spark_api.is_connect(spark):
        return _connect_can_read(spark, scheme)
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    key = (id(spark.sparkContext), scheme)
    with _checked_lock:
        if key in _checked:
            return _checked[key]
        ok = _has_file_system(jvm, conf, scheme)
        if not ok and scheme == "s3" and _has_file_system(jvm, conf, "s3a"):
            # no file system for s3:// (Hadoop has none of its own since 3.0): S3A serves it,
            # with the same fs.s3a.* settings
            conf.set("fs.s3.impl", S3A_CLASS)
            conf.set("fs.AbstractFileSystem.s3.impl", "org.apache.hadoop.fs.s3a.S3A")
            ok = True
        _checked[key] = ok
        return ok


def _connect_can_read(spark, scheme: str) -> bool:
    """Over Spark Connect, whose server's classpath pipe cannot inspect: Spark plans a read of a
    path that does not exist. A server without the scheme's file system fails on the missing
    class; one with it fails later (the object is not there, or the request is refused), or not
    at all. One request to the server per session and scheme."""
    key = (spark.client._session_id, scheme)
    with _checked_lock:
        if key in _checked:
            return _checked[key]
    try:
        spark.read.text(f"{scheme}://pipe-probe-bucket/pipe-probe-{scheme}/").schema
        ok = True
    except Exception as exc:  # noqa: BLE001 - classified by its text
        text = str(exc)
        ok = not any(w in text for w in ("ClassNotFoundException", "No FileSystem for scheme", "UnsupportedFileSystemException",
                                         "NoClassDefFoundError"))
    with _checked_lock:
        _checked[key] = ok
    return ok


def _has_file_system(jvm, conf, scheme: str) -> bool:
    """Whether Hadoop finds a file system class for `scheme`; for S3A, also the AWS SDK it needs.
    Classes load through the Configuration, whose class loader sees `spark.jars` (py4j's
    Class.forName would not)."""
    try:
        name = jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf).getName()
        if name == S3A_CLASS:
            conf.getClassByName(SDK_CLASS)
        return True
    except Exception:  # noqa: BLE001 - UnsupportedFileSystemException, ClassNotFoundException, NoClassDefFoundError
        return False


def hadoop_version(spark) -> str | None:
    from runtime.spark import api as spark_api

    if spark_api.is_connect(spark):
        return None
    try:
        return str(spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion())
    except Exception:  # noqa: BLE001
        return None


def check_spark(spark, uri: str, what: str) -> None:
    """Raises SparkCannotReadS3 unless Spark can read `uri` (a lake or table on S3); maps
    s3:// to S3A where needed. `what` names the table for the message."""
    if not is_s3(uri):
        return
    scheme = uri.split("://", 1)[0]
    if _can_read(spark, scheme):
        return
    version = hadoop_version(spark) or "<the version of Spark's Hadoop>"
    raise SparkCannotReadS3(
        f"{what} is on S3 ({uri}), but this Spark cannot read {scheme}:// paths: it has no S3 file system "
        f"(hadoop-aws, and the AWS SDK it needs, are not on its classpath)",
        f"add hadoop-aws of Spark's Hadoop version to the target's Spark settings: "
        f"`spark.jars.packages: org.apache.hadoop:hadoop-aws:{version}` (it brings the AWS SDK), or its jars with `spark.jars`; "
        f"see docs/deploy.md#s3")
