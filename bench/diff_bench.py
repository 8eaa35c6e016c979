#!/usr/bin/env python
"""How fast `pipe diff` compares two plans of large projects, against the bare cost of reading them.

    python bench/diff_bench.py                     # 1,000 and 5,000 tables
    python bench/diff_bench.py --sizes 1000        # a quicker run

For each size the script generates a project with bench/compile_bench.py's generator (seeded:
the same bytes every time), compiles it (plan A), changes 5% of its tables (drawn with a fixed
seed, in turn: the SQL, the key, the operation, a `delete_when`), compiles it again (plan B), and
times, interleaved round by round in the same run:

  json.loads          read both plan.json files and `json.loads` them: the floor
  Plan.from_json      read both and parse them into Plans (what `pipe diff A B` does first)
  diff_plans          compiler.diff.diff_plans(A, B) on the parsed plans
  in-process, whole   read + Plan.from_json + diff_plans + the JSON output (render_json)
  pipe diff           `pipe diff A.json B.json --format json` as a subprocess: wall time,
                      interpreter start-up and imports included

and, once per run, `pipe --version` as a subprocess (the start-up every command pays). Medians
and bests are reported; the results go to the `diff` section of bench/RESULTS.md."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import compile_bench as cb  # noqa: E402  (puts the repository on sys.path too)
from compiler.diff import diff_plans  # noqa: E402
from compiler.plan import Plan  # noqa: E402
from pipe.diff_output import render_json  # noqa: E402

DEFAULT_SIZES = (1000, 5000)
CHANGE_SHARE = 0.05
MUTATIONS = ("sql", "key", "operation", "delete_when")
# what each mutation is expected to make of the table's class
EXPECTED_CLASS = {"sql": "non-breaking", "key": "rewrite", "operation": "breaking", "delete_when": "destructive"}
TARGET_S = 1.0  # "well under a second" for 1,000 tables


# --- the two plans -------------------------------------------------------------------------------


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    if old not in text:
        raise SystemExit(f"{path}: {old!r} not found; has compile_bench's generator changed?")
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def mutate(root: Path, n: int, seed: int = cb.SEED) -> dict[str, str]:
    """Changes CHANGE_SHARE of the tables (not t0..t5, which read sources), in turn by
    MUTATIONS; returns {table step id: mutation}."""
    rng = random.Random(f"diff:{seed}:{n}")
    picked = sorted(rng.sample(range(cb.N_SOURCES, n), max(1, round(n * CHANGE_SHARE))))
    out = {}
    for j, i in enumerate(picked):
        kind = MUTATIONS[j % len(MUTATIONS)]
        yml, sql = root / f"tables/t{i}.yml", root / f"tables/t{i}.sql"
        if kind == "sql":
            _replace(sql, "    lower(", "    upper(")
        elif kind == "key":
            _replace(yml, "    key: [id]\n", "    key: [id, region]\n")
        elif kind == "operation":
            _replace(yml, "    operation: upsert\n", "    operation: insert\n")
        else:
            _replace(yml, "    operation: upsert\n", "    operation: upsert\n    delete_when: \"status = 'deleted'\"\n")
        out[f"table.t{i}"] = kind
    return out


def compile_to(root: Path, dest: Path) -> None:
    result = cb.compile_in_process(root)
    if result.warnings:
        raise SystemExit(f"{root} compiled with {len(result.warnings)} warnings: {result.warnings[0].message}")
    shutil.copyfile(root / "target/plan.json", dest)


# --- what is timed ---------------------------------------------------------------------------------


def read_json(a: Path, b: Path) -> None:
    for p in (a, b):
        json.loads(p.read_text(encoding="utf-8"))


def read_plans(a: Path, b: Path) -> tuple[Plan, Plan]:
    return tuple(Plan.from_json(p.read_text(encoding="utf-8"), origin=str(p)) for p in (a, b))  # type: ignore[return-value]


def whole(a: Path, b: Path) -> str:
    base, head = read_plans(a, b)
    return render_json(diff_plans(base, head, str(a), str(b)))


def cli_diff(a: Path, b: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cb.PIPE + ["diff", str(a), str(b), "--format", "json"], capture_output=True, text=True, env=cb.SUB_ENV)
    if proc.returncode != 1:  # 1: the plans differ
        raise SystemExit(f"`pipe diff` exited {proc.returncode}, expected 1:\n{proc.stderr}")
    return proc


@dataclass
class Measure:
    key: str
    label: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


JSON, PARSE, DIFF, WHOLE, CLI = "json", "parse", "diff", "whole", "cli"


@dataclass
class SizeResult:
    n: int
    steps: int
    plan_bytes: tuple[int, int]
    mutated: dict[str, int]
    counts: dict[str, int]
    classes: dict[str, int]
    worst: str | None
    output_bytes: int
    measures: dict[str, Measure]
    gen_s: float
    profile: tuple[float, list[tuple[str, float]]] | None = None

    def m(self, key: str) -> Measure:
        return self.measures[key]


def bench_size(work: Path, n: int, repeats: int) -> SizeResult:
    root = work / f"p{n}"
    t0 = time.perf_counter()
    cb.generate_project(root, n)
    a, b = work / f"A{n}.json", work / f"B{n}.json"
    compile_to(root, a)
    changed = mutate(root, n)
    compile_to(root, b)
    gen_s = time.perf_counter() - t0

    # Sanity: exactly the changed tables are modified, each with the class its change asks for.
    base, head = read_plans(a, b)
    diff = diff_plans(base, head)
    modified = {s.id: s.cls for s in diff.steps if s.status == "modified"}
    expected = {sid: EXPECTED_CLASS[kind] for sid, kind in changed.items()}
    if modified != expected:
        wrong = sorted(set(modified.items()) ^ set(expected.items()))[:5]
        raise SystemExit(f"{n} tables: the diff does not match the changes made, e.g. {wrong}")
    counts, worst = diff.counts(), diff.worst()
    classes: dict[str, int] = {}
    for s in diff.steps:
        if s.cls:
            classes[s.cls] = classes.get(s.cls, 0) + 1
    output_bytes = len(cli_diff(a, b).stdout.encode("utf-8"))
    del base, head, diff

    parsed = read_plans(a, b)
    measures = {
        JSON: Measure(JSON, "baseline: read both plan.json + `json.loads`"),
        PARSE: Measure(PARSE, "baseline: read both + `Plan.from_json`"),
        DIFF: Measure(DIFF, "**`diff_plans(base, head)`**, plans already parsed"),
        WHOLE: Measure(WHOLE, "in-process, whole: read + `Plan.from_json` + `diff_plans` + JSON output"),
        CLI: Measure(CLI, "`pipe diff A.json B.json --format json` subprocess (wall, incl. start-up)"),
    }
    fns = {
        JSON: lambda: read_json(a, b),
        PARSE: lambda: read_plans(a, b),
        DIFF: lambda: diff_plans(*parsed),
        WHOLE: lambda: whole(a, b),
        CLI: lambda: cli_diff(a, b),
    }
    for fn in fns.values():  # warm-up: page cache, bytecode, lazy imports
        fn()
    for r in range(repeats):
        for key, fn in fns.items():
            wall, cpu = cb.timed(fn)
            measures[key].times.append(wall)
            measures[key].cpu.append(cpu)
        print(f"  {n:>5} tables, round {r + 1}/{repeats}: " + ", ".join(f"{k} {m.times[-1]:.3f}s" for k, m in measures.items()), flush=True)
    mutated = {k: sum(1 for v in changed.values() if v == k) for k in MUTATIONS}
    profile = profile_diff(*parsed)
    return SizeResult(profile=profile, n=n, steps=len(parsed[1].steps), plan_bytes=(a.stat().st_size, b.stat().st_size), mutated=mutated, counts=counts,
                      classes=classes, worst=worst,
                      output_bytes=output_bytes, measures=measures, gen_s=gen_s)


STARTUP = {
    "`pipe --version` (interpreter, click, the CLI module)": lambda: cb.PIPE + ["--version"],
    "`python -c 'import pipe.cli, compiler.diff, pipe.diff_output'` (+ what `pipe diff` imports: networkx, rich)":
        lambda: [sys.executable, "-c", "import pipe.cli, compiler.diff, pipe.diff_output"],
}


# parts of diff_plans, found in the profile by (file name, function name)
STAGES = (
    ("steps compared (_modified: classes, SQL unified diffs)", "diff.py", "_modified"),
    ("downstream marking (_mark_downstream: one pass per graph in topological order)", "diff.py", "_mark_downstream"),
    ("of it, building the graphs (_graph)", "diff.py", "_graph"),
    ("of it, networkx.descendants", "dag.py", "descendants"),
    ("retention warnings (_retention_warnings)", "diff.py", "_retention_warnings"),
)


def profile_diff(base: Plan, head: Plan) -> tuple[float, list[tuple[str, float]]]:
    """(whole diff_plans, [(stage, cumulative seconds)]) of one profiled diff_plans: where the
    time goes (the profiler's overhead inflates both alike)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    diff_plans(base, head)
    prof.disable()
    by_name: dict[tuple[str, str], float] = {}
    for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        key = (os.path.basename(file), func)
        by_name[key] = by_name.get(key, 0.0) + ct
    total = by_name.get(("diff.py", "diff_plans"), 0.0)
    return total, [(label, by_name[(f, fn)]) for label, f, fn in STAGES if (f, fn) in by_name]


def startup(repeats: int = 5) -> dict[str, list[float]]:
    """What `pipe diff` pays before it reads a plan, as subprocess wall times."""
    out = {}
    for label, argv in STARTUP.items():
        def once(argv=argv()):
            subprocess.run(argv, check=True, capture_output=True, env=cb.SUB_ENV, cwd=cb.REPO)

        once()
        out[label] = [cb.timed(once)[0] for _ in range(repeats)]
    return out


# --- the report ------------------------------------------------------------------------------------


@dataclass
class Run:
    started: dt.datetime
    machine: dict[str, str]
    repeats: dict[int, int]
    results: list[SizeResult] = field(default_factory=list)
    startup: dict[str, list[float]] = field(default_factory=dict)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cpu_before: tuple[float, float, float] | None = None
    cpu_after: tuple[float, float, float] | None = None
    wall_s: float = 0.0
    code_before: str = ""
    code_after: str = ""


def _s(x: float) -> str:
    return f"{x:.3f}"


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def render_report(run: Run) -> str:
    # compile_bench's helpers take its own Run; they read only these fields
    busy = cb._busy(run)  # type: ignore[arg-type]
    comp = cb._competition(run)  # type: ignore[arg-type]
    out: list[str] = []
    w = out.append
    w(f"## pipe diff: two plans of {' and '.join(f'{r.n:,}' for r in run.results)} tables")
    w("")
    w("Generated by `python bench/diff_bench.py` — do not edit by hand; run the script again.")
    w("")
    w(f"- Date: {run.started.strftime('%Y-%m-%d %H:%M %Z')}")
    for k, v in run.machine.items():
        if k != "PyYAML":
            w(f"- {k}: {v}")
    w(f"- Sizes: {', '.join(f'{r.n:,}' for r in run.results)} tables; repeats: " + ", ".join(f"{run.repeats[r.n]} at {r.n:,}" for r in run.results)
      + " (rounds interleave the five measurements; a warm-up round precedes them)")
    w(f"- Load average (1/5/15 min) before: {' / '.join(f'{x:.2f}' for x in run.load_before)}, after: {' / '.join(f'{x:.2f}' for x in run.load_after)}"
      + (f"; during the run other processes used {comp[0]:.0f} CPU-s and the hypervisor stole {comp[1]:.0f} CPU-s "
         f"(over {run.wall_s:.0f} s of wall time)" if comp else "")
      + (" — **the machine was not idle: wall times are inflated and noisy**" if busy else ""))
    w(f"- Whole run: {run.wall_s:.0f} s")
    if run.code_before != run.code_after:
        w(f"- **WARNING: pipe's code changed during this run** ({run.code_before} -> {run.code_after}); run again.")
    w("")
    w("### What is measured")
    w("")
    w(f"Each project is `bench/compile_bench.py`'s (seed {cb.SEED}: per table a .yml with key, precombine, partition_by, operation "
      f"and tags, and a .sql with 1–3 `ref()`s). Plan A is its compile; then {CHANGE_SHARE:.0%} of the tables (drawn with a fixed seed) "
      "are changed, in turn: the SQL (`lower(` → `upper(`: non-breaking), the key (`[id]` → `[id, region]`: rewrite), the operation "
      "(`upsert` → `insert`: breaking), or a `delete_when` added (destructive); plan B is the compile after that. Before timing, "
      "the script checks that the diff finds exactly the changed tables as modified, each with the class its change asks for.")
    w("")
    w("- **json.loads**: read both plan.json files and `json.loads` them — the floor: no diff of two JSON plans can cost less.")
    w("- **Plan.from_json**: read both and parse them into `Plan`s, as `pipe diff A B` does first.")
    w("- **diff_plans**: `compiler.diff.diff_plans(A, B)` on the parsed plans: step matching, classes, SQL unified diffs, the "
      "downstream (`indirect`) marking on both graphs, retention warnings.")
    w("- **in-process, whole**: read + `Plan.from_json` + `diff_plans` + `render_json` (what the command does, minus start-up).")
    w("- **pipe diff**: `pipe diff A.json B.json --format json` as a subprocess, output captured; wall time including "
      "interpreter start-up and imports (bytecode cached, as for an installed tool).")
    w("")
    w("Times in seconds; *CPU s* is user + system CPU (of the subprocess too for `pipe diff`), median; "
      "*× json.loads* = median wall / median wall of the json.loads baseline.")
    w("")
    for r in run.results:
        floor = r.m(JSON).median
        w(f"### {r.n:,} tables")
        w("")
        w(f"{r.steps:,} steps; plan.json A {r.plan_bytes[0] / 1024:,.0f} KiB, B {r.plan_bytes[1] / 1024:,.0f} KiB; changed: "
          + ", ".join(f"{v} {k}" for k, v in r.mutated.items())
          + f". The diff: {r.counts['modified']} modified, {r.counts['indirect']:,} indirect, {r.counts['unchanged']:,} unchanged; "
          + ", ".join(f"{v} {k}" for k, v in sorted(r.classes.items()))
          + f"; JSON output {r.output_bytes / 1024:,.0f} KiB. Projects generated and compiled twice in {r.gen_s:.1f} s.")
        w("")
        w("| measurement | median s | best s | CPU s | × json.loads |")
        w("|---|---:|---:|---:|---:|")
        for m in r.measures.values():
            w(f"| {m.label} | {_s(m.median)} | {_s(m.best)} | {_s(m.cpu_median)} | {m.median / floor:.2f} |")
        w("")
        if r.profile and r.profile[0]:
            total, stages = r.profile
            w(f"Where `diff_plans` spends its time (one run under cProfile, {_s(total)} s with the profiler's overhead): "
              + "; ".join(f"{label} {t / total:.0%}" for label, t in stages) + ".")
            w("")
    w("What `pipe diff` pays before it reads a plan (subprocess wall time, 5 runs):")
    w("")
    w("| command | median s | best s |")
    w("|---|---:|---:|")
    for label, times in run.startup.items():
        w(f"| {label} | {_s(statistics.median(times))} | {_s(min(times))} |")
    w("")
    st = statistics.median(list(run.startup.values())[-1])
    w("### Conclusion")
    w("")
    ref = next((r for r in run.results if r.n == 1000), run.results[0])
    d, cli, parse, js = ref.m(DIFF).median, ref.m(CLI).median, ref.m(PARSE).median, ref.m(JSON).median
    imports = list(run.startup.values())[-1] if run.startup else [0.0]

    def verdict(t: float) -> str:
        return "well under a second" if t < TARGET_S / 2 else ("under a second" if t < TARGET_S else "not under a second")

    parts = [
        f"**At {ref.n:,} tables:** `diff_plans` takes {_ms(d)} ms, {d / parse:.1f}× the time it takes to parse the two plans "
        f"({_ms(parse)} ms) and {d / js:.1f}× a bare `json.loads` of them ({_ms(js)} ms): {verdict(d)}. The whole command, "
        f"`pipe diff A.json B.json --format json`, takes {_s(cli)} s wall, {verdict(cli)}; {_s(statistics.median(imports))} s (best {_s(min(imports))} s) of that is "
        "interpreter start-up and imports before any plan is read (networkx, which compiler/plan.py imports, is most of them)."
    ]
    if len(run.results) > 1:
        big = run.results[-1]
        k = cb._exponent(ref.m(DIFF).median, ref.n, big.m(DIFF).median, big.n)
        shape = "about linear" if k <= 1.2 else "clearly worse than linear"
        text = (f"**At {big.n:,} tables:** `diff_plans` takes {_s(big.m(DIFF).median)} s and the command {_s(big.m(CLI).median)} s, "
                f"{verdict(big.m(CLI).median)}. Growth from {ref.n:,} to {big.n:,} tables is {shape} (k = {k:.2f}; 1.0 = linear).")
        if k > 1.2:
            text += (f" With {CHANGE_SHARE:.0%} of the tables changed, the number of changed steps grows with the project too, and the "
                     "downstream marking walks the descendants of every changed step in both graphs and records each changed "
                     "ancestor of every indirect step (checked against a list), so it costs about changed steps × descendants: "
                     f"here {big.counts['modified']} changes over {big.counts['indirect']:,} indirect steps (the profile line above). "
                     "One pass in topological order, carrying sets of changed ancestors, would avoid the repeated walks; "
                     "listing only the nearest changed ancestors would also shrink the JSON.")
        parts.append(text)
    share = (ref.m(WHOLE).median - d) / ref.m(WHOLE).median if ref.m(WHOLE).median else 0.0
    parts.append(f"Of the in-process whole at {ref.n:,} tables, {share:.0%} is reading, parsing and writing JSON rather than diffing.")
    if busy:
        parts.append("**Caveat:** other processes used the CPUs during this run; rerun on an idle machine before relying on the wall times.")
    w("\n\n".join(parts))
    return "\n".join(out) + "\n"


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="comma-separated table counts (default: 1000,5000)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per size (default: 7 up to 1,000 tables, 5 above)")
    ap.add_argument("--output", default=str(BENCH_DIR / "RESULTS.md"), help="report file (default: bench/RESULTS.md)")
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s.strip().replace("_", "")) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error("--sizes takes numbers separated by commas, e.g. 1000,5000")
    if not sizes or min(sizes) < 100:
        ap.error("sizes must be at least 100")
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be at least 1")
    repeats = {n: args.repeats or (7 if n <= 1000 else 5) for n in sizes}

    run = Run(started=dt.datetime.now().astimezone(), machine=cb._machine(), repeats=repeats, load_before=os.getloadavg(),
              cpu_before=cb._cpu_counters(), code_before=cb._code_fingerprint())
    t_start = time.perf_counter()
    print(f"pipe diff benchmark: sizes {sizes}, pipe = {' '.join(cb.PIPE)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="pipe-diff-bench-"))
    cb.SUB_ENV["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    try:
        run.startup = startup()
        for n in sizes:
            run.results.append(bench_size(work, n, repeats[n]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run.wall_s = time.perf_counter() - t_start
    run.load_after = os.getloadavg()
    run.cpu_after = cb._cpu_counters()
    run.code_after = cb._code_fingerprint()

    from report import write_section  # bench/report.py: one section per benchmark

    write_section("diff", render_report(run), Path(args.output))
    print()
    for r in run.results:
        print(f"{r.n:>5} tables: " + ", ".join(f"{k} median {m.median:.3f}s best {m.best:.3f}s" for k, m in r.measures.items()))
    for label, times in run.startup.items():
        print(f"start-up {label}: {statistics.median(times):.3f}s")
    if run.code_before != run.code_after:
        print(f"\nWARNING: pipe's code changed during the run ({run.code_before} -> {run.code_after}); the figures mix versions, run again")
    print(f"\nwrote {args.output} ({run.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
