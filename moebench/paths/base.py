"""The interface every implementation of the whole MoE layer follows.

A path is one small object: it says which problems it can run (``supports``
returns the reason when it cannot) and turns inputs into a closure that
writes the layer output into a given tensor. The closure must not
synchronize with the host when ``graph_safe`` is true: the timer captures it
in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from moebench.problem import MoEInputs, Problem
from moebench.tile import TileConfig

RunFn = Callable[[torch.Tensor], None]  # writes out [M, hidden]


@dataclass(frozen=True)
class Target:
    """Where a path would run: the device, and what matters about it."""

    device: torch.device
    interpreter: bool  # Triton kernels run on the CPU interpreter
    capability: tuple[int, int] | None  # CUDA compute capability, None on CPU

    @classmethod
    def current(cls) -> Target:
        from moebench._interpret import interpreting

        if torch.cuda.is_available():
            return cls(torch.device("cuda"), interpreting(), torch.cuda.get_device_capability())
        return cls(torch.device("cpu"), True, None)

    @property
    def is_sm90(self) -> bool:
        return self.capability == (9, 0)


class MoEPath(Protocol):
    name: str
    baseline: bool  # the path others are compared against
    tunable: bool  # takes a TileConfig
    graph_safe: bool  # the closure can be captured in a CUDA graph

    def supports(self, problem: Problem, target: Target) -> str | None:
        """None if the path can run ``problem`` on ``target``, else the reason it cannot."""

    def prepare(self, inputs: MoEInputs, problem: Problem, config: TileConfig | None) -> RunFn:
        """Do untimed set-up (layouts, scales) and return the closure that is checked, then timed."""

    def default_config(self, problem: Problem) -> TileConfig:
        """The untuned tile config (tunable paths only)."""


def no_expert_map(problem: Problem, what: str) -> str | None:
    """Why a path that takes no expert_map (``what`` names it) cannot run ``problem``, or None."""
    if problem.shape.mapped:
        return (f"{what} takes no expert_map: an EP layer with global top-k ids over {problem.shape.routed_experts} "
                "experts (sweep --ep-map) runs on the triton and torch paths")
    return None


def triton_supports(problem: Problem, target: Target) -> str | None:
    """Why moebench's Triton kernels (either form) cannot run ``problem`` on ``target``, or None."""
    if problem.dtype == "bf16" and target.interpreter:
        return "the Triton interpreter computes bf16 tl.dot wrongly; use fp16 or fp32 on the CPU"
    if target.device.type != "cuda" and not target.interpreter:
        return "Triton kernels need a CUDA GPU or the interpreter (TRITON_INTERPRET=1)"
    if problem.spec.is_fp8 and target.capability is not None and target.capability < (8, 9):
        return "fp8 tensor cores need sm89 or newer"
    return None
