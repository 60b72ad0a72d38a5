"""SGLang's shared-expert fusion: whether its server runs a model's shared expert inside the routed MoE layer, and
the kernel shape it then looks up.

(shape before sharding, --ep, device, an override) -> ``sglang_fuses`` (yes, or the reason not) -> the layer's
experts and top-k as SGLang's kernel sees them (``models.fuse_shared``).

SGLang serves DeepSeek-V3/R1 and Kimi-K2 (one shared expert beside 256 or 384 routed ones) with the shared
expert appended to the routed experts where it runs without expert parallelism on an NVIDIA GPU of compute
capability 8.0 or more, unless the server is started with ``--disable-shared-experts-fusion``: the layer then has
E+1 experts and top-k+1, every token routed to the shared one, and SGLang looks up ``E=257,N=256,...`` for
DeepSeek-V3 at TP8 (``E=385`` for Kimi-K2). vLLM runs the shared expert beside the kernel: its file keeps E.
Nothing here loads torch.
"""

from __future__ import annotations

from moebench.models import MoEShape

ROUTED = (256, 384)  # DeepSeek-V3/R1 and Kimi-K2's routed experts: the models SGLang fuses
OVERRIDE = "--disable-shared-experts-fusion"  # SGLang's server flag, and doctor's, for a server run without it
# NVIDIA GPUs below compute capability 8.0, as parts of torch's device names (Volta, Turing, Pascal, Kepler)
_BEFORE_SM80 = ("V100", "T4", "P100", "P40", "P4", "K80", "TITAN V", "TITAN RTX", "RTX 20", "GTX", "Quadro RTX")


def sglang_fuses(shape: MoEShape, ep: int, device_name: str, disabled: bool = False) -> tuple[bool, str]:
    """(whether SGLang fuses ``shape``'s shared expert into the routed layer, why) for a server at expert
    parallelism ``ep`` on ``device_name``; ``disabled``: the server runs with ``--disable-shared-experts-fusion``."""
    if shape.shared_experts != 1 or shape.experts * max(ep, 1) not in ROUTED or shape.mapped:
        return False, ""
    if disabled:
        return False, f"the server runs with {OVERRIDE}: E={shape.experts}"
    if ep > 1:
        return False, "under expert parallelism SGLang keeps the shared expert out of the routed layer"
    name = f" {device_name.replace('_', ' ')} "
    if any(f" {part}" in name for part in _BEFORE_SM80):
        return False, f"{device_name} is below compute capability 8.0: SGLang does not fuse the shared expert there"
    return True, (f"SGLang serves the shared expert inside the routed layer: E={shape.experts}+1, top-{shape.topk}+1 "
                  f"({OVERRIDE} where the server runs without it)")
