"""How many of each part one step of a model runs, and the all-reduces of tensor parallelism, modelled from a bus
bandwidth (never measured: their rows say so, ``measured`` False, and the step keeps them in their own column).

    allreduce_us = 2 x layers x (latency + 2 (tp - 1) / tp x tokens x hidden x bytes / bus bandwidth)

``report.compose`` sums a step's rows with these counts.
"""

from __future__ import annotations

from moebench.step.config import StepConfig, StepPoint
from moebench.store.step_rows import blank_row

# ring all-reduce's bus bandwidth on NVLink 4 (8x H100/H200 SXM, nccl-tests all_reduce_perf at large messages:
# 460-480 GB/s; NVLink 4 carries 450 GB/s a direction): see docs/step.md
DEFAULT_ALLREDUCE_GBPS = 450.0
ALLREDUCES_PER_LAYER = 2  # after the attention's output projection and after the MLP / MoE layer (row-parallel)


def part_counts(cfg: StepConfig) -> dict[str, int]:
    """How many of each part one step of the model runs (0: the model has none)."""
    moe = cfg.moe.moe_layers
    return {"attention": cfg.layers, "router": moe, "moe": moe, "shared": moe if cfg.shared_intermediate else 0,
            "dense_mlp": cfg.dense_layers, "head": 1, "allreduce": ALLREDUCES_PER_LAYER * cfg.layers if cfg.tp > 1
            else 0}


def allreduce_us(tokens: int, hidden: int, act_bytes: int, tp: int, gbps: float, latency_us: float = 0.0) -> float:
    """One all-reduce of [tokens, hidden] over ``tp`` GPUs: ``latency_us`` plus a ring's 2 (tp - 1) / tp of the
    bytes at the bus bandwidth ``gbps`` (GB/s, as nccl-tests reports busbw); 0 without tensor parallelism."""
    if tp == 1:
        return 0.0
    return latency_us + 2 * (tp - 1) / tp * tokens * hidden * act_bytes / (gbps * 1e9) * 1e6


def allreduce_row(cfg: StepConfig, point: StepPoint, model: str, dtype: str, act_bytes: int, gbps: float,
                  latency_us: float) -> dict:
    """The modelled all-reduce of one point, as a row (``measured`` False, ``count`` all-reduces per step)."""
    note = (f"modelled: ring all-reduce, {gbps:g} GB/s bus bandwidth, {latency_us:g} us latency each, "
            f"{ALLREDUCES_PER_LAYER} per layer")
    return blank_row(model=model, dtype=dtype, phase=point.phase, batch=point.batch, length=point.length,
                     tokens=point.tokens, part="allreduce", count=part_counts(cfg)["allreduce"], measured=False,
                     status="ok", time_us=allreduce_us(point.tokens, cfg.hidden, act_bytes, cfg.tp, gbps, latency_us),
                     bytes=point.tokens * cfg.hidden * act_bytes, note=note)
