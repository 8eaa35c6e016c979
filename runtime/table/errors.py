"""Errors of the table engine."""

from __future__ import annotations


class TableError(Exception):
    """A table operation that cannot go ahead; what the user can do is in the message, or in
    `hint`."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class LockTimeout(TableError):
    pass


class WriteError(Exception):
    """A write that cannot go ahead; nothing was committed."""
