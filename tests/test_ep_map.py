"""Expert parallelism through an expert_map in a sweep (``--ep-map``, ``ep_map: true``): rank 0's layer with the
whole batch and global top-k ids; its rows, meta, identity and floor counts; the paths that cannot run it.

On the CPU the kernels run on the Triton interpreter, in fp16.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from helpers import moebench_in_process

from moebench.bench.spec import Block, SweepSpec
from moebench.bench.sweep import SweepPlan, sweep_request
from moebench.errors import UserError
from moebench.measure.timer import WALLCLOCK, Timing
from moebench.models import EPMapShape, get_model, shard
from moebench.paths.base import Target
from moebench.problem import Problem, make_inputs
from moebench.store.resume import IDENTITY_COLUMNS, row_identity
from moebench.store.rows import Row
from moebench.store.runfolder import load_run

TINY = get_model("tiny")  # 8 experts, top-2
HOPPER = Target(torch.device("cuda"), False, (9, 0))  # where every path runs some point: plans only, nothing runs
SPEC = """name: ep
models: [tiny]
m: [5]
dtypes: [fp16]
runs:
  - {ep: 2, ep_map: true}   # rank 0 of 2 through an expert_map: triton-classic cannot
  - {ep: 2}                 # the all-to-all form of the same degree: every path runs it
"""


def once(fn) -> Timing:
    """One wall-clock run in place of the interpreter's warm-up and three: each row still gets a time."""
    start = time.perf_counter()
    fn()
    return Timing.from_samples([(time.perf_counter() - start) * 1e6], WALLCLOCK)


def test_shard_with_ep_map_keeps_the_batch_and_routes_over_every_expert():
    mapped, dispatched = shard(TINY, ep=4, ep_map=True), shard(TINY, ep=4)
    assert isinstance(mapped, EPMapShape) and mapped.mapped and not dispatched.mapped
    assert (mapped.name, mapped.experts, mapped.routed_experts, mapped.topk) == ("tiny@ep4map", 2, 8, 2)
    assert (dispatched.name, dispatched.experts, dispatched.routed_experts) == ("tiny@ep4", 2, 2)
    many = replace(get_model("deepseek-v3"), name="ds")
    assert shard(many, ep=64, ep_map=True).topk == 8 and shard(many, ep=64).topk == 4  # top-k over 256, or capped
    with pytest.raises(UserError, match="needs --ep"):
        shard(TINY, ep_map=True)
    with pytest.raises(UserError, match="not divisible by --ep 3"):
        shard(TINY, ep=3, ep_map=True)


def test_inputs_route_over_global_experts_and_count_only_the_local_work():
    """Rank 0 holds global ids 0..3 of 8: the map sends them to 0..3 and the rest to -1; experts touched, the
    local slots and the FLOPs count only what lands on them (checked against the ids directly)."""
    problem = Problem(shard(TINY, ep=2, ep_map=True), 64, "fp16")
    inputs = make_inputs(problem, "cpu")
    ids = inputs.topk_ids
    assert ids.shape == (64, 2) and int(ids.max()) >= 4  # global ids: other ranks' experts are drawn too
    assert inputs.expert_map.tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    local = ids[ids < 4]
    assert 0 < local.numel() < ids.numel()
    assert inputs.local_slots == local.numel() and inputs.experts_touched == len(set(local.tolist()))
    assert problem.slot_flops(inputs.local_slots) < problem.flops
    plain = make_inputs(Problem(TINY, 64, "fp16"), "cpu")
    assert plain.expert_map is None and plain.local_slots == 128


