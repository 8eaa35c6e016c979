"""Errors a user can act on: every problem carries the file, line and column it comes from
and a hint saying what to do. One type for the whole compiler, `ProjectError`, which holds
every diagnostic of a project so that they are all reported in one go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True, order=True)
class Location:
    """A place in the project: a path relative to the project root, 1-based line and column."""

    file: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)


@dataclass(frozen=True)
class Diagnostic:
    location: Location
    message: str
    hint: str | None = None
    severity: str = "error"  # error | warning

    def __str__(self) -> str:
        text = f"{self.location}: {self.severity}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def sort_key(self) -> tuple:
        loc = self.location
        return (loc.file, loc.line or 0, loc.col or 0, self.message)


class PipeError(Exception):
    """Base of every error pipe reports to a user without a traceback."""


class ProjectError(PipeError):
    """One or more mistakes in the user's project."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        unique = {(d.location, d.message, d.severity): d for d in diagnostics}
        self.diagnostics: list[Diagnostic] = sorted(unique.values(), key=Diagnostic.sort_key)
        super().__init__("\n".join(str(d) for d in self.diagnostics))


@dataclass
class Collector:
    """Gathers diagnostics across all stages so a project's errors are reported together."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, location: Location, message: str, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(location, message, hint))

    def warning(self, location: Location, message: str, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(location, message, hint, severity="warning"))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def raise_if_errors(self) -> None:
        """Raises with every diagnostic, warnings included, when there is any error."""
        if self.errors:
            raise ProjectError(self.diagnostics)


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A "did you mean 'x'?" hint for a misspelt name, or None when nothing is close."""
    import difflib  # only when something is misspelt: every command imports this module

    matches = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None
