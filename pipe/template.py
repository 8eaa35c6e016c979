"""Where the example project lives: inside the installed package (a wheel ships it as
pipe/project_template), or at the root of a source checkout (an editable install)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from compiler.errors import PipeError


def template_dir() -> Path:
    packaged = Path(str(resources.files("pipe"))) / "project_template"
    if (packaged / "pipe_project.yml").is_file():
        return packaged
    checkout = Path(__file__).resolve().parent.parent / "project_template"
    if (checkout / "pipe_project.yml").is_file():
        return checkout
    raise PipeError("the example project is missing from this installation of pipe; reinstall pipe")
