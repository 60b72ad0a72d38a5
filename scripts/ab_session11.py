"""A/B on a GPU, each benchmark point at its best config of the runs the report of docs/kernels.md reads:

- ``out``: the atomic top-k sum added straight into the bf16 output (``atomic_out``: no float32 buffer,
  its zero fill and cast launch, half the bytes reduced in L2), whatever the best config's sum form;
- ``walk2``, ``walk4``: GEMM2 programs walking 2 or 4 column tiles (``gemm2_n_tiles``) where GEMM2 has
  3 to 8 K steps (the tuner tries walks only up to two) and the best config walks none;
- with ``--split2``, at the points where the tuner would split GEMM2 (``tuning.gemm2_split_for``) at the
  best config, only: ``split2`` GEMM2 split-K with the float32 atomic sum, ``split2_out`` with the sum
  into the output, ``atomic`` and ``out`` the two atomic forms without split.

Each variant checked against the float32 reference first (``*_err``), timed twice interleaved (CUDA-graph
replay, L2 flushed, median us), the faster kept.

    PYTHONPATH=$PWD python3 scripts/ab_session11.py [--split2] [MIN_M [MAX_M]] > rows.jsonl
"""

import json
import sys
from dataclasses import replace

from _points import best_rows, check_then_time, m_range, prefill_first

import moebench.kernels.fused_moe as kernels
from moebench.tuning import gemm2_split_for

SPLIT2 = "--split2" in sys.argv[1:]
args = [a for a in sys.argv[1:] if a != "--split2"]
C = "results/h200-kernels-93e00f1/"
best = best_rows("results/h200-kernels-6be41bd", "results/h200-kernels-6be41bd-ds4096",
                 "results/h200-kernels-1fd6e45/*-*", "results/h200-kernels-1694d9e/*-*",
                 "results/h200-kernels-b7f19ac/*-*", C + "qwen3-fp8-block128-m1024",
                 C + "deepseek-v3-tp8-fp8-block128-m1024", C + "mixtral-fp8-tensor-m4096")
for cfg, problem, inp, ref, out, row in prefill_first(best, *m_range(args)):
    if SPLIT2:
        atomic = replace(cfg, atomic_sum=True, gemm2_n_tiles=1)
        split = gemm2_split_for(problem, atomic)
        if split == 1:
            continue
        row["split"] = split
        variants = {"base": (kernels, cfg), "atomic": (kernels, atomic),
                    "out": (kernels, replace(atomic, atomic_out=True)),
                    "split2": (kernels, replace(atomic, gemm2_split_k=split)),
                    "split2_out": (kernels, replace(atomic, gemm2_split_k=split, atomic_out=True))}
        print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
        continue
    variants = {"base": (kernels, cfg), "out": (kernels, replace(cfg, atomic_sum=True, atomic_out=True))}
    k_steps = -(-problem.shape.intermediate // cfg.BLOCK_SIZE_K)
    if cfg.gemm2_n_tiles == 1 and 3 <= k_steps <= 8:
        for walk in (2, 4):
            variants[f"walk{walk}"] = (kernels, replace(cfg, gemm2_n_tiles=walk))
    print(json.dumps(check_then_time(row, variants, inp, out, ref, problem.spec.rtol)), flush=True)
