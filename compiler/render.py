"""Jinja for SQL files and for settings written as templates.

SQL is rendered in a sandbox with StrictUndefined, so a misspelt name is an error rather than
an empty string. The functions a template can call:

    ref('t')            the snapshot of pipe table t; records a dependency
    source('s')         the new input of source s; records a dependency
    var('x', default)   a project variable (pipe_project.yml, target, --vars)
    env_var('X', dflt)  an environment variable, kept as a placeholder the runtime resolves,
                        so secrets never reach plan.json or logs
    is_incremental()    true when the table exists and the run is not a full refresh; a
                        template that asks is rendered both ways and the plan keeps both
    this                the table being written (its current snapshot); this.name and
                        this.identifier are its plain name
    target              the chosen target: target.name, target.lake
    project_name        the project's name
and every macro in macros/*.sql. Mistakes are reported at the SQL file and line."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import jinja2
from jinja2 import StrictUndefined, nodes
from jinja2.sandbox import SandboxedEnvironment

from compiler import python_models
from compiler.errors import Collector, Location, did_you_mean
from compiler.project import Project, Table
from compiler.simple_template import SimpleTemplate

_MISSING = object()


def relation(name: str) -> str:
    """How ref() and source() appear in rendered SQL: the name of the view the runtime
    registers for that table or source."""
    return f"`{name}`"


def env_placeholder(name: str, default: str | None) -> str:
    """`${env:NAME}` or `${env:NAME:-default}` (`\\` and `}` in the default escaped)."""
    if default is None:
        return "${env:" + name + "}"
    escaped = default.replace("\\", "\\\\").replace("}", "\\}")
    return "${env:" + name + ":-" + escaped + "}"


ENV_PLACEHOLDER_RE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-((?:\\.|[^\\}])*))?\}")


class EnvVarValue(str):
    """What env_var() returns: placeholder text that may be written into SQL but not used in
    template logic, whose result would then depend on a value the compiler never sees."""

    def _refuse(self, *_: Any) -> Any:
        raise jinja2.TemplateRuntimeError(
            "env_var() values can be written into SQL as they are, but not compared, tested or "
            "changed by filters in a template; use var() for values that steer the template"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __bool__ = _refuse
    # a filter or method would turn the placeholder into text the runtime no longer finds
    upper = lower = title = capitalize = swapcase = casefold = replace = strip = lstrip = rstrip = _refuse
    split = rsplit = partition = rpartition = startswith = endswith = find = index = count = _refuse
    center = ljust = rjust = zfill = format = __getitem__ = __mod__ = __mul__ = __iter__ = _refuse
    __hash__ = str.__hash__


@dataclass
class _Scope:
    """Per-render state the global functions record into."""

    owner: Table | None
    file: str
    incremental: bool
    allow_refs: bool = True
    default_location: Location | None = None
    refs: dict[str, Location] = field(default_factory=dict)
    sources: dict[str, Location] = field(default_factory=dict)
    env_vars: dict[str, str | None] = field(default_factory=dict)
    asked_incremental: bool = False
    test_config: dict[str, Any] | None = None  # a tests/*.sql file: what its config() set


@dataclass(frozen=True)
class RenderedTable:
    sql: str | None
    sql_full_refresh: str | None  # set only when the template asks is_incremental()
    refs: Mapping[str, Location]
    sources: Mapping[str, Location]
    env_vars: Mapping[str, str | None]
    config: Mapping[str, Any]
    # rendering reported an error, so the SQL may be cut short: it is not checked further
    failed: bool = False
    python: Mapping[str, Any] | None = None  # a Python model: its code and signature (compiler/python_models.py)


@dataclass(frozen=True)
class RenderedTest:
    sql: str
    refs: Mapping[str, Location]
    sources: Mapping[str, Location]
    env_vars: Mapping[str, str | None]
    config: Mapping[str, Any]


@dataclass(frozen=True)
class RenderedSource:
    config: Mapping[str, Any]
    env_vars: Mapping[str, str | None]


@dataclass(frozen=True)
class GenericTestDef:
    """A generic test of the project's own, written as dbt writes one in tests/generic/*.sql:
    `{% test name(model, column_name, n=3) %} select ... {% endtest %}`."""

    name: str
    location: Location
    arguments: tuple[str, ...]  # in order, `model` first
    required: tuple[str, ...]  # the arguments without a default


# dbt's test tags, rewritten as macro tags in place (line numbers stay): a test is a macro
_TEST_TAG = re.compile(r"(\{%[-+]?\s*)test(\s+)([A-Za-z_][A-Za-z0-9_]*)(\s*\()")
_ENDTEST_TAG = re.compile(r"(\{%[-+]?\s*)endtest(\s*[-+]?%\})")


class _This:
    """`this`, as dbt's: written as it is, the relation of the table being written (its current
    snapshot, `` `orders` ``); `this.name` and `this.identifier` are the table's plain name."""

    def __init__(self, renderer: "Renderer"):
        self._r = renderer

    def _owner(self) -> str | None:
        scope = self._r.scope
        if scope is None or scope.owner is None:
            self._r.record("`this` is only defined in a table's SQL")
            return None
        return scope.owner.name

    def __str__(self) -> str:
        name = self._owner()
        return "" if name is None else relation(name)

    __html__ = __str__

    def __repr__(self) -> str:
        return str(self)

    @property
    def name(self) -> str:
        return self._owner() or ""

    identifier = name


