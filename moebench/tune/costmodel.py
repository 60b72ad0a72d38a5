"""A cost model that ranks tile configs of one problem before any is compiled, so few need compiling.

It estimates each of the two grouped GEMMs from the tile shape alone:
- work: routed slots per expert are binomial under uniform routing, so the expected row tiles and padded
  rows follow from BLOCK_SIZE_M; the programs are row tiles x column tiles;
- memory: each touched expert's weights are read once, again per extra row tile where GROUP_SIZE_M = 1
  visits its row tiles apart; achieved bandwidth is capped by the bytes in flight (Little's law): programs
  running at once x the stages of operand tiles each keeps in flight, over the DRAM latency;
- compute: padded rows x columns x K at the tensor cores' rate, lowered for tiles under the 64-row wgmma
  height, over the share of SMs the grid fills;
- waves: programs past a full wave wait for one.
The estimate is the larger of memory and compute time per GEMM, summed. It only orders configs, and
coarsely: it ranks configs of one tile shape better than it ranks shapes, so the fast strategy seeds from
every tile shape and lets measurements decide (``strategies/fast.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from moebench.space.prune import Facts
from moebench.tile import TileConfig


@dataclass(frozen=True)
class Machine:
    """The few device figures the model reads (an H200's, by default)."""

    sms: int = 132
    dram_gbps: float = 4300.0
    tflops_16: float = 700.0  # dense bf16/fp16 tensor-core rate
    tflops_8: float = 1300.0  # dense fp8 rate
    latency_us: float = 1.2  # DRAM round trip seen by a pipelined load
    regs_per_sm: int = 65536


H200 = Machine()


@lru_cache(maxsize=4096)
def _tiles_per_expert(slots: int, experts: int, block_m: int) -> tuple[float, float]:
    """(E[ceil(X / block_m)], P[X > 0]) for X ~ Binomial(slots, 1 / experts): an expert's row tiles."""
    p = 1.0 / experts
    if slots == 0:
        return 0.0, 0.0
    mean = slots * p
    hi = min(slots, int(mean + 8 * math.sqrt(mean * (1 - p)) + 8))
    log_q = math.log1p(-p) if p < 1 else -math.inf
    expected, pmf_sum = 0.0, 0.0
    for x in range(1, hi + 1):
        log_pmf = (math.lgamma(slots + 1) - math.lgamma(x + 1) - math.lgamma(slots - x + 1)
                   + x * math.log(p) + (slots - x) * log_q) if p < 1 else (0.0 if x == slots else -math.inf)
        pmf = math.exp(log_pmf)
        expected += pmf * -(-x // block_m)
        pmf_sum += pmf
    return expected, pmf_sum


def _gemm_us(cfg: TileConfig, f: Facts, n: int, k: int, rows_per_slot: int, m: Machine) -> float:
    """One grouped GEMM of ``n`` output columns over ``k``, its A rows the slots."""
    tiles_e, touched_p = _tiles_per_expert(f.slots, f.experts, cfg.BLOCK_SIZE_M)
    row_tiles = f.experts * tiles_e
    touched = f.experts * touched_p
    col_tiles = -(-n // cfg.BLOCK_SIZE_N)
    programs = row_tiles * col_tiles
    # Memory: weights once per touched expert, again per extra row tile where grouping does not pair them.
    extra = max(0.0, tiles_e / max(touched_p, 1e-9) - 1) * (1.0 if cfg.GROUP_SIZE_M == 1 else 0.1)
    weight_bytes = touched * n * k * f.operand_bytes * (1 + extra)
    act_bytes = f.slots * rows_per_slot * k * f.operand_bytes + f.slots * n * 2
    # Bytes in flight: each running program keeps (stages - 1) steps of its A and B tiles loading.
    per_stage = (cfg.BLOCK_SIZE_M + cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * f.operand_bytes
    smem_fit = max(1, f.smem_bytes // max(1, per_stage * cfg.num_stages))
    regs = cfg.BLOCK_SIZE_M * cfg.BLOCK_SIZE_N // (32 * cfg.num_warps) + 64  # accumulators + the rest
    reg_fit = max(1, m.regs_per_sm // (regs * 32 * cfg.num_warps))
    per_sm = min(smem_fit, reg_fit, 4)
    running = min(programs, m.sms * per_sm)
    in_flight = running * max(1, cfg.num_stages - 1) * per_stage
    gbps = min(m.dram_gbps, in_flight / (m.latency_us * 1e-6) / 1e9)
    mem_us = (weight_bytes + act_bytes) / (gbps * 1e3)
    # Compute: padded rows at the tensor-core rate, lower under the 64-row wgmma height and on idle SMs.
    tflops = m.tflops_8 if f.operand_bytes == 1 else m.tflops_16
    height = min(1.0, cfg.BLOCK_SIZE_M / (16 * cfg.num_warps))
    busy_sms = min(1.0, running / m.sms)
    flops = 2.0 * row_tiles * cfg.BLOCK_SIZE_M * col_tiles * cfg.BLOCK_SIZE_N * k
    compute_us = flops / (tflops * 1e6 * height * max(busy_sms, 1e-3))
    waves = math.ceil(programs / max(1, m.sms * per_sm))
    tail = waves / max(programs / (m.sms * per_sm), 1e-9) if programs else 1.0
    return max(mem_us, compute_us) * min(tail, 2.0)


def estimate_us(cfg: TileConfig, f: Facts, m: Machine = H200) -> float:
    """The model's time for both GEMMs of ``f``'s problem at ``cfg`` (microseconds; for ranking only)."""
    gemm1 = _gemm_us(cfg, f, 2 * f.intermediate, f.hidden, 1, m)  # gate and up columns
    gemm2 = _gemm_us(cfg, f, f.hidden, f.intermediate, 1, m)
    return gemm1 + gemm2


def rank(configs: list[TileConfig], f: Facts, m: Machine = H200) -> list[TileConfig]:
    """``configs`` fastest first by the model (ties in the given order)."""
    return sorted(configs, key=lambda c: estimate_us(c, f, m))
