"""Would GEMM1 be faster reading x's rows contiguous, in the align step's order, than gathered through the slots?

moebench's GEMM1 reads row ``sorted_ids[p] // topk`` of x for each place p of its tiles. The other way: x written
once per place (``x_places[p] = x[sorted_ids[p] // topk]``, padding places zero), so each tile's rows are
contiguous. This script times the layer's own GEMM1 launch both ways at a point's best config, with no kernel
change: the launch is captured from a ``fused_moe`` call, then launched again with ``x_places`` (and its 1x128
scales the same way) as x, places as slot ids (place p for a real slot, the sentinel for padding), top-k 1 and an
output of a row per place. Each form's h is checked against the other's (row ``sorted_ids[p]`` of the layer's h
against row p of the new one), then both timed (CUDA-graph replay, L2 flushed, median us), with the cost of
writing ``x_places`` estimated by a row gather of the quantized x and its scales (``index_select``: what a
quantization writing rows in that order would write on top of what it writes now).

    PYTHONPATH=$PWD python3 scripts/gemm1_contiguous_x.py > rows.jsonl
"""

from __future__ import annotations

import json

import torch
from _points import REPORT_RUNS, best_rows, layer, point_setup

import moebench.kernels.fused_moe as fm
from moebench.tile import TileConfig
from moebench.timing import time_graph

POINTS = [("qwen3-30b-a3b", "fp8-block128", 4096), ("deepseek-v3@tp8", "fp8-block128", 4096),
          ("qwen3-30b-a3b", "fp8-block128", 1024), ("qwen3-30b-a3b", "bf16", 4096)]


class Capture:
    """Stands in for a jit kernel: ``kernel[grid](*args, **kwargs)`` launches it and keeps the launch."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


def poison(t: torch.Tensor) -> None:
    """NaN in every element (0x7F is e4m3's NaN)."""
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(0x7F)
    else:
        t.fill_(float("nan"))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as bytes if it is fp8 (which CUDA indexing does not take), else itself."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def rows_of(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[idx]``, for fp8 tensors too."""
    return as_bytes(t)[idx].view(t.dtype)


def in_place_order(grid, args, kwargs):
    """The captured GEMM1 launch made to read x's rows in the align's order: (launch, the new h, place of
    each valid row, its slot)."""
    a1, gu, h_scale, a1_scale = args[0], args[2], args[3], args[4]
    sorted_ids, num_padded, T = args[6], args[8], args[9]
    topk = kwargs["TOPK"]
    n = sorted_ids.numel()  # max_padded: places the grid may reach
    used = int(num_padded.item())
    place = torch.arange(n, device=a1.device)
    valid = (place < used) & (sorted_ids < T)
    slot = sorted_ids[valid].long()
    rows, tok = place[valid], slot // topk  # each valid place, and the row of x it reads
    x_places = torch.zeros(n, a1.shape[1], device=a1.device, dtype=a1.dtype)  # [max_padded, H]
    as_bytes(x_places)[rows] = as_bytes(a1)[tok]
    s_places = None
    if a1_scale is not None:
        s_places = torch.zeros(n, a1_scale.shape[1], device=a1.device, dtype=a1_scale.dtype)
        s_places[rows] = a1_scale[tok]
    ids = torch.where(valid, place, n).to(sorted_ids.dtype)  # [max_padded] place ids, n marks padding
    h2 = torch.empty(n, gu.shape[1], device=gu.device, dtype=gu.dtype)  # [max_padded, I] a row per place
    hs2 = None if h_scale is None else torch.empty(n, h_scale.shape[1], device=gu.device, dtype=h_scale.dtype)
    new = list(args)
    new[0], new[2], new[3], new[4], new[6], new[9] = x_places, h2, hs2, s_places, ids, n  # strides as before
    kw = dict(kwargs, TOPK=1)
    return (lambda: fm._gemm1_swiglu[grid](*new, **kw)), h2, hs2, rows, slot


def measure(model: str, dtype: str, m: int, cfg: TileConfig) -> dict:
    """One point's row: h's difference between the two forms, and each form's GEMM1 and the rows' write timed."""
    original = fm._gemm1_swiglu
    problem, inp, ref, out = point_setup(model, dtype, m)
    cap = Capture(original)
    fm._gemm1_swiglu = cap
    try:
        layer(fm, inp, cfg, out)()
    finally:
        fm._gemm1_swiglu = original
    grid, args, kwargs = cap.launches[-1]
    assert kwargs["SPLIT_K"] == 1 and not kwargs["DIRECT"], "a tile per slot or split-K: not this script's"
    run_places, h2, hs2, rows, slot = in_place_order(grid, args, kwargs)
    h, h_scale = args[2], args[3]
    poison(h)
    poison(h2)
    original[grid](*args, **kwargs)
    run_places()
    a, b = rows_of(h, slot).float(), rows_of(h2, rows).float()  # [valid places, I]: each slot's h row, both forms
    if h_scale is not None:
        a = a * h_scale[slot].repeat_interleave(128, 1)[:, :a.shape[1]]
        b = b * hs2[rows].repeat_interleave(128, 1)[:, :b.shape[1]]
    row = dict(point=f"{model} {dtype} M={m}", config=cfg.as_dict(), slots=slot.numel(), places=h2.shape[0],
               h_rel_diff=((a - b).norm() / a.norm()).item(), nan=bool(b.isnan().any() or a.isnan().any()))
    a1, a1_scale = args[0], args[4]
    tok = (slot // kwargs["TOPK"]).to(torch.int32)  # [valid places] x's row of each
    x_rows = as_bytes(a1)
    gathered = torch.empty(tok.numel(), a1.shape[1], device=a1.device, dtype=x_rows.dtype)  # [valid places, H]

    def write_places() -> None:
        torch.index_select(x_rows, 0, tok, out=gathered)
        if a1_scale is not None:
            torch.index_select(a1_scale, 0, tok)

    forms = {"gemm1_slots": lambda: original[grid](*args, **kwargs), "gemm1_places": run_places,
             "write_places": write_places}
    for _ in range(2):
        for label, fn in forms.items():
            t = round(time_graph(fn, budget_s=0.3).median_us, 1)
            row[label] = min(t, row.get(label, t))
    row["saved_us"] = round(row["gemm1_slots"] - row["gemm1_places"] - row["write_places"], 1)
    return row


def main() -> None:
    best = best_rows(*REPORT_RUNS)
    for model, dtype, m in POINTS:
        cfg = TileConfig.from_dict(best[(model, dtype, m)]["config"])
        print(json.dumps(measure(model, dtype, m, cfg)), flush=True)


if __name__ == "__main__":
    main()
