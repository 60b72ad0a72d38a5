"""The command line: the ``moebench`` group, every command registered on it, and ``main``, where every error a
user can cause ends.

Errors a user can cause (``UserError``, an ``OSError`` on a path they named, a bad option) print one
line on stderr and exit with status 2. The commands live in their own modules and import ``cli.console``, never
this one. Importing this module loads neither torch nor Triton: each command imports what it needs, so
``--help`` stays fast.
"""

from __future__ import annotations

import os
import sys

import click

from moebench import __version__
from moebench.cli.console import FORMATS, emit, note, records_text
from moebench.cli.doctor import doctor
from moebench.cli.fitcheck import fit_check, fit_time
from moebench.cli.probes import bounds, isa, profile
from moebench.cli.report import compare, plot, report
from moebench.cli.retime import retime
from moebench.cli.step import step
from moebench.cli.sweep import sweep
from moebench.cli.trace import trace
from moebench.cli.tune import export_configs, tune, tune_tables
from moebench.cli.warmup import warmup
from moebench.errors import UserError, os_error_line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moebench")
def cli() -> None:
    """Benchmark and autotune fused Mixture-of-Experts kernels on Hopper GPUs."""


@click.command()
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
def models(fmt):
    """List the model presets."""
    from moebench.models import PRESETS

    if fmt != "table":
        emit(records_text([{"model": name, "experts": s.experts, "hidden": s.hidden, "intermediate": s.intermediate,
                            "topk": s.topk, "moe_layers": s.moe_layers, "shared_experts": s.shared_experts}
                           for name, s in PRESETS.items()], fmt))
        return
    for name, s in PRESETS.items():
        click.echo(f"{name:18} experts={s.experts:<4} hidden={s.hidden:<5} intermediate={s.intermediate:<6} "
                   f"topk={s.topk} moe_layers={s.moe_layers}")


cli.add_command(sweep)
cli.add_command(report)
cli.add_command(compare)
cli.add_command(plot)
cli.add_command(tune)
cli.add_command(tune_tables)
cli.add_command(export_configs)
cli.add_command(doctor)
cli.add_command(retime)
cli.add_command(fit_check)
cli.add_command(fit_time)
cli.add_command(warmup)
cli.add_command(trace)
cli.add_command(step)
cli.add_command(isa)
cli.add_command(profile)
cli.add_command(bounds)
cli.add_command(models)


def main() -> None:
    """The ``moebench`` entry point: every error a user can cause ends here as one line and exit status 2."""
    if not sys.argv[1:]:  # bare `moebench`: its help, as `moebench --help` prints it
        sys.argv.append("--help")
    try:
        code = cli.main(standalone_mode=False)
        sys.stdout.flush()  # a reader that stopped (| head) is met here, not at exit
    except UserError as e:
        _fail(str(e))
    except click.exceptions.Abort as e:  # Ctrl-C or SIGTERM (click turns a KeyboardInterrupt into Abort)
        _stopped(e.__cause__)
        note("aborted")
        sys.exit(130)
    except click.UsageError as e:
        where = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        _fail(f"{e.format_message().rstrip('.')}{where}", e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code)
    except BrokenPipeError:  # output piped into a reader that stopped (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when stdout is flushed
        sys.exit(141)
    except OSError as e:  # a path the user named: --out a file, a read-only folder, an unreadable run...
        _fail(os_error_line(e))
    except SystemExit:
        from click.utils import PacifyFlushWrapper

        if isinstance(sys.stdout, PacifyFlushWrapper):  # click met the broken pipe itself and exits 1
            sys.exit(141)
        raise
    sys.exit(code or 0)


def _stopped(cause: BaseException | None) -> None:
    """For a run that Ctrl-C or SIGTERM stopped (``store.runfolder.Interrupted``): one line and exit 130 / 143."""
    from moebench.store.resume import Interrupted

    if isinstance(cause, Interrupted):
        note(f"interrupted: rows so far in {cause.run_dir}; run the same command to resume" if cause.run_dir
             else f"interrupted ({cause.signal_name}) before a run folder was made")
        sys.exit(cause.exit_status)


def _fail(message: str, status: int = 2) -> None:
    note(f"error: {' '.join(message.split())}")
    sys.exit(status)
