"""The compiler half of pipe: project folder in, deterministic Plan out.

Pure Python. Never imports pyspark or boto3 (a test enforces it), so `pipe compile` runs in
well under a second on a laptop or in CI. Stages, each a module taking the previous stage's
typed output: project (read) -> validate -> render -> graph -> plan (-> diff).
"""


def __getattr__(name: str):
    # `from compiler import compile_project` without importing networkx and jinja2 for
    # commands that never compile (`pipe --version`, `pipe init`)
    if name == "compile_project":
        from compiler.api import compile_project

        return compile_project
    raise AttributeError(name)


__all__ = ["compile_project"]
