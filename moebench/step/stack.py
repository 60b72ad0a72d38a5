"""The model's layers built once (``Model``: N MoE layers, one dense MLP, the head), and the composition check: the
N layers chained as the model runs them, one closure timed whole, against the sum of its parts timed alone.

    h [M, hidden] -> per layer: h += attention(h); router(h) -> normed, top-k; h += moe(normed) (+ shared(normed))

Layer 0's parts are the ones timed alone; every layer has its own weights, so none finds another's in L2. The
stack adds what the parts leave out: the residual adds and the copy of its input (a few [M, hidden] passes).
"""

from __future__ import annotations

import torch

from moebench.step.config import StepConfig, StepPoint
from moebench.step.parts import MLP, Attention, Head, MoE, Router, Tiles


class Model:
    """``layers`` MoE layers (attention, router, MoE weights, shared expert), a dense MLP where the model has dense
    layers, and the head: every weight a step point needs, built once."""

    def __init__(self, cfg: StepConfig, dtype: str, device: torch.device, seed: int, layers: int = 1):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.layers = [self._layer(i, seed) for i in range(max(1, layers))]
        self.dense = MLP(cfg, dtype, device, seed, False) if cfg.dense_layers else None
        self.head = Head(cfg, dtype, device, seed)

    def _layer(self, i: int, seed: int) -> tuple:
        cfg, dtype, device = self.cfg, self.dtype, self.device
        shared = MLP(cfg, dtype, device, seed, True, i) if cfg.shared_intermediate else None
        return (Attention(cfg, dtype, device, seed, i), Router(cfg, dtype, device, seed, i),
                MoE(cfg, dtype, device, seed, i), shared)

    def stack(self, point: StepPoint, path_name: str, tiles: Tiles | None = None):
        """The closure running every layer at ``point`` with the MoE layer through ``path_name``, whether it is
        graph-safe, and its output h [tokens, hidden]."""
        first = self.layers[0][0]
        x0 = first.activations(point, None)  # [tokens, hidden]: the stack's input, copied in at each run
        h = x0.clone()
        steps, graph_safe = [], True
        for attn, router, moe, shared in self.layers:
            a = attn.prepare(point, h)
            r = router.prepare(point, h)
            a.run()  # the router's outputs hold real routing before the MoE layer is prepared on them
            r.run()
            m = moe.prepare(point, path_name, moe.inputs(point, r.extra), None, tiles)
            s = shared.prepare(point, r.extra["normed"]) if shared is not None else None
            graph_safe = graph_safe and m.graph_safe
            steps.append((a, r, m, s))

        def run() -> None:
            h.copy_(x0)
            for a, r, m, s in steps:
                a.run()
                h.add_(a.out)
                r.run()
                m.run()
                if s is not None:
                    s.run()
                    h.add_(s.out)
                h.add_(m.out)

        return run, graph_safe, h
