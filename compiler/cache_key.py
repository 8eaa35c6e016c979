"""The key that vouches for what compiles keep in a project's target/.

target/ sits in the project, and a pull request can commit one: a crafted partial-parse record
would hand the compiler a parsed YAML document that was never checked, or a plan.json the
project does not give. So whatever a compile keeps there is signed (HMAC-SHA256) or looked up
under a keyed digest, with a key only this user can read: 32 random bytes in `compile.key` of
pipe's cache folder ($PIPE_CACHE_DIR, else $XDG_CACHE_HOME/pipe, else ~/.cache/pipe; the folder
runtime/host.py names), made 0600 on first use, and only in a folder no one else can read
(0700). A record written by anyone else, or with another key, is not used: the compile reads
and checks everything again.

Standard library only: the compiler does not import the runtime."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import stat
from pathlib import Path

KEY_FILE = "compile.key"
KEY_BYTES = 32
_OPEN = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def cache_folder() -> Path:
    """pipe's per-user cache folder (as runtime.host.cache_dir)."""
    if os.environ.get("PIPE_CACHE_DIR"):
        return Path(os.environ["PIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipe"


@functools.lru_cache(maxsize=4)
def _key_in(folder: str) -> bytes | None:
    path = os.path.join(folder, KEY_FILE)
    key = _read(path)
    if key is not None:
        return key
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            # a folder others may read (a home or shared folder named by mistake, which
            # runtime/host.py refuses) gets no key of ours: compiles then keep nothing
            return None
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, os.urandom(KEY_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # whole or not at all; the first of two compiles at once wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    except OSError:
        return None
    return _read(path)


def _read(path: str) -> bytes | None:
    """The key at `path` when it is a regular file of this user that no one else can read."""
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        data = os.read(fd, KEY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def key() -> bytes | None:
    """This user's key, made on first use; None when it cannot be made or is not private (then
    nothing kept in target/ is used or trusted)."""
    return _key_in(str(cache_folder()))


def sign(data: bytes) -> bytes | None:
    """The HMAC-SHA256 of `data` under this user's key (None without a key)."""
    k = key()
    return None if k is None else hmac.new(k, data, hashlib.sha256).digest()


def verified(signature: bytes, data: bytes) -> bool:
    """Whether `signature` is this user's HMAC of `data`."""
    expected = sign(data)
    return expected is not None and hmac.compare_digest(expected, signature)


def keyed(label: str) -> str | None:
    """A value derived from the key for `label` (mixed into a cache's lookup keys or a
    fingerprint, so that entries written without the key never match); None without a key."""
    mac = sign(label.encode("utf-8"))
    return None if mac is None else mac.hex()
