"""Write markers: `.hoodie/.temp/<instant>/<partition>/<file name>.marker.<IO type>`, one per data
file a write creates, written before the file (Hudi's DirectWriteMarkers). Java's marker-based
rollback of a failed instant deletes exactly the files its markers name (CREATE, MERGE) or
writes a rollback command block for them (APPEND: log files), and finds nothing to undo when the
instant has no marker folder. The folder goes once the instant completes, as Java's post-commit
step deletes it.

Java's Spark writers default to timeline-server-based markers instead: `MARKERS.type`
(`TIMELINE_SERVER_BASED`) and `MARKERS<n>` files, each listing marker names one a line, in the
same folder. pipe reads both kinds when it rolls back an instant a Java writer left."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.table.timeline import HOODIE

TEMP = f"{HOODIE}/.temp"
CREATE, MERGE, APPEND = "CREATE", "MERGE", "APPEND"
_SUFFIX = ".marker."
_TYPE_FILE = "MARKERS.type"


def marker_dir(instant: str) -> str:
    return f"{TEMP}/{instant}"


def create(storage, instant: str, rel_path: str, io_type: str) -> None:
    """The marker of data file `rel_path` (relative to the table), before the file is written.
    An empty file, created in place: Java's rollback takes every file of the folder for a
    marker, so no temporary name may ever appear there."""
    path = f"{marker_dir(instant)}/{rel_path}{_SUFFIX}{io_type}"
    if hasattr(storage, "root"):
        import os

        full = storage.full_path(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, "ab").close()
    else:  # an object store's put is atomic
        storage.write_atomic(path, b"")


def delete_dir(storage, instant: str) -> None:
    """Removes the instant's marker folder (its instant completed or was rolled back)."""
    folder = marker_dir(instant)
    if hasattr(storage, "root"):  # a local folder: its (empty) sub-folders go too
        import shutil

        shutil.rmtree(storage.full_path(folder), ignore_errors=True)
        return
    for info in storage.list_files(folder):
        storage.delete(info.path)


@dataclass(frozen=True)
class Marker:
    path: str  # the data file, relative to the table
    io_type: str  # CREATE, MERGE or APPEND


def read(storage, instant: str) -> list[Marker]:
    """The markers an instant's writer left: direct marker files, or the lists of a timeline
    server (MARKERS.type + MARKERS<n>). None: an empty list, as Java's rollback finds."""
    folder = marker_dir(instant)
    infos = storage.list_files(folder)
    names = {i.path[len(folder) + 1:]: i for i in infos}
    found: list[tuple[str, str]] = []  # (marker, where it was read: file[:line])
    if _TYPE_FILE in names or any(n.startswith("MARKERS") and _SUFFIX not in n for n in names):
        for name in sorted(names):
            if name.startswith("MARKERS") and name != _TYPE_FILE:
                lines = storage.read_bytes(f"{folder}/{name}").decode("utf-8", "replace").splitlines()
                found += [(line.strip(), f"{folder}/{name}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    found += [(n, f"{folder}/{n}") for n in names if _SUFFIX in n]
    out = []
    for name, where in found:
        path, _, io_type = name.rpartition(_SUFFIX)
        if path and io_type in (CREATE, MERGE, APPEND):
            _check(storage, instant, path, where)
            out.append(Marker(path, io_type))
    return sorted(set(out), key=lambda m: (m.path, m.io_type))


def _check(storage, instant: str, path: str, where: str) -> None:
    """A marker read from the table's .hoodie folder names a data file of `instant` inside the
    table, or the rollback that would delete it is refused, with nothing deleted: a marker list
    is plain text anyone who can write the folder can edit (`../../x.marker.CREATE`)."""
    from runtime.storage import path_problem
    from runtime.table.errors import TableError
    from runtime.table.layout import _BASE_FILE
    from runtime.table.logfile import parse_name

    name = path.rpartition("/")[2]
    problem = path_problem(path)
    base = _BASE_FILE.match(name)
    if problem is None and base is None and parse_name(name) is None:
        problem = "it is neither a base file nor a log file of the table"
    if problem is None and base is not None and base.group("instant") != instant:
        problem = f"it is a base file of instant {base.group('instant')}, not of {instant}"
    if problem:
        raise TableError(f"the write marker {path!r} in {where} of the table at {storage.spec.uri} is refused: {problem}; "
                         f"pipe refuses to roll back instant {instant} by it and deleted nothing",
                         f"the folder {marker_dir(instant)} was not written by a Hudi writer as it is; inspect it, remove the bad "
                         "entry (or the folder, once you know which files the failed instant wrote) and run again")