def test_paths_without_an_expert_map_say_why_and_the_mode_is_in_the_identity():
    block = Block((shard(TINY, ep=2, ep_map=True), shard(TINY, ep=2)), (3,), ("bf16",),
                  ("triton", "triton-classic", "cutlass", "torch"))
    plan = SweepPlan.build(SweepSpec("t", (block,)), HOPPER)
    reasons = {(p.problem.shape.name, p.path_name): p.reason for p in plan.points}
    for path in ("triton-classic", "cutlass"):
        assert "takes no expert_map" in reasons[("tiny@ep2map", path)]
    assert reasons[("tiny@ep2map", "triton")] is None and reasons[("tiny@ep2map", "torch")] is None
    assert "expert_map" not in (reasons[("tiny@ep2", "triton-classic")] or "")
    # a row with global_experts is another measurement than the same columns without; one without keeps the
    # identity (and request key) rows had before the column existed
    row = Row.for_point(Problem(shard(TINY, ep=2, ep_map=True), 3, "bf16"), "triton", HOPPER).as_dict()
    assert row["global_experts"] == 8 and row["flops"] is None  # the flops are counted once the ids are drawn
    assert row_identity(row) != row_identity({**row, "global_experts": None})
    assert len(row_identity({**row, "global_experts": None})) == len(IDENTITY_COLUMNS) + 1
    request = sweep_request(plan)["rows"]
    assert any(r[-1] == ("global_experts", 8) for r in request) and any(len(r) == len(IDENTITY_COLUMNS) + 1
                                                                         for r in request)


def test_a_spec_with_ep_map_writes_checked_rows_and_unsupported_ones(tmp_path, monkeypatch):
    """Triton and the reference run rank 0's layer; triton is checked against the float32 reference with the
    same map; triton-classic's row there is unsupported with its reason, and it runs the other block. (--path:
    without it the interpreter drops, with a note, a path that runs none of a block's points here.)"""
    import moebench.measure.point as point

    monkeypatch.setattr(point, "time_wallclock", once)
    (tmp_path / "ep.yaml").write_text(SPEC)
    proc = moebench_in_process("sweep", "ep.yaml", "--path", "triton,triton-classic,torch", "--out", "out",
                               "--no-progress", "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta, df = load_run(next((tmp_path / "out").iterdir()))
    assert meta["ep_map"] == {"tiny@ep2map": {"global_experts": 8, "local_experts": 4}}
    mapped, plain = df[df["model"] == "tiny@ep2map"], df[df["model"] == "tiny@ep2"]
    assert (mapped["global_experts"] == 8).all() and plain["global_experts"].isna().all()
    by_path = mapped.set_index("path")
    for path in ("triton", "torch"):
        assert by_path.loc[path, "status"] == "ok" and by_path.loc[path, "correct"], by_path.loc[path, "error"]
    assert by_path.loc["triton", "rel_err"] < 1e-2
    assert by_path.loc["triton-classic", "status"] == "unsupported"
    assert "takes no expert_map" in by_path.loc["triton-classic", "error"]
    assert (plain["status"] == "ok").all() and plain["correct"].all()
    # the work of the local slots only: fewer FLOPs than the plain rank's top-2 over its 4 experts at the same M
    inputs = make_inputs(Problem(shard(TINY, ep=2, ep_map=True), 5, "fp16"), "cpu")
    local = inputs.topk_ids[inputs.topk_ids < 4]
    assert by_path.loc["triton", "flops"] == 2 * local.numel() * 3 * 64 * 128
    assert by_path.loc["triton", "experts_touched"] == len(set(local.tolist()))


def test_flags_run_ep_map_on_the_triton_path_by_default(tmp_path, monkeypatch):
    """--ep N --ep-map without --path: triton (the default paths that take an expert_map)."""
    import moebench.measure.point as point

    monkeypatch.setattr(point, "time_wallclock", once)
    proc = moebench_in_process("sweep", "--model", "tiny", "--ep", "4", "--ep-map", "--m", "3", "--dtype", "fp16",
                               "--out", "out", "--no-progress", "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta, df = load_run(next((tmp_path / "out").iterdir()))
    assert meta["ep_map"] == {"tiny@ep4map": {"global_experts": 8, "local_experts": 2}}
    assert df["path"].tolist() == ["triton"] and df["status"].tolist() == ["ok"] and df["correct"].all()
    assert (df["experts"].tolist(), df["topk"].tolist(), df["global_experts"].tolist()) == ([2], [2], [8])
