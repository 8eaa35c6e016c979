"""One small file-system interface for the timeline and the writers: local folders and S3.

Paths given to a Storage are relative to its root and use `/`. The two operations the table
format leans on for safety are here and nowhere else:
- `write_atomic`: a reader sees the old bytes or the new ones, never a part (temp + rename on
  local disks; a single PutObject on S3);
- `create_exclusive`: create a file that must not exist yet, atomically (link() of a complete
  temp file on local disks, so the name never points at partial content; PutObject with
  `If-None-Match: *` on S3). This is how an instant is completed and a lock is taken.
A Storage is described by a picklable `StorageSpec`, so Spark executors can open their own."""

from __future__ import annotations

import errno
import io
import os
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Protocol


class StorageError(Exception):
    """A storage operation failed; the message says what we were doing."""


class PathOutsideRoot(StorageError, ValueError):
    """A path given to a Storage would leave its root (a `..` part): refused before any I/O."""


def path_problem(path: str) -> str | None:
    """What is wrong with `path` as a path relative to a table, read from one of the table's
    own files (a marker, a plan), or None: it must not be absolute, name another file system
    (`s3://...`), go up (`..`), or point into the timeline folder `.hoodie`."""
    if not isinstance(path, str):
        return f"{path!r} is not a path"
    if path.startswith("/"):
        return "it is an absolute path"
    if "://" in path or path.startswith(("s3:", "s3a:", "file:", "hdfs:")):
        return "it names another file system"
    parts = path.split("/")
    if ".." in parts or "\0" in path:
        return "it leaves the table's folder (..)"
    if parts and parts[0] == ".hoodie":
        return "it points into the timeline folder .hoodie"
    return None


def check_relative(path: str, root: str) -> list[str]:
    """The parts of `path`, a path relative to the storage root `root`. A path is resolved
    inside the root whatever it holds (empty parts and `.` are ignored, a leading `/` is the
    root), except that a `..` part or a NUL byte is refused: a path read from a file of the
    table (a marker list, a plan) must never reach a file outside it, whatever a later layer
    does with it (os.path.join, Hadoop's path normalization, an S3 client)."""
    parts = [p for p in path.split("/") if p and p != "."]
    if any(p == ".." for p in parts) or "\0" in path:
        raise PathOutsideRoot(f"path {path!r} leaves the table's folder {root}: refused")
    return parts


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the storage root
    size: int
    mtime_ms: int


@dataclass(frozen=True)
class StorageSpec:
    """How to reach a storage root; travels to executors."""

    uri: str  # a local absolute path, file:///..., s3://bucket/prefix or s3a://bucket/prefix
    # S3: endpoint_url, region, path_style, credentials (runtime/s3.py: from the target's fs.s3a
    # settings); kept out of repr, which error messages and logs may show
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple, repr=False)

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith(("s3://", "s3a://"))

    def child(self, relative: str) -> "StorageSpec":
        return StorageSpec(self.uri.rstrip("/") + "/" + relative.strip("/"), self.options)


class Storage(Protocol):
    spec: StorageSpec

    def read_bytes(self, path: str) -> bytes: ...
    def read_range(self, path: str, start: int, end: int) -> bytes: ...
    def write_atomic(self, path: str, data: bytes, temp_tag: str = "") -> None: ...
    def create_exclusive(self, path: str, data: bytes) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def delete(self, path: str) -> None: ...
    def list_files(self, prefix: str = "", recursive: bool = True) -> list[FileInfo]: ...
    def full_path(self, path: str) -> str: ...
    def set_mtime(self, path: str, mtime_ms: int) -> bool: ...


# A file being written sits under a hidden temporary name beside its final place, renamed when
# complete. The name must be nothing Hudi lists or parses: Java 0.x lists a partition's files
# whose extension is a file format's or whose name contains ".log", takes as a base file any
# name containing ".parquet", and finds a log file with an unanchored regex
# (FSUtils.LOG_FILE_PATTERN `^\.(.+)_(.*)\.(log|archive)\.(\d+)...`), so a temp name built from
# a log file's name was a phantom file group. `.pipe_<tag>_<hex>.tmp` has none of these; the
# tag of a data file is the instant writing it, so that rollback finds what a dead task left.
TEMP_PREFIX, TEMP_SUFFIX = ".pipe_", ".tmp"


def temp_name(tag: str = "") -> str:
    """A fresh temporary file name, with `tag` (digits: an instant) in it."""
    if tag and not tag.isdigit():
        raise ValueError(f"temp file tag {tag!r} is not an instant")
    return f"{TEMP_PREFIX}{tag + '_' if tag else ''}{uuid.uuid4().hex}{TEMP_SUFFIX}"


def open_storage(spec: StorageSpec) -> Storage:
    if spec.is_s3:
        return S3Storage(spec)
    return LocalStorage(spec)


