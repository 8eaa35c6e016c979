"""The compiler half of pipe: project folder in, deterministic Plan out.

Pure Python. Never imports pyspark or boto3 (a test enforces it), so `pipe compile` runs in
well under a second on a laptop or in CI. Stages, each a module taking the previous stage's
typed output: project (read) -> validate -> render -> graph -> plan (-> diff).
"""

from compiler.api import compile_project

__all__ = ["compile_project"]
