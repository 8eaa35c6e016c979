"""This machine: where pipe keeps its local state, and whether a process lives. Standard library
only and cheap to import: `pipe` itself (pipe/launch.py) uses it before it imports anything else.

pipe's cache folder holds what another local user must neither read nor plant: its servers'
tokens and session ids, the fork server's socket (which takes a command with the caller's
environment and terminal) and the code it ships to Spark. It is this user's and no one else's
(0700); a folder that another user owns, or that others may write into and that holds anything
of another user's, is refused, never used."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeFolder(PermissionError):
    """A folder pipe would keep private state in that is not private; `hint` says what to do."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        return self.args[0]


# what pipe keeps at the top of its cache folder (runtime/spark/cluster.py, api.py, server.py,
# class_archive.py, compiler/cache_key.py), and the cache directory tag it leaves there
CACHE_ENTRIES = frozenset({"pyfiles", "envs", "spark-schemas", "servers", "jvm", "compile.key", "CACHEDIR.TAG"})
_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
        "# This file is a cache directory tag created by pipe: what is here is rebuilt when removed.\n"
        "# For information about cache directory tags see https://bford.info/cachedir/\n")
_tagged: set[Path] = set()  # cache folders this process found tagged or tagged


def cache_dir() -> Path:
    """Where pipe keeps what it builds for clusters and what it knows of its local servers:
    $PIPE_CACHE_DIR, else $XDG_CACHE_HOME/pipe, else ~/.cache/pipe; created readable by this user
    only, or checked (private_dir). A folder named in PIPE_CACHE_DIR that others may read is made
    private only when it holds nothing but pipe's own entries (never a home or a shared folder
    given by mistake). Raises UnsafeFolder."""
    if os.environ.get("PIPE_CACHE_DIR"):
        folder = private_dir(Path(os.environ["PIPE_CACHE_DIR"]), adopt=CACHE_ENTRIES)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = private_dir(Path(base) / "pipe")
    if folder not in _tagged:  # backup and sync tools skip a tagged folder
        _tagged.add(folder)
        try:
            fd = private_file(folder / "CACHEDIR.TAG", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except OSError:
            return folder  # there already, or the folder is read-only: the tag is a courtesy
        with os.fdopen(fd, "w") as out:
            out.write(_TAG)
    return folder


def private_dir(path: Path, adopt: frozenset[str] | None = None) -> Path:
    """`path`, a folder of this user's that no one else may read or write (0700): created so, or
    made so when it is this user's and nothing in it is another user's. Raises UnsafeFolder when
    another user owns it, or when others could write into it and did. With `adopt`, a folder
    that existed and others could read is made private only when every entry at its top is
    named in `adopt`; otherwise it is refused and left as it was."""
    existed = os.path.isdir(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    hint = "set PIPE_CACHE_DIR to a folder of your own (pipe creates it, readable by you only)"
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"pipe's cache folder {path} is not a folder", hint)
    if st.st_uid != os.getuid():
        raise UnsafeFolder(f"pipe's cache folder {path} belongs to another user (uid {st.st_uid}): pipe keeps its servers' "
                           "tokens and sockets there and trusts only a folder of its own", hint)
    if st.st_mode & 0o077:
        foreign = sorted(set(os.listdir(path)) - adopt) if existed and adopt is not None else []
        if foreign:
            raise UnsafeFolder(f"pipe's cache folder {path} can be read by other users (mode {stat.S_IMODE(st.st_mode):o}) and holds "
                               f"{path / foreign[0]}, which is not pipe's: pipe makes private only a folder of its own, and left "
                               "this one as it was", f"name a new folder in PIPE_CACHE_DIR (pipe creates it, readable by you only), "
                               f"or make this one private yourself (chmod 700 {path})")
        if st.st_mode & 0o022:  # others could write into it: nothing of theirs may be in it
            stranger = _owned_by_another(path)
            if stranger is not None:
                raise UnsafeFolder(f"pipe's cache folder {path} could be written by other users (mode {stat.S_IMODE(st.st_mode):o}), "
                                   f"and {stranger[0]} in it belongs to another user (uid {stranger[1]})",
                                   f"remove {path} (pipe builds again what it holds), or {hint}")
        os.chmod(path, 0o700)
    return path


def _owned_by_another(folder: Path) -> tuple[str, int] | None:
    """The first entry under `folder` (itself excluded, links not followed) of another user."""
    me = os.getuid()
    for parent, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            entry = os.path.join(parent, name)
            try:
                owner = os.lstat(entry).st_uid
            except OSError:
                continue
            if owner != me:
                return entry, owner
    return None


def private_file(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor of `path`, opened with `flags`, readable and writable by this user only
    (0600, also when it existed), never through a symbolic link."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def alive(pid: int) -> bool:
    """Whether the process `pid` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
