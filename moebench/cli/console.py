"""What every command prints besides its own data: notes on stderr, the consoles, text on stdout, the output
formats, the one progress bar, and a run folder loaded with its warnings said.

Every command imports these from here (and ``cli.main`` imports the commands), so no command depends on the
group that registers it. Rich is imported when first used, so ``--help`` stays light.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click

FORMATS = ("table", "csv", "json")  # --format: a rich table for people, CSV or JSON for programs
# The worker options of the commands that time on GPUs (tune, tune-tables, retime, fit-time).
GPUS_OPTION = click.option("--gpus", type=int, default=None,
                           help="Timing workers, one per GPU. [default: every local GPU]")
COMPILE_JOBS_OPTION = click.option(
    "--compile-jobs", type=click.IntRange(min=0), default=None,
    help="Processes that compile and first-run configs. [default: cores - 1, at most 15]")
TEXT_FORMATS = ("text", "json")  # --format of warmup, which prints one summary line rather than a table


class GivenPath(click.Path):
    """A path option or argument that names something: an empty one (``--out ""``, an unset variable) is
    refused, not read as the current folder; where a file is needed (``dir_okay=False``), so is one that ends
    in a slash (a folder's name)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path names nothing", param, ctx)
        if isinstance(value, str) and not self.dir_okay and value.endswith(("/", os.sep)):
            self.fail(f"{value!r} ends in a slash, the name of a folder; a file is needed", param, ctx)
        return super().convert(value, param, ctx)


class NonNegative(click.ParamType):
    """A finite number, 0 or more: ``nan`` and ``inf``, which Python's float reads, are refused too."""

    name = "float"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a finite number of 0 or more", param, ctx)
        return number


def err_console():
    """Standard error for notes, warnings and progress (rich, imported when first needed): the terminal's width,
    or, where stderr is a file or a pipe (a CI log), wide enough that a progress line is not cut at 80 columns."""
    from rich.console import Console

    return Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=200)


def note(text: str, style: str = "") -> None:
    """One line on stderr, printed as is (no rich markup read in ``text``)."""
    from rich.text import Text

    err_console().print(Text(text, style=style), soft_wrap=True)


def note_resumed(run_dir, record: dict) -> None:
    """The lines a resumed run prints: the reopening's warnings, then what was kept from which status."""
    for w in record.get("warnings", []):
        note(w)
    note(f"resuming {run_dir}: {record['rows_kept']} rows kept (previous status: {record['previous_status']})")


def records_text(records: list[dict], fmt: str) -> str:
    """``records`` (one dict per line, the same keys) as CSV or JSON for programs: stable columns, in order."""
    import csv
    import io
    import json

    if fmt == "json":
        return json.dumps(records, indent=2)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]) if records else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


def out_console():
    """Standard output for tables: the terminal's width, or wide enough not to crop columns in a pipe. A reader
    that stops (``| head``) raises ``BrokenPipeError`` to ``cli.main`` (exit 141, as a shell's own tools), where
    rich alone would exit 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole() if sys.stdout.isatty() else PipeConsole(width=200)


def emit(text: str | None) -> None:
    """Text for programs (CSV, JSON) on stdout, without a trailing blank line; nothing for None."""
    if text is not None:
        click.echo(text.rstrip("\n"))


def progress_bar(enabled: bool):
    """The progress bar of every command, on stderr: the task, the bar, done/total, time elapsed and left, and the
    task's ``status`` field where it was given one (``add_task(..., status="")``); disabled, it prints nothing."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class StatusColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text(str(task.fields.get("status", "")))

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), StatusColumn(), console=err_console(),
                    disable=not enabled)


def phase_progress(bar):
    """An ``on_progress(what, done, total, **fields)`` for ``bar``: a task per phase ``what`` (a new one when the
    phase changes), its counts and fields (``status``) updated."""
    task: dict = {"id": None}

    def on_progress(what: str, done: int, total: int, **fields) -> None:
        if task["id"] is None or bar.tasks[task["id"]].description != what:
            task["id"] = bar.add_task(what, total=total, status="")
        bar.update(task["id"], completed=done, total=total, **fields)

    return on_progress


def load_run_warned(run: Path):
    """A run folder's (meta, rows), saying on stderr when its schema version is not this moebench's or a
    torn last row was left out, and when the run did not run through (killed, interrupted, failed)."""
    from moebench.store.runfolder import load_run, schema_warning, status_warning

    meta, df = load_run(run)
    for w in [schema_warning(meta, str(run)), status_warning(meta, str(run), len(df)), *df.attrs.get("warnings", [])]:
        if w:
            note(w)
    return meta, df
