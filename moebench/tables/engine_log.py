"""An engine's "config file not found" warning read back: which engine, which file, and what the file name says.

log line -> the file name(s) and folders in it -> engine (vLLM or SGLang), E, N, device, dtype, block shape
-> the presets whose sharded shape has that E and N (the flags ``moebench tune`` needs).

vLLM warns "Using default MoE config. Performance might be sub-optimal! Config file not found at <paths>" (one
path, several joined by ", ", or a Python list, by version) and says "Using configuration from <path> for MoE
layer." where it read one; SGLang "Using default MoE kernel config. ... Config file not found at
<dir>/configs/triton_<x_y_z>/<name>, you can create them with ...", and where it read another Triton's folder
"Config file not found at <path>. Fallback to triton version <v> and use MoE kernel config from <path>": the first
path's folder is the server's Triton, the second the file read (``used``). The names follow
``formats/vllm.py`` and ``formats/sglang.py``: SGLang writes a block shape with a space, may add
``,per_channel_quant=True`` or ``_down``, and keeps its files under a ``triton_<x_y_z>`` folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moebench.errors import UserError

_NAME = re.compile(
    r"(?P<dir>[^\s'\"\[\],]*[/\\])?"
    r"(?P<name>E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,/\\'\"\s]+?)"
    r"(?:,dtype=(?P<dtype>\w+?))?(?:,block_shape=\[(?P<bn>\d+),(?P<space> ?)(?P<bk>\d+)\])?"
    r"(?P<channel>,per_channel_quant=True)?(?P<down>_down)?\.json)"
)
_TRITON_DIR = re.compile(r"triton_(\d+)_(\d+)_(\d+)$")
# moebench's dtype of each engine dtype name and block shape; the other names moebench does not tune.
_FP8_BLOCKS = {(128, 128): "fp8-block128"}


@dataclass(frozen=True)
class LoggedFile:
    """What a warning line names: the engine (None where the line does not say), the file name, the folders it
    was looked for in, and the name's fields; ``dtype`` is moebench's name (None where moebench tunes no such
    file) and ``why`` says how it was read."""

    engine: str | None
    name: str
    dirs: tuple[str, ...]
    experts: int
    n: int
    device_name: str
    engine_dtype: str | None  # as the name spells it: None, "float32", "fp8_w8a8", "int8_w8a16", ...
    block_shape: tuple[int, int] | None
    per_channel: bool
    down: bool
    dtype: str | None
    why: str
    engine_triton: str | None = None  # SGLang: the release its folder names
    used: str | None = None  # the file the line says the engine read (vLLM's "Using configuration from", SGLang's
    # fallback), None where it says none was


def parse_log(text: str) -> LoggedFile:
    """The file an engine's warning line (or a bare file name or path) names; a line naming none is a UserError."""
    matches = list(_NAME.finditer(text))
    if not matches:
        raise UserError("--from-log: no config file name (E=...,N=...,device_name=....json) in the text")
    first = matches[0]
    names = {m.group("name") for m in matches}
    if len(names) > 1:
        raise UserError(f"--from-log names {len(names)} different files: give one line")
    dirs = tuple(dict.fromkeys(m.group("dir").rstrip("/\\") for m in matches if m.group("dir")))
    block = (int(first.group("bn")), int(first.group("bk"))) if first.group("bn") else None
    channel, down = bool(first.group("channel")), bool(first.group("down"))
    engine_triton = None
    for d in dirs[:1]:  # the folder first named is the server's; a fallback line names the folder read second
        if t := _TRITON_DIR.search(d):
            engine_triton = ".".join(t.groups())
    fallback = "Fallback to triton version" in text or "use MoE kernel config from" in text
    vllm_used = "for MoE layer" in text and "Using configuration from" in text
    used = None
    if fallback and len(matches) > 1:
        used = matches[-1].group(0)
    elif vllm_used:
        used = first.group(0)
    sglang = ("MoE kernel config" in text or engine_triton is not None or channel or down or fallback
              or bool(first.group("space")))
    engine = "sglang" if sglang else ("vllm" if "Using default MoE config" in text or block or vllm_used else None)
    dtype, why = _dtype(first.group("dtype"), block, channel, engine)
    return LoggedFile(engine, first.group("name"), dirs, int(first.group("E")), int(first.group("N")),
                      first.group("device").replace("_", " "), first.group("dtype"), block, channel, down, dtype,
                      why, engine_triton, used)


def _dtype(engine_dtype: str | None, block: tuple[int, int] | None, channel: bool,
           engine: str | None) -> tuple[str | None, str]:
    """(moebench dtype, how it was read) of a file name's dtype part."""
    if engine_dtype is None:
        return "bf16", "no dtype in the name: bf16 or fp16, one file for both"
    if engine_dtype == "float32":
        return "fp32", "dtype=float32: float32 activations"
    if engine_dtype != "fp8_w8a8":
        return None, f"dtype={engine_dtype}: moebench tunes bf16, fp16, fp32 and fp8_w8a8"
    if block is not None:
        if block not in _FP8_BLOCKS:
            return None, f"fp8 blocks of {block[0]}x{block[1]}: moebench tunes 128x128 blocks only"
        return _FP8_BLOCKS[block], "fp8_w8a8 with 128x128 weight blocks"
    if channel:
        return "fp8-channel", "fp8_w8a8 per channel (SGLang's per_channel_quant)"
    if engine == "sglang":
        return "fp8-tensor", "fp8_w8a8 per tensor (SGLang names per-channel files apart)"
    return "fp8-tensor", "fp8_w8a8: per tensor or per channel (vLLM names both alike; --dtype chooses)"


def presets_for(experts: int, n: int, degrees: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[tuple[str, int, int]]:
    """(preset, tp, ep) of every preset whose shard at those degrees has ``experts`` local experts and per-GPU
    intermediate size ``n``; one line each, no expert parallelism first, then the smallest TP."""
    from moebench.models import PRESETS

    found = []
    for ep in degrees:
        for tp in degrees:
            for name, s in PRESETS.items():
                if s.experts % ep == 0 and s.intermediate % tp == 0 and \
                        (s.experts // ep, s.intermediate // tp) == (experts, n):
                    found.append((name, tp, ep))
    return found


def fused_presets_for(experts: int, n: int, degrees: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[tuple[str, int]]:
    """(preset, tp) of every preset whose shard has ``experts`` - 1 routed experts and per-GPU intermediate size
    ``n`` and whose shared expert SGLang serves in the routed layer (``tables.fusion``): E=257,N=256 is
    DeepSeek-V3 at TP8 under SGLang."""
    from moebench.models import PRESETS
    from moebench.tables.fusion import ROUTED

    return [(name, tp) for tp in degrees for name, s in PRESETS.items()
            if s.shared_experts == 1 and s.experts in ROUTED and s.intermediate % tp == 0
            and (s.experts + 1, s.intermediate // tp) == (experts, n)]