class _MacroProxy:
    """Stands in env.globals for a macro so macros in different files can call each other
    whatever order the files are loaded in."""

    def __init__(self, renderer: "Renderer", name: str):
        self._r, self._name = renderer, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._r.macros[self._name](*args, **kwargs)


# Bounds on what one rendering may compute, so that a slip in a template (`10**10**10`,
# `'-' * 10**10`, loops in loops) stops with a message instead of stalling or exhausting memory.
MAX_POWER_BITS = 100_000
MAX_REPEAT = 1_000_000
MAX_LOOP_ITEMS = 1_000_000


class _Environment(SandboxedEnvironment):
    intercepted_binops = frozenset(["**", "*"])

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1 and right > 0 \
                and right * max(abs(left), 2).bit_length() > MAX_POWER_BITS:
            raise jinja2.TemplateRuntimeError(f"{left} ** {right} is too large a number for a template")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _is_int(n) and len(seq) * n > MAX_REPEAT:
                    raise jinja2.TemplateRuntimeError(f"repeating a value {n} times makes more than {MAX_REPEAT:,} items")
        return super().call_binop(context, operator, left, right)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Renderer:
    # Templates in the simple subset skip Jinja's compiler (see simple_template.py); tests
    # turn this off to check that both paths give the same plan.
    fast_path = True

    def __init__(self, project: Project, errors: Collector, parse_cache=None):
        self.project = project
        self.errors = errors
        self.parse_cache = parse_cache  # compiler.partial.ParseCache: SQL files parsed by earlier compiles
        self.scope: _Scope | None = None
        self.templates: dict[str, str] = {t.sql_file: t.sql_text for t in project.tables.values() if t.sql_file}
        self.templates.update({m.file: m.text for m in project.macros})
        self.env = _Environment(
            undefined=StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            loader=jinja2.FunctionLoader(self._load_template),
            cache_size=-1,
        )
        self.env.globals.update(
            ref=self._ref,
            source=self._source,
            var=self._var,
            env_var=self._env_var,
            is_incremental=self._is_incremental,
            this=_This(self),
            target={"name": project.target.name, "lake": project.target.lake},
            project_name=project.name,
            range=self._range,
            config=self._config,
        )
        self.env.globals.pop("lipsum", None)  # Jinja's filler text: unbounded, and no use in SQL
        self._loop_items = 0
        self.macros: dict[str, Any] = {}
        self.generic_tests: dict[str, tuple[GenericTestDef, Any]] = {}  # load_generic_tests
        self._load_macros()

    def _load_template(self, name: str) -> tuple[str, str, Any] | None:
        text = self.templates.get(name)
        # the file name makes Jinja's rewritten tracebacks point at the project file
        return None if text is None else (text, name, lambda: True)

    # --- errors -----------------------------------------------------------------------------

    def _call_site(self) -> Location:
        """file:line of the template line calling us, found from the compiled template frame."""
        frame = sys._getframe(1)
        while frame is not None:
            tmpl = frame.f_globals.get("__jinja_template__")
            if tmpl is not None and tmpl.name is not None:
                return Location(tmpl.name, tmpl.get_corresponding_lineno(frame.f_lineno))
            if tmpl is not None:  # a setting rendered from a string: point at the YAML value
                break
            frame = frame.f_back
        scope = self.scope
        return (scope.default_location if scope and scope.default_location else Location(scope.file if scope else "<template>"))

    def record(self, message: str, hint: str | None = None, location: Location | None = None) -> None:
        self.errors.error(location or self._call_site(), message, hint)

    def _module(self, file: str):
        """The template `file` run as a module (its macros defined), or None with the failure
        reported at its line: macros/*.sql and tests/generic/*.sql load so."""
        self._loop_items = 0
        self.scope = _Scope(owner=None, file=file, incremental=False, allow_refs=False)
        try:
            return self.env.get_template(file).module
        except Exception as exc:  # noqa: BLE001 - any template failure is the user's to fix
            self._template_error(exc, Location(file))
            return None
        finally:
            self.scope = None

    def _template_error(self, exc: Exception, fallback: Location) -> None:
        if isinstance(exc, jinja2.TemplateSyntaxError):
            loc = Location(exc.name or exc.filename or fallback.file, exc.lineno) if (exc.name or exc.filename) else Location(fallback.file, (fallback.line or 1) + exc.lineno - 1)
            self.errors.error(loc, f"template syntax error: {exc.message}", "check the {{ }} and {% %} tags near this line")
            return
        loc = fallback
        tb = exc.__traceback__
        while tb is not None:  # the innermost template line wins
            tmpl = tb.tb_frame.f_globals.get("__jinja_template__")
            if tmpl is not None and tmpl.name in self.templates:  # compiled template code
                loc = Location(tmpl.name, tmpl.get_corresponding_lineno(tb.tb_lineno))
            elif tb.tb_frame.f_code.co_filename in self.templates:  # Jinja's rewritten frames
                loc = Location(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb = tb.tb_next
        message = exc.message if isinstance(exc, jinja2.TemplateError) and exc.message else str(exc)
        if isinstance(exc, jinja2.TemplateNotFound):
            self.errors.error(loc, f"template '{exc.name}' not found", "include and import take paths relative to the project folder, e.g. macros/common.sql")
        elif isinstance(exc, jinja2.UndefinedError) and f"'{__name__}._This object'" in message:
            self.errors.error(loc, "undefined name in template: " + message.replace(f"'{__name__}._This object'", "`this`"),
                              "`this` has .name and .identifier (the table's name); `{{ this }}` is its relation, e.g. `orders`")
        elif isinstance(exc, jinja2.UndefinedError):
            name = re.search(r"'([^']+)' is undefined", message)
            known = list(self.env.globals) + list(self.macros)
            hint = (did_you_mean(name.group(1), known) if name else None) or "functions available: ref, source, var, env_var, is_incremental, this, target and the macros in macros/"
            self.errors.error(loc, f"undefined name in template: {message}", hint)
        elif isinstance(exc, jinja2.TemplateError):
            self.errors.error(loc, f"template error: {message}")
        else:
            self.errors.error(loc, f"template error: {type(exc).__name__}: {message}")

    # --- functions templates call -------------------------------------------------------------

    def _ref(self, *args: Any) -> str:
        scope = self.scope
        if len(args) != 1 or not isinstance(args[0], str):
            self.record("ref() takes one table name, e.g. ref('orders')")
            return "``"
        name = args[0]
        if scope is None or not scope.allow_refs:
            self.record(f"ref('{name}') can only be used in a table's SQL")
            return relation(name)
        if scope.owner is not None and name == scope.owner.name:
            self.record(f"table '{name}' refers to itself with ref('{name}')", "use {{ this }} for the table's current rows")
            return relation(name)
        if name not in self.project.tables:
            from compiler.seeds import unreadable_seed

            broken = unreadable_seed(self.project.files, name)
            if broken is not None:
                self.record(f"ref('{name}'): seed {broken} could not be read (its errors are reported at it)", f"fix {broken}")
                return relation(name)
            hint = (f"'{name}' is a source: use source('{name}')" if name in self.project.sources else did_you_mean(name, self.project.tables)) or "declare it in tables/*.yml or add tables/<name>.sql"
            self.record(f"ref('{name}'): no table named '{name}'", hint)
        else:
            scope.refs.setdefault(name, self._call_site())
        return relation(name)

    def _source(self, *args: Any) -> str:
        scope = self.scope
        if len(args) != 1 or not isinstance(args[0], str):
            self.record("source() takes one source name, e.g. source('raw_orders')", "pipe sources have one-part names")
            return "``"
        name = args[0]
        if scope is None or not scope.allow_refs:
            self.record(f"source('{name}') can only be used in a table's SQL")
            return relation(name)
        if name not in self.project.sources:
            hint = (f"'{name}' is a table: use ref('{name}')" if name in self.project.tables else did_you_mean(name, self.project.sources)) or "declare it in sources/*.yml"
            self.record(f"source('{name}'): no source named '{name}'", hint)
        else:
            scope.sources.setdefault(name, self._call_site())
        return relation(name)

    def _var(self, name: Any = None, default: Any = _MISSING) -> Any:
        if not isinstance(name, str):
            self.record("var() takes a variable name, e.g. var('min_amount', 0)")
            return ""
        if name in self.project.vars:
            return self.project.vars[name]
        if default is not _MISSING:
            return default
        hint = did_you_mean(name, self.project.vars)
        self.record(
            f"var('{name}') is not defined",
            (hint + " " if hint else "") + f"add it under vars: in pipe_project.yml, give a default: var('{name}', ...), or pass --vars '{{{name}: ...}}'",
        )
        return ""

    def _env_var(self, name: Any = None, default: Any = None) -> str:
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            self.record("env_var() takes an environment variable name, e.g. env_var('AWS_REGION', 'us-east-1')")
            return ""
        default_text = None if default is None else str(default)
        if self.scope is not None:
            self.scope.env_vars[name] = default_text
        return EnvVarValue(env_placeholder(name, default_text))

    def _range(self, *args: Any) -> range:
        """Jinja's sandboxed range, with a budget on the items of all ranges of a rendering."""
        from jinja2.sandbox import safe_range

        r = safe_range(*args)
        self._loop_items += len(r)
        if self._loop_items > MAX_LOOP_ITEMS:
            raise jinja2.TemplateRuntimeError(f"the template's loops go over more than {MAX_LOOP_ITEMS:,} items")
        return r

    def _config(self, *args: Any, **kwargs: Any) -> str:
        scope = self.scope
        if scope is None or scope.test_config is None:
            self.record("config() is only for tests in tests/*.sql", "a table's settings live in its tables/*.yml")
        elif args:
            self.record("config() takes named settings, e.g. config(severity='warn', error_if='>10')")
        else:
            scope.test_config.update(kwargs)
        return ""

    def _is_incremental(self) -> bool:
        scope = self.scope
        if scope is None or scope.owner is None:
            self.record("is_incremental() can only be used in a table's SQL")
            return False
        scope.asked_incremental = True
        return scope.incremental

    # --- macros ---------------------------------------------------------------------------------

    def _load_macros(self) -> None:
        defined: dict[str, Location] = {}
        parsed: list[str] = []
        for macro_file in self.project.macros:
            try:
                ast = self.env.parse(macro_file.text, name=macro_file.file, filename=macro_file.file)
            except jinja2.TemplateSyntaxError as exc:
                self._template_error(exc, Location(macro_file.file))
                continue
            for node in ast.find_all(nodes.Macro):
                loc = Location(macro_file.file, node.lineno)
                if node.name in defined:
                    self.errors.error(loc, f"macro '{node.name}' is defined twice (first at {defined[node.name]})", "rename one of them")
                    continue
                if node.name in self.env.globals:
                    self.errors.error(loc, f"macro '{node.name}' hides pipe's built-in {node.name}()", "rename the macro")
                    continue
                defined[node.name] = loc
            parsed.append(macro_file.file)
        for name in defined:
            self.env.globals[name] = _MacroProxy(self, name)
        for file in parsed:
            module = self._module(file)
            if module is None:
                continue
            for name in defined:
                if hasattr(module, name) and defined[name].file == file:
                    self.macros[name] = getattr(module, name)

    # --- rendering ----------------------------------------------------------------------------

    def render_table(self, table: Table) -> RenderedTable:
        reported = len(self.errors.errors)
        sql = full = None
        refs: dict[str, Location] = {}
        sources: dict[str, Location] = {}
        env_vars: dict[str, str | None] = {}
        if table.sql_file is not None:
            template = self._template(table)
            if template is not None:
                first = self._render(template, table, incremental=True)
                if first is not None:
                    sql, scope = first
                    refs.update(scope.refs), sources.update(scope.sources), env_vars.update(scope.env_vars)
                    if scope.asked_incremental:
                        errors_before = len(self.errors.diagnostics)
                        second = self._render(template, table, incremental=False)
                        # keep only what the first rendering did not already report
                        seen = {(d.location, d.message) for d in self.errors.diagnostics[:errors_before]}
                        fresh = [d for d in self.errors.diagnostics[errors_before:] if (d.location, d.message) not in seen]
                        self.errors.diagnostics[errors_before:] = fresh
                        if second is not None:
                            full, scope2 = second
                            for k, v in scope2.refs.items():
                                refs.setdefault(k, v)
                            for k, v in scope2.sources.items():
                                sources.setdefault(k, v)
                            env_vars.update(scope2.env_vars)
        python = None
        if table.python_file is not None:
            model = python_models.read(table.python_file, table.python_text, self.errors)
            if model is not None:
                python_models.check_inputs(model, table.name, self.project.tables, self.project.sources, self.errors)
                refs.update((i.name, i.location) for i in model.inputs if i.kind == "table" and i.name in self.project.tables and i.name != table.name)
                sources.update((i.name, i.location) for i in model.inputs if i.kind == "source" and i.name in self.project.sources)
                python = {"code": table.python_text, **python_models.signature(model)}
        config, config_env = self._render_config(table.config, table, table.path)
        env_vars.update(config_env)
        return RenderedTable(sql=sql, sql_full_refresh=full, refs=refs, sources=sources, env_vars=env_vars, config=config,
                             failed=len(self.errors.errors) > reported, python=python)

    def render_test(self, rel: str, text: str) -> RenderedTest | None:
        """A data test in tests/*.sql: a SELECT of its failing rows, with ref(), source() and
        config(); None when it cannot be rendered (reported)."""
        self.templates[rel] = text
        scope = _Scope(owner=None, file=rel, incremental=False, test_config={})
        try:
            template = self.env.get_template(rel)
        except jinja2.TemplateSyntaxError as exc:
            self._template_error(exc, Location(rel))
            return None
        self.scope = scope
        self._loop_items = 0
        try:
            sql = template.render()
        except Exception as exc:  # noqa: BLE001 - reported at the template line
            self._template_error(exc, scope.default_location or Location(rel))
            return None
        finally:
            self.scope = None
        return RenderedTest(sql=sql.strip() + "\n", refs=dict(scope.refs), sources=dict(scope.sources), env_vars=dict(scope.env_vars),
                            config=dict(scope.test_config))

    def render_source(self, source) -> RenderedSource:
        config, env_vars = self._render_config(source.config, None, source.path, node=source)
        return RenderedSource(config=config, env_vars=env_vars)

    # --- generic tests of the project's own (tests/generic/*.sql) ---------------------------------

    def load_generic_tests(self, files: list[tuple[str, str]]) -> list[GenericTestDef]:
        """The `{% test %}` blocks of each file, in order. Each becomes a macro of its file's
        module, kept apart from the macros templates call (in dbt it is `test_<name>`, never
        called by name); other macros of the file are its helpers. A second test of one name,
        a test without `model`, a file with no test and a template error are reported."""
        found: list[GenericTestDef] = []
        for rel, text in files:
            names = [m.group(3) for m in _TEST_TAG.finditer(text)]
            if not names:
                self.errors.error(Location(rel, 1), f"{rel} defines no generic test",
                                  "write it as dbt does: `{% test my_test(model, column_name) %} select ... {% endtest %}`")
                continue
            self.templates[rel] = _ENDTEST_TAG.sub(r"\1endmacro\2", _TEST_TAG.sub(r"\1macro\2\3\4", text))
            try:
                tree = self.env.parse(self.templates[rel], name=rel, filename=rel)
            except jinja2.TemplateSyntaxError as exc:
                self._template_error(exc, Location(rel))
                continue
            here = [self._generic_def(rel, node, found) for node in tree.find_all(nodes.Macro) if node.name in names]
            here = [d for d in here if d is not None]
            if not here:
                continue
            module = self._module(rel)
            if module is None:
                continue
            for d in here:
                self.generic_tests[d.name] = (d, getattr(module, d.name))
                found.append(d)
        return found

    def _generic_def(self, rel: str, node: nodes.Macro, found: list[GenericTestDef]) -> GenericTestDef | None:
        loc = Location(rel, node.lineno)
        first = next((d for d in found if d.name == node.name), None) or self.generic_tests.get(node.name, (None,))[0]
        if first is not None:
            self.errors.error(loc, f"generic test '{node.name}' is defined twice (first at {first.location})", "rename one of them")
            return None
        arguments = tuple(a.name for a in node.args)
        if not arguments or arguments[0] != "model":
            self.errors.error(loc, f"generic test '{node.name}' must take `model` first (the table or source it checks)",
                              f"e.g. `{{% test {node.name}(model, column_name) %}}`")
            return None
        return GenericTestDef(node.name, loc, arguments, arguments[: len(arguments) - len(node.defaults)])

    def render_generic_test(self, name: str, arguments: Mapping[str, Any]) -> RenderedTest | None:
        """A use of a generic test: its macro called with `model` and the arguments given in
        YAML; None when it cannot be rendered (reported at the template's line)."""
        definition, macro = self.generic_tests[name]
        scope = _Scope(owner=None, file=definition.location.file, incremental=False, test_config={})
        self.scope = scope
        self._loop_items = 0
        try:
            sql = str(macro(**arguments))
        except Exception as exc:  # noqa: BLE001 - reported at the template line
            self._template_error(exc, scope.default_location or definition.location)
            return None
        finally:
            self.scope = None
        return RenderedTest(sql=sql.strip() + "\n", refs=dict(scope.refs), sources=dict(scope.sources), env_vars=dict(scope.env_vars),
                            config=dict(scope.test_config))

    def set_target_lake(self, lake: str) -> None:
        """`target.lake` in templates is the lake after its own rendering."""
        self.env.globals["target"] = {**self.env.globals["target"], "lake": lake}

    def render_text(self, text: str, location: Location) -> tuple[str, dict[str, str | None]]:
        """Renders a setting written as a template (`lake: "s3://{{ env_var('BUCKET') }}/x"`)."""
        if "{{" not in text and "{%" not in text:
            return text, {}
        scope = _Scope(owner=None, file=location.file, incremental=False, allow_refs=False, default_location=location)
        self.scope = scope
        self._loop_items = 0
        try:
            return self.env.from_string(text).render(), dict(scope.env_vars)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, jinja2.TemplateSyntaxError):
                exc.name = exc.filename = None
            self._template_error(exc, location)
            return text, {}
        finally:
            self.scope = None

    def _template(self, table: Table) -> jinja2.Template | SimpleTemplate | None:
        if self.fast_path:
            simple = self._simple(table)
            if simple is not None and all(self._simple_name_ok(p) for p in simple.parts if not isinstance(p, str)):
                return simple
        try:
            return self.env.get_template(table.sql_file)
        except jinja2.TemplateSyntaxError as exc:
            self._template_error(exc, Location(table.sql_file))
        return None

    def _simple(self, table: Table) -> SimpleTemplate | None:
        """The table's SQL as a simple template (None: Jinja's), parsed once per content."""
        data = self.project.files.contents.get(table.sql_file)
        cache = self.parse_cache if isinstance(data, bytes) else None
        if cache is not None:
            kept = cache.get(table.sql_file, data)
            if kept is not None:
                with contextlib.suppress(TypeError, ValueError, IndexError):  # not what to_data() gives: parse again
                    return SimpleTemplate.from_data(table.sql_file, kept)
        simple = SimpleTemplate.parse(table.sql_file, table.sql_text)
        if cache is not None:
            cache.put(table.sql_file, data, SimpleTemplate.to_data(simple))
        return simple

    def _simple_name_ok(self, expr) -> bool:
        value = self.env.globals.get(expr.name, _MISSING)
        if value is _MISSING:
            return False  # Jinja reports the undefined name
        if expr.kind == "call":
            return callable(value)
        if expr.kind == "attr":
            return isinstance(value, dict) and expr.attr in value
        return not callable(value)

    def _render(self, template: jinja2.Template | SimpleTemplate, table: Table, incremental: bool) -> tuple[str, _Scope] | None:
        self._loop_items = 0
        scope = _Scope(owner=table, file=table.sql_file, incremental=incremental)
        self.scope = scope

        def at_line(line: int) -> None:
            scope.default_location = Location(table.sql_file, line)

        try:
            if isinstance(template, SimpleTemplate):
                text = template.render(self.env.globals.__getitem__, at_line)
            else:
                text = template.render()
        except Exception as exc:  # noqa: BLE001 - reported at the template line
            self._template_error(exc, scope.default_location or Location(table.sql_file))
            return None
        finally:
            self.scope = None
        return text.strip() + "\n", scope

    def _render_config(self, config: Mapping[str, Any], owner: Table | None, path: tuple, node=None) -> tuple[dict[str, Any], dict[str, str | None]]:
        node = node or owner
        env_vars: dict[str, str | None] = {}
        if not node.doc.has_templates:
            return dict(config), env_vars

        def walk(value: Any, keys: tuple) -> Any:
            if isinstance(value, str):
                text, found = self.render_text(value, node.at(*keys))
                env_vars.update(found)
                return text
            if isinstance(value, dict):
                return {k: walk(v, keys + (k,)) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, keys + (i,)) for i, v in enumerate(value)]
            return value

        return walk(dict(config), ()), env_vars


def resolve_env_placeholders(text: str, environ: Mapping[str, str]) -> str:
    """Replaces `${env:NAME[:-default]}` with the environment's values (used by the runtime).
    Raises KeyError(NAME) for a variable that is unset and has no default."""

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in environ:
            return environ[name]
        if default is None:
            raise KeyError(name)
        return re.sub(r"\\(.)", r"\1", default)

    return ENV_PLACEHOLDER_RE.sub(sub, text)
