"""Class-data sharing for the Spark driver JVM pipe starts: a fresh `pipe run` maps the classes
a Spark driver loads from an archive instead of loading and verifying them one by one from
pyspark's jars (JDK 13+ dynamic AppCDS, HotSpot only).

Measured on 2 cores (bench/RESULTS.md, java-1m, the first write of a fresh process): Spark's
start 6.7 s -> 3.9 s and the whole process 19.9 s -> 15.3 s. The archive is made once, at the
exit of the first session that finds none (its JVM writes the classes it loaded,
`-XX:ArchiveClassesAtExit`; that exit takes a few seconds longer), and used by every session
after it (`-XX:SharedArchiveFile`). It is named by what it depends on (the java binary, pyspark's
version and jars): a JDK or pyspark upgrade makes a new one, and HotSpot ignores an archive that
does not match its class path.

Where: the `jvm` folder of pipe's cache folder (runtime/host.py: $PIPE_CACHE_DIR, else
$XDG_CACHE_HOME/pipe, else ~/.cache/pipe, this user's alone), about 190 MB per pyspark and JDK
pair. PIPE_JVM_CACHE=off turns it off. The JVM maps the archive's classes as code, so only an
archive file this user owns that no one else can write is used. Nothing is done when the
driver's options already name an archive or turn sharing off (-XX:SharedArchiveFile,
-XX:ArchiveClassesAtExit, -Xshare), or the JVM is not HotSpot."""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

OPTIONS = "spark.driver.defaultJavaOptions"
_OWN_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare", "SharedClassListFile")
_DUMP_SECONDS = 180  # the longest a first session's exit waits for its JVM to write the archive
_STALE_DUMP = 900  # a dump lock older than this is from a process that died: another may try


@dataclass(frozen=True)
class Archive:
    path: Path  # the archive (used when it exists)
    dump_to: Path | None = None  # this session writes it here at exit, then renames it to `path`

    @property
    def option(self) -> str:
        # HotSpot's notes on the archive (one it cannot map, classes it cannot archive) stay
        # off the user's console: without the archive the JVM just starts as it would have
        quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off"
        return f"{quiet} -XX:ArchiveClassesAtExit={self.dump_to}" if self.dump_to else f"{quiet} -XX:SharedArchiveFile={self.path}"


def cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The `jvm` folder of pipe's cache folder (runtime/host.py: this user's alone), or None
    when PIPE_JVM_CACHE=off or the folder is not safe."""
    from runtime.host import UnsafeFolder, cache_dir as pipe_cache, private_dir

    env = os.environ if env is None else env
    if (env.get("PIPE_JVM_CACHE") or "").strip().lower() in ("off", "0", "false", "no"):
        return None
    try:
        return private_dir(pipe_cache() / "jvm")
    except (UnsafeFolder, OSError):
        return None


def _private_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022 and st.st_size > 0


def _key(java_executable: str, settings: Mapping[str, str], env: Mapping[str, str]) -> str:
    import pyspark

    key = hashlib.sha256()
    # what else decides the driver's class path: an archive made for another is never mapped
    key.update(f"{settings.get('spark.driver.extraClassPath', '')}|{env.get('SPARK_CONF_DIR', '')}|".encode())
    real = os.path.realpath(java_executable)
    key.update(real.encode())
    key.update(str(os.stat(real).st_mtime_ns).encode())
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    for jar in sorted(jars.glob("*.jar")):
        key.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return f"spark-driver-{pyspark.__version__}-{key.hexdigest()[:16]}"


def plan(java, settings: Mapping[str, str], env: Mapping[str, str] | None = None, *, make: bool = True) -> Archive | None:
    """The archive a driver started by `java` with `settings` uses or makes; None when it
    neither uses nor makes one (see the module's docstring). `make=False`: only one that exists
    (pipe's Connect server, runtime/spark/server.py, whose JVM is stopped by a signal, not at a
    session's exit where the archive is written)."""
    env = os.environ if env is None else env
    if java is None or os.name == "nt" or not getattr(java, "hotspot", False):
        return None
    said = " ".join(str(v) for k, v in settings.items() if "JavaOptions" in k)
    said += " " + " ".join(env.get(k, "") for k in ("PYSPARK_SUBMIT_ARGS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "SPARK_SUBMIT_OPTS"))
    if any(flag in said for flag in _OWN_FLAGS):
        return None
    folder = cache_dir(env)
    if folder is None:
        return None
    try:
        name = _key(java.executable, settings, env)
    except OSError:
        return None
    path = folder / f"{name}.jsa"
    _remove_orphans(folder)
    if _private_file(path):
        return Archive(path)
    if not make or (folder / f".{name}.failed").exists():  # this JVM could not write one (e.g. a folder of files on its class path)
        return None
    lock = folder / f".{name}.dumping"
    if not _take(lock):
        return None  # another session is writing it
    return Archive(path, folder / f".{name}.{os.getpid()}.partial")


def _take(lock: Path) -> bool:
    """Creates `lock` (this session writes the archive); a lock older than _STALE_DUMP is of a
    session that died, and is taken over."""
    for attempt in range(2):
        try:
            os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            return True
        except FileExistsError:
            try:
                if attempt or time.time() - os.lstat(lock).st_mtime < _STALE_DUMP:
                    return False
                os.unlink(lock)
            except OSError:
                return False
        except OSError:
            return False
    return False


def _remove_orphans(folder: Path) -> None:
    """Removes partial archives a JVM went on writing after its session gave up waiting (an
    interrupted exit): old, and of a process that no longer runs."""
    for partial in folder.glob(".*.partial"):
        try:
            pid = int(partial.name.rsplit(".", 2)[-2])
            if time.time() - os.lstat(partial).st_mtime < _STALE_DUMP:
                continue
            try:
                os.kill(pid, 0)
                continue  # still running
            except ProcessLookupError:
                pass
            partial.unlink()
        except (ValueError, OSError):
            continue


def with_option(settings: dict[str, str], archive: Archive) -> dict[str, str]:
    """`settings` with the archive's option first among the driver's default Java options."""
    current = settings.get(OPTIONS, "")
    return {**settings, OPTIONS: f"{archive.option} {current}".strip()}


def finish_at_exit(archive: Archive, proc) -> None:
    """When this session makes the archive: at this process's exit, end the driver JVM (`proc`,
    the launcher's process, whose JVM exits when its stdin closes) and wait while it writes the
    archive, then put it in place; a failed or partial write is removed."""
    if archive.dump_to is None:
        return
    owner = os.getpid()

    def finish() -> None:
        if os.getpid() != owner:  # a forked child's exit: the JVM is its parent's
            return
        lock = archive.path.with_name(f".{archive.path.stem}.dumping")
        try:
            if proc is not None and proc.poll() is None:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=_DUMP_SECONDS)
            if proc is not None and proc.returncode == 0 and _private_file(archive.dump_to):
                os.replace(archive.dump_to, archive.path)
                log.debug("the Spark driver's classes were archived in %s", archive.path)
            elif proc is not None and proc.returncode == 0:  # the JVM ended well but wrote none: not tried again
                archive.path.with_name(f".{archive.path.stem}.failed").touch(mode=0o600)
        except Exception:  # noqa: BLE001 - best effort: without an archive the next session just starts slower
            log.debug("no class archive written", exc_info=True)
        finally:
            for leftover in (archive.dump_to, lock):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass

    atexit.register(finish)
