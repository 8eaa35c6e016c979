"""The `pipe` command: its group of commands (one module per kind under pipe/commands/) and
how a command ends. Exit codes: 0 success, 1 a step or run failed, 2 a mistake in the project or
the command line. A mistake never prints a Python traceback; `--debug` does."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import click

from compiler.errors import PipeError, ProjectError
from pipe import __version__, output
from pipe.commands import diff, project, run, server, tables
from pipe.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Context, print_traceback


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipe")
@click.option("--debug", is_flag=True, help="Show Python tracebacks for every error.")
@click.option("--project-dir", default=None, type=click.Path(file_okay=False), help="Project folder (default: the nearest folder with pipe_project.yml).")
@click.pass_context
def cli(click_ctx: click.Context, debug: bool, project_dir: str | None) -> None:
    """pipe: declarative pipelines on Spark, with Apache Hudi tables."""
    click_ctx.obj = Context(debug, project_dir)


for _command in (
    project.init, project.compile_cmd, project.ls_cmd, project.docs_group, project.discover_cmd, project.doctor_cmd,
    run.run_cmd, run.build_cmd, run.seed_cmd, run.test_cmd, run.retry_cmd,
    server.server_group, server.pack_env_cmd,
    tables.show_cmd, tables.timeline_cmd, tables.clean_cmd, tables.sync_cmd, tables.compact_cmd, tables.savepoint_cmd,
    tables.restore_cmd, tables.rollback_cmd, tables.migrate_cmd,
    diff.diff_cmd,
):
    cli.add_command(_command)


# Commands after which a failed run has left files as they were.
_WRITING_COMMANDS = ("compile", "init")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args  # before or after the command name
    command = next((a for a in args if a in cli.commands), None)
    # what pipe prints goes through output.mask: env_var() values of settings and options never show
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = output.MaskingStream(sys.stdout), output.MaskingStream(sys.stderr)
    previous = _cancel_on_sigterm()
    _stacks_on_sigusr2(streams[1])
    try:
        return _main(args, debug, command)
    finally:
        sys.stdout, sys.stderr = streams
        output.forget_secrets()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stacks_on_sigusr2(stderr) -> None:
    """`kill -USR2 <pid>` prints where each of the command's Python threads is, on its standard
    error, and the command goes on: what to send a `pipe` that seems stuck (docs/run.md)."""
    import faulthandler

    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR2"):
        try:
            faulthandler.register(signal.SIGUSR2, file=stderr, all_threads=True)
        except (AttributeError, ValueError, OSError):  # no file descriptor (an embedding's stream): no dumps
            pass


def _cancel_on_sigterm():
    """SIGTERM cancels the command as Ctrl-C does (the run's steps are cancelled and reported,
    their writes roll back, the run lock is released), and it exits 143. Returns the handler it
    replaced (None when it replaced none: not in the main thread, or one is set already)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def on_sigterm(signum, frame):  # noqa: ARG001 - signal handler
        from runtime.errors import Terminated

        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    return signal.SIG_DFL


def _main(args: list[str], debug: bool, command: str | None) -> int:
    try:
        code = cli.main(args=args, prog_name="pipe", standalone_mode=False)
        if isinstance(code, int) and code:
            return code  # click returns the code of an Exit raised by a command
    except ProjectError as exc:
        if debug:
            print_traceback()
        output.diagnostics(exc.diagnostics, wrote_nothing=command in _WRITING_COMMANDS)
        return EXIT_USAGE
    except PipeError as exc:
        if debug:
            print_traceback()
        output.fail(str(exc), getattr(exc, "hint", None))
        return getattr(exc, "exit_code", EXIT_USAGE)  # e.g. 1 for a run refused because another one is going on
    except click.exceptions.Abort:
        output.fail("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt as exc:
        output.fail("terminated (SIGTERM)" if getattr(exc, "signal_name", "") == "SIGTERM" else "interrupted")
        return getattr(exc, "exit_code", 130)
    except Exception as exc:  # a bug in pipe, not in the project
        if debug:
            print_traceback()
        from runtime.table.errors import TableError

        if isinstance(exc, TableError):  # a table service or write refused; nothing was changed
            output.fail(str(exc), exc.hint)
            return EXIT_FAILED
        output.fail(f"internal error: {type(exc).__name__}: {exc}", "this is a bug in pipe; run again with --debug for the traceback and report it")
        return EXIT_FAILED
    return EXIT_OK


def entry() -> None:
    code = main()
    if code in (130, 143) and any(t.name.startswith("pipe-step") and t.is_alive() for t in threading.enumerate()):
        # interrupted twice, with a step's thread still in a call to Spark: Python would wait for
        # it at exit (concurrent.futures joins its threads); what is printed is printed, so go now
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)
