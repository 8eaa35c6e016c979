"""Reading YAML while keeping where every key and value came from.

PyYAML's plain loaders forget positions and silently keep the last of two duplicate keys; a
project needs both right. We compose the node tree once (with libyaml when present) and build
plain Python values from it, recording the line and column of each key and value by path."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.reader import ReaderError

from compiler.errors import Collector, Location

try:  # libyaml's parser is several times faster; the pure-Python one gives the same nodes
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

Path = tuple  # of str keys and int indices
_STR_TAG = "tag:yaml.org,2002:str"

# Bounds that keep a malformed file from crashing or stalling the compiler: libyaml's composer
# recurses in C (a few thousand nested brackets overflow the stack and kill the process), and
# aliases can make a small file expand to billions of values.
MAX_DEPTH = 100
MAX_VALUES = 200_000
_MAYBE_DEEP = re.compile(r"^[ \t]{60}|(?:[-?][ \t]+){20}", re.M)


@dataclass
class Doc:
    """A parsed YAML file: its value plus the position of every key and value in it."""

    file: str
    value: Any
    key_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    value_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    # whether any value may be a template: lets rendering skip files without one
    has_templates: bool = False

    def value_at(self, path: Path):
        """The value written at `path`, or None when any part of it is absent."""
        body = self.value
        for part in path:
            body = body.get(part) if isinstance(body, dict) else None
        return body

    def at(self, path: Path, *, key: bool = False) -> Location:
        """Where `path` is written: the key itself when `key`, else its value. Falls back to
        the nearest enclosing position when the exact one is unknown (e.g. a missing key)."""
        table = self.key_pos if key else self.value_pos
        probe = tuple(path)
        while True:
            pos = table.get(probe) or self.value_pos.get(probe) or self.key_pos.get(probe)
            if pos is not None:
                return Location(self.file, pos[0], pos[1])
            if not probe:
                return Location(self.file, 1, 1)
            probe = probe[:-1]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _TooLarge(Exception):
    pass


class _Builder:
    def __init__(self, doc: Doc, errors: Collector):
        self.doc = doc
        self.errors = errors
        self.constructor = SafeConstructor()
        self.active: set[int] = set()  # nodes being built: an alias to one of them is a loop
        self.count = 0

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            self._error(node, f"the file expands to more than {MAX_VALUES:,} values",
                        "aliases (*name) that repeat large parts of the file? write the values out")
            raise _TooLarge()
        if id(node) in self.active:
            self._error(node, "a YAML alias (*name) here refers to a value that contains it", "an alias can only repeat a value defined before it")
            return None
        self.active.add(id(node))
        try:
            return self._build(node, path)
        finally:
            self.active.discard(id(node))

    def _build(self, node: yaml.Node, path: Path) -> Any:
        self.doc.value_pos[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            try:
                self.constructor.flatten_mapping(node)  # resolves `<<: *anchor` merges
            except ConstructorError as exc:
                self._error(node, f"invalid merge key: {exc.problem}")
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.scalar(key_node)
                if isinstance(key, (dict, list)):
                    self._error(key_node, "a mapping key must be a plain name")
                    continue
                if key in out:
                    first = self.doc.key_pos[path + (key,)]
                    self._error(
                        key_node,
                        f"duplicate key '{key}' (first written at line {first[0]})",
                        "YAML keeps only the last one; remove or rename one of them",
                    )
                    continue
                self.doc.key_pos[path + (key,)] = _mark(key_node)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.scalar(node)

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return {}  # a mapping or list used as a key: the caller reports it
        if node.tag == _STR_TAG:
            return node.value
        try:
            value = self.constructor.construct_object(node, deep=True)
        except ConstructorError as exc:
            self._error(node, f"cannot read value: {exc.problem}")
            return None
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. `!!int 1.5`: a tag its text does not fit
            self._error(node, f"cannot read value '{node.value}' as {node.tag.rsplit(':', 1)[-1]}: {exc}")
            return None
        # Dates would not survive JSON; the plan keeps them as the ISO text the user wrote.
        if isinstance(value, (_dt.date, _dt.datetime)):
            return node.value
        return value

    def _error(self, node: yaml.Node, message: str, hint: str | None = None) -> None:
        line, col = _mark(node)
        self.errors.error(Location(self.doc.file, line, col), message, hint)


def _too_deep(text: str, file: str, errors: Collector) -> bool:
    """Whether the file nests deeper than MAX_DEPTH (reported), from the parser's event stream,
    which keeps its own stack. Only files that might be deep are scanned."""
    if text.count("[") + text.count("{") <= 2 * MAX_DEPTH // 4 and not _MAYBE_DEEP.search(text):
        return False
    try:
        return _deeper_than_max(text, file, errors, _Loader)
    except yaml.YAMLError as exc:
        # libyaml 0.2.6 (PyYAML 6.0.4) refuses 1,000 flow levels while reading ahead, before it
        # yields the events that would reach ours; PyYAML's own parser yields them one by one.
        if _Loader is not yaml.SafeLoader and "nesting depth" in str(getattr(exc, "problem", "")):
            try:
                return _deeper_than_max(text, file, errors, yaml.SafeLoader)
            except yaml.YAMLError:
                pass
        return False  # composing reports it with its position


def _deeper_than_max(text: str, file: str, errors: Collector, loader: type) -> bool:
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                errors.error(Location(file, mark.line + 1, mark.column + 1), f"YAML nested more than {MAX_DEPTH} levels deep",
                             "project files need a few levels; check the brackets and indentation here")
                return True
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return False


def load_yaml(text: str, file: str, errors: Collector) -> Doc | None:
    """Parse one YAML file. Syntax errors are reported with their position and give None."""
    if _too_deep(text, file, errors):
        return None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file)
        problem = exc.problem or exc.context or "invalid YAML"
        errors.error(loc, f"YAML syntax error: {problem}", "check indentation, colons and quotes")
        return None
    except ReaderError as exc:  # a character YAML does not allow
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character) if isinstance(exc.character, int) else "?"
        errors.error(Location(file, line, col), f"YAML error: character U+{ord(char):04X} is not allowed here ({exc.reason})",
                     "remove the character (control characters cannot appear in YAML, even quoted)")
        return None
    except yaml.YAMLError as exc:
        errors.error(Location(file, 1), f"YAML error: {exc}")
        return None
    doc = Doc(file=file, value=None, has_templates="{{" in text or "{%" in text)
    if node is not None:
        try:
            doc.value = _Builder(doc, errors).build(node, ())
        except _TooLarge:
            return None
    return doc