class RangedFile(io.RawIOBase):
    """A stored file of known size read as a seekable, read-only file, each read one
    `read_range` (one ranged GET on S3): pyarrow reads a Parquet file's footer and only the
    column chunks it wants through it."""

    def __init__(self, storage: Storage, path: str, size: int):
        super().__init__()
        self.storage, self.path, self.size, self.pos = storage, path, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = max(0, offset if whence == os.SEEK_SET else self.pos + offset if whence == os.SEEK_CUR else self.size + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        data = self.storage.read_range(self.path, self.pos, end)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _drop_checksum(full: str) -> None:
    """Java Hudi on a local disk writes through Hadoop's LocalFileSystem, which keeps a CRC of
    each file beside it (`.<name>.crc`) and fails every later read of a file whose bytes no
    longer match it ("Could not load Hoodie properties"). A file pipe replaces, or deletes,
    loses its stale sidecar."""
    folder, name = os.path.split(full)
    try:
        os.unlink(os.path.join(folder, f".{name}.crc"))
    except FileNotFoundError:
        pass


class LocalStorage:
    def __init__(self, spec: StorageSpec):
        self.spec = spec
        root = spec.uri[len("file://"):] if spec.uri.startswith("file://") else spec.uri
        self.root = os.path.abspath(root)

    def full_path(self, path: str) -> str:
        return os.path.join(self.root, *check_relative(path, self.root)) if path else self.root

    def read_bytes(self, path: str) -> bytes:
        with open(self.full_path(path), "rb") as f:
            return f.read()

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file."""
        with open(self.full_path(path), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def _temp_beside(self, full: str, data: bytes, tag: str = "") -> str:
        """A hidden temp file holding `data`, synced, in the same folder as `full` so that
        rename and link stay on one file system (see temp_name)."""
        folder = os.path.dirname(full)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, temp_name(tag))
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def write_atomic(self, path: str, data: bytes, temp_tag: str = "") -> None:
        """Writes the whole file under a hidden temporary name (with `temp_tag` in it), synced,
        then renamed into place."""
        full = self.full_path(path)
        os.replace(self._temp_beside(full, data, temp_tag), full)
        _drop_checksum(full)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        full = self.full_path(path)
        tmp = self._temp_beside(full, data)
        try:
            os.link(tmp, full)  # fails if `full` exists; the name appears with all its bytes
            _drop_checksum(full)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.full_path(path))

    def delete(self, path: str) -> None:
        full = self.full_path(path)
        try:
            os.unlink(full)
        except FileNotFoundError:
            pass
        _drop_checksum(full)

    def list_files(self, prefix: str = "", recursive: bool = True) -> list[FileInfo]:
        base = self.full_path(prefix)
        out: list[FileInfo] = []
        if not os.path.isdir(base):
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            for name in filenames:
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                out.append(FileInfo(rel_dir + name, st.st_size, int(st.st_mtime * 1000)))
            if not recursive:
                break
        return out

    def set_mtime(self, path: str, mtime_ms: int) -> bool:
        """Sets a file's modification time (as Hadoop's setTimes); True when done."""
        os.utime(self.full_path(path), ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
        return True

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self.full_path(prefix)
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir())
        except FileNotFoundError:
            return []


class S3Storage:
    """S3 through boto3 (settings: runtime/s3.py). Conditional create uses PutObject
    If-None-Match (S3 since 2024; MinIO and moto support it too). `full_path` keeps the root's
    scheme (s3:// or s3a://): Spark reads data files by it, through its own S3 file system."""

    def __init__(self, spec: StorageSpec):
        from runtime import s3

        self.spec = spec
        self.scheme, rest = spec.uri.split("://", 1)
        self.bucket, _, self.prefix = rest.partition("/")
        self.prefix = self.prefix.strip("/")
        self.client = s3.client(spec.options)

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, "/".join(check_relative(path, self.spec.uri))) if p)

    def full_path(self, path: str) -> str:
        return f"{self.scheme}://{self.bucket}/{self._key(path)}"

    def read_bytes(self, path: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"].read()
        except self.client.exceptions.NoSuchKey as exc:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.full_path(path)) from exc

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object (one ranged GET)."""
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(path), Range=f"bytes={start}-{end - 1}")
        except self.client.exceptions.NoSuchKey as exc:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.full_path(path)) from exc
        return obj["Body"].read()

    def write_atomic(self, path: str, data: bytes, temp_tag: str = "") -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise

    def exists(self, path: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(path))
            return True
        except ClientError:
            return False

    def delete(self, path: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(path))

    def set_mtime(self, path: str, mtime_ms: int) -> bool:
        return False  # an object's LastModified is the store's to set

    def _pages(self, prefix: str, delimiter: str | None) -> Iterator[dict]:
        kwargs = {"Bucket": self.bucket, "Prefix": self._key(prefix).rstrip("/") + "/" if prefix or self.prefix else ""}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        yield from self.client.get_paginator("list_objects_v2").paginate(**kwargs)

    def list_files(self, prefix: str = "", recursive: bool = True) -> list[FileInfo]:
        out = []
        root = self._key("") + "/" if self.prefix else ""
        for page in self._pages(prefix, None if recursive else "/"):
            for obj in page.get("Contents", ()):
                out.append(FileInfo(obj["Key"][len(root):], obj["Size"], int(obj["LastModified"].timestamp() * 1000)))
        return out

    def list_dirs(self, prefix: str = "") -> list[str]:
        names = []
        for page in self._pages(prefix, "/"):
            for cp in page.get("CommonPrefixes", ()):
                names.append(cp["Prefix"].rstrip("/").rsplit("/", 1)[-1])
        return sorted(names)
