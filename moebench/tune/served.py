"""The shapes and dtypes each preset is served in, and ``tune_tables``: tune them and write their tables.

``SERVED`` lists, per preset, the dtypes its published checkpoints run in (bf16, and the fp8 scheme of its
fp8 checkpoint) at the tensor-parallel degree that fits it on H200s (141 GB each) with room for the KV cache,
and, marked ``served=False``, a dtype of the benchmark points (``sweeps/h200-kernels.yaml``) that no
checkpoint is served in, so those points run a table tuned the same way too.
A table is keyed by (experts, per-GPU intermediate size, device, dtype), so another TP degree is another
table; the lookup falls back to the heuristic there. ``tune_tables`` runs ``moebench tune --path triton``
on each entry with its default options (the fast strategy with the path's defaults) and writes
the chosen configs as moebench tables (``export-configs --layout moebench``), which ``moebench/tables/shipped``
holds for the H200.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from moebench.dtypes import DTYPE_NAMES, DTYPES
from moebench.errors import UserError
from moebench.models import MoEShape, get_model, shard

PATH = "triton"  # moebench's kernel: the path whose tables the lookup reads


@dataclass(frozen=True)
class Served:
    """One table to ship: a preset at a TP degree and dtype, and why it is served so."""

    model: str
    tp: int
    dtype: str
    why: str
    served: bool = True  # False: a benchmark dtype no checkpoint is served in

    @property
    def shape(self) -> MoEShape:
        return shard(get_model(self.model), tp=self.tp)

    @property
    def name(self) -> str:
        return f"{self.model}{f'@tp{self.tp}' if self.tp > 1 else ''} {self.dtype}"


SERVED: tuple[Served, ...] = (
    Served("deepseek-v3", 8, "fp8-block128", "the checkpoint is fp8 with 128x128 weight blocks; 671 GB: TP8"),
    Served("kimi-k2", 8, "fp8-block128", "the checkpoint is fp8 with 128x128 weight blocks; 1.0 TB: TP8"),
    Served("qwen3-30b-a3b", 1, "bf16", "the bf16 checkpoint, 61 GB: one GPU"),
    Served("qwen3-30b-a3b", 1, "fp8-block128", "Qwen3-30B-A3B-FP8: 128-wide weight blocks, one GPU"),
    Served("qwen3-235b-a22b", 4, "bf16", "the bf16 checkpoint, 470 GB: TP4"),
    Served("qwen3-235b-a22b", 4, "fp8-block128", "Qwen3-235B-A22B-FP8 (128 blocks): TP4, as at TP8 the "
                                                  "per-GPU intermediate (192) is not a whole number of blocks"),
    Served("mixtral-8x7b", 1, "bf16", "the bf16 checkpoint, 93 GB: one GPU"),
    Served("mixtral-8x7b", 1, "fp8-tensor-static", "the FP8 checkpoints carry per-tensor static scales"),
    Served("mixtral-8x7b", 1, "fp8-tensor", "not served: the benchmark's fp8-tensor points (dynamic per-tensor "
                                            "activation scales)", served=False),
    Served("llama-4-scout", 2, "bf16", "the bf16 checkpoint, 218 GB: TP2"),
    Served("llama-4-scout", 1, "fp8-channel", "the FP8-dynamic checkpoint: per-channel weights, 109 GB"),
    Served("gpt-oss-120b", 2, "bf16", "bf16 (moebench runs no mxfp4), 234 GB: TP2"),
    Served("gpt-oss-20b", 1, "bf16", "bf16 (moebench runs no mxfp4), 42 GB: one GPU"),
)


def select(models: Iterable[str] = (), dtypes: Iterable[str] = ()) -> list[Served]:
    """The entries of ``SERVED`` for ``models`` (preset names or aliases; all where empty) and ``dtypes``;
    UserError for an unknown dtype, or a model or a dtype no entry has."""
    wanted = {get_model(m).name for m in models}
    dtypes = set(dtypes)
    for d in sorted(dtypes - set(DTYPES)):
        raise UserError(f"unknown dtype {d!r}; known: {DTYPE_NAMES}")
    for m in wanted - {s.model for s in SERVED}:
        raise UserError(f"{m} has no served entry; served models: {', '.join(dict.fromkeys(s.model for s in SERVED))}")
    chosen = [s for s in SERVED if (not wanted or s.model in wanted) and (not dtypes or s.dtype in dtypes)]
    if not chosen:
        raise UserError(f"no served entry for {', '.join(sorted(wanted)) or 'any model'} in "
                        f"{', '.join(sorted(dtypes))}")
    return chosen


def check(out_base: Path, into: Path, gpus: int | None) -> None:
    """Every check of ``tune_tables``'s own arguments before it creates anything: the worker count and the two
    folders (each entry's request is checked by its tune)."""
    from moebench.store.runfolder import check_out_dir
    from moebench.workers.pools import check_pool_choice

    check_pool_choice(gpus, None)
    check_out_dir(out_base, "--out")
    check_out_dir(into, "--into")


@dataclass(frozen=True)
class Tuned:
    """One entry's outcome: its tune's run folder (None where the tune did not start) and the table files
    written (none where it failed: ``error`` says why)."""

    entry: Served
    run_dir: Path | None
    files: tuple[Path, ...]
    error: str | None = None


def tune_tables(entries: list[Served], out_base: Path, into: Path, ms: tuple[int, ...],
                tune_kwargs: dict | None = None,
                on_entry: Callable[[int, Served], None] | None = None,
                on_done: Callable[[Tuned], None] | None = None) -> list[Tuned]:
    """Tune each entry (a run folder under ``out_base``; a stopped one resumes) and export its table into
    ``into``. A UserError of one entry (a shape this GPU cannot run) is its ``error``; the rest go on. ``check``
    runs first: a refused argument creates nothing."""
    from moebench.store.runfolder import load_run
    from moebench.tables.export import export_run
    from moebench.tables.formats.moebench import FORMAT
    from moebench.tune.run import TuneRequest, tune

    check(out_base, into, (tune_kwargs or {}).get("gpus"))
    done = []
    for i, entry in enumerate(entries):
        if on_entry:
            on_entry(i, entry)
        run_dir = None
        try:
            run_dir = tune(TuneRequest(entry.shape, entry.dtype, PATH, ms), out_base,
                           **(tune_kwargs or {})).run_dir
            meta, df = load_run(run_dir)
            written = export_run(meta, df, into, layout="moebench", source_run=str(run_dir))
            tuned = Tuned(entry, run_dir, tuple(p for p in written.files if p.name.startswith(FORMAT)))
        except UserError as e:
            tuned = Tuned(entry, run_dir, (), str(e))
        done.append(tuned)
        if on_done:
            on_done(tuned)
    return done
