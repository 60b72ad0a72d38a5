"""``export-configs --merge-with FILE``: a tune's table merged with the engine's shipped table of the same shape,
per M the faster entry, timed back to back in the table's kernel form.

export plan (``tables.export.plan_export``) + FILE (``tables.files.read_table``) -> the planned table FILE's name
matches (``prepare``: same kernel form, shape, dtype and device) -> at each M both tables hold, the tuned entry
and the shipped one timed back to back (``audit.pairs``): the tuned one where it is FASTER beyond the noise,
else the shipped one (ties and unknown noise keep what the engine ships) -> keys only in FILE kept as they are,
keys only in the tune kept -> the merged table written by ``write_export``, its sidecar entry saying per M
which entry came from where and both times.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from moebench.audit.pairs import REPEATS, Judged, open_run, row, time_pairs
from moebench.errors import UserError
from moebench.models import FusedShape, MoEShape
from moebench.tables.export import Planned, tuned_times
from moebench.tables.files import TableFile, read_table
from moebench.tables.table import ConfigTable

if TYPE_CHECKING:
    from moebench.workers.pools import Pools


@dataclass(frozen=True)
class Merge:
    """A merge checked and ready to time: the export's file it changes, the shipped table, and the problem the
    tune timed (shape, dtype, routing, seed)."""

    file: Path
    key: tuple
    tuned: ConfigTable
    shipped: TableFile
    shape: MoEShape
    dtype: str
    routing: str
    seed: int


def prepare(plan: Planned, shipped: Path) -> Merge:
    """Match ``shipped`` to the table of ``plan`` its file name names; a file that is missing, of no known layout,
    of a dtype moebench does not time, SGLang's table of GEMM2 alone (an export writes the table of both GEMMs),
    of another kernel form, or of another shape, dtype or device (no planned file of its name) is a UserError."""
    tf = read_table(shipped)
    if tf.dtype is None:
        raise UserError(f"--merge-with {shipped}: not a dtype moebench times ({tf.why})")
    if tf.down:
        raise UserError(f"--merge-with {shipped}: SGLang's table of GEMM2 (the down projection) alone; a tune's "
                        f"table drives both GEMMs: merge with {tf.path.name.removesuffix('_down.json')}.json")
    if tf.kernel != plan.fmt.PATH:
        raise UserError(f"--merge-with {shipped}: a {tf.layout} table of the {tf.kernel} kernel; --layout "
                        f"{plan.layout} writes {plan.fmt.PATH} tables")
    match = [f for f in plan.tables if f.name == tf.path.name]
    if not match:
        names = ", ".join(sorted(f.name for f in plan.tables))
        raise UserError(f"--merge-with {shipped}: another shape, dtype, device or layout than the run's table(s) "
                        f"in --layout {plan.layout} ({names})")
    file = match[0]
    key, tuned = plan.tables[file]
    rows = plan.rows[key]
    problem = rows[["model", "experts", "hidden", "intermediate", "topk", "moe_layers", "routing", "seed"]]
    problem = problem.drop_duplicates()
    if len(problem) != 1:
        raise UserError(f"--merge-with: the run's {file.name} was picked over {len(problem)} problems (models, "
                        "hidden sizes, top-k or routings); merge needs one: export a run of one shape")
    p = problem.iloc[0]
    layers = int(p["moe_layers"]) if pd.notna(p["moe_layers"]) else 1
    if str(p["model"]).endswith("+shared"):  # a tune with the shared expert in the routed layer (--shared-fused)
        shape = FusedShape(str(p["model"]), int(p["experts"]), int(p["hidden"]), int(p["intermediate"]),
                           int(p["topk"]), layers, 1, fused=1)
    else:
        shape = MoEShape(str(p["model"]), int(p["experts"]), int(p["hidden"]), int(p["intermediate"]),
                         int(p["topk"]), layers)
    return Merge(file, key, tuned, tf, shape, key[2], str(p["routing"]), int(p["seed"]))


@dataclass
class Merged:
    """What a merge chose: the table, the sidecar fields for its file, and the run folder of the timings."""

    table: ConfigTable
    sidecar: dict
    run_dir: Path
    judged: dict[int, Judged]


def merge(m: Merge, plan: Planned, out_base: Path, pools: Pools, *, repeats: int = REPEATS,
          on_progress=None) -> Merged:
    """Time each M both tables hold (tuned against shipped) into a new run folder under ``out_base`` and keep
    the faster entry per M (see the module docstring); ``plan``'s table for the file is replaced by the merged
    one, so ``write_export(plan, {file: merged.sidecar})`` writes it."""
    from moebench.paths.base import Target
    from moebench.problem import Problem

    target = Target.current()
    shipped = m.shipped.table
    both = [M for M in m.tuned if M in shipped]
    problems = {M: Problem(m.shape, M, m.dtype, m.routing, m.seed) for M in both}
    pairs = {M: (m.tuned[M], shipped[M]) for M in both}
    source = {(M, b.key()): f"shipped:{m.shipped.path.name}@M={M}" for M, (_, b) in pairs.items()}
    source.update({(M, a.key()): f"tuned:{m.file.name}@M={M}" for M, (a, _) in pairs.items()})
    writer = open_run(out_base, "merge", target.interpreter,
                      merge={"shipped": str(m.shipped.path), "table": m.file.name, "repeats": repeats})
    with writer:
        def record(t) -> None:
            writer.append(row(problems[t.M], plan.fmt.PATH, target, t, source.get((t.M, t.config.key()))))

        judged = time_pairs(pools.bench(plan.fmt.PATH, problems, record, on_progress), pairs, "check",
                            repeats) if both else {}
    entries, keys = {}, {}
    for M in sorted(set(m.tuned) | set(shipped)):
        if M not in shipped:
            entries[M], keys[str(M)] = m.tuned[M], {"from": "tuned"}
        elif M not in m.tuned:
            entries[M], keys[str(M)] = shipped[M], {"from": "shipped"}
        else:
            j = judged[M]
            tuned_wins = j.verdict == "FASTER" or (j.a_us is not None and j.b_us is None)
            entries[M] = j.a if tuned_wins else j.b
            keys[str(M)] = {"from": "tuned" if tuned_wins else "shipped", "tuned_us": j.a_us, "shipped_us": j.b_us,
                            "verdict": j.verdict, "noise": j.noise}
    extras = {M: more for M, more in shipped.extras.items() if keys[str(M)]["from"] == "shipped"}
    table = ConfigTable(entries, extras=extras)  # a shipped entry kept keeps the keys it carries
    plan.tables[m.file] = (m.key, table)
    times = tuned_times(plan.rows[m.key], table)
    for M, j in judged.items():  # the merge's own timing of the entry kept, where it ran
        kept = j.a_us if keys[str(M)]["from"] == "tuned" else j.b_us
        if kept is not None:
            times[str(M)] = {"time_us": kept, "p20_us": None, "p80_us": None}
    sidecar = {"times": times, "merged_with": {"file": str(m.shipped.path.resolve()), "layout": m.shipped.layout,
                                                "run": str(writer.run_dir), "keys": keys}}
    return Merged(table, sidecar, writer.run_dir, judged)
