"""SGLang's tuned fused-MoE config files: vLLM's pattern, its own spelling and folder.

What SGLang does (``python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``, earlier
``layers/moe/fused_moe_triton/fused_moe_triton_config.py``): vLLM's file name pattern, but the block shape
formatted as a Python list (``[128, 128]``, with the space), no renaming of H200 variants, and
``,per_channel_quant=True`` for per-channel fp8. It reads ``<dir>/configs/triton_<x_y_z>/<name>``, ``<dir>`` being
``$SGLANG_MOE_CONFIG_DIR`` or its package folder and ``x_y_z`` the serving ``triton.__version__`` with dots
replaced by underscores. Missing that file, it lists ``<dir>/configs/`` (an error where that folder does not
exist), reads every ``triton_*`` name there as dot-separated integers, and takes the newest other version holding
the file, with a warning. It turns every key into an int, dropping nothing: a ``"triton_version"`` entry would
fail there, so these files carry none. The key nearest M is read (``ConfigTable.nearest``).
"""

from __future__ import annotations

import re
from pathlib import Path

from moebench.errors import UserError
from moebench.tables.table import ENGINE_PATH, ConfigTable, Provenance

READER = "SGLang"  # who reads these files, for messages
PATH = ENGINE_PATH  # the path whose rows pick the configs
ENV_VAR = "SGLANG_MOE_CONFIG_DIR"  # SGLang reads $SGLANG_MOE_CONFIG_DIR/configs/triton_<x_y_z>/
# The Triton release naming the folder where none is given: SGLang 0.5.23 runs Triton 3.8, and
# triton.__version__ prints releases as X.Y.Z.
ENGINE_TRITON = "3.8.0"
HINT = "tune with `moebench tune --path triton-classic`; moebench's own kernel's tables: --layout moebench"
_BLOCK_SHAPES = {"block128": [128, 128]}  # fp8 scheme -> [block_n, block_k]


def triton_dir(engine_triton: str) -> str:
    """SGLang's folder for the Triton version its server runs: ``triton_<x_y_z>``.

    The version must read as SGLang reads folder names back (dot-separated integers, as
    ``triton.__version__`` prints a release): a name like ``triton_3_8_0+git1`` would make
    SGLang's fallback scan of ``configs/`` fail.
    """
    if not re.fullmatch(r"\d+\.\d+\.\d+", engine_triton or ""):
        raise UserError(f"--engine-triton {engine_triton!r}: give the serving engine's Triton release as X.Y.Z "
                        f"(e.g. {ENGINE_TRITON})")
    return f"triton_{engine_triton.replace('.', '_')}"


def folder(out_dir: Path, engine_triton: str | None) -> Path:
    """Where under the export's folder (``$SGLANG_MOE_CONFIG_DIR``) the files go: ``configs/triton_<x_y_z>`` of
    ``engine_triton``, the Triton the SGLang server runs. A version SGLang cannot read back is a UserError."""
    return Path(out_dir) / "configs" / triton_dir(engine_triton)


def file_name(experts: int, n: int, device_name: str, dtype: str) -> str:
    """The file name SGLang looks up for E local experts, per-GPU intermediate size N, a device and a dtype."""
    from moebench.dtypes import get_dtype  # loads torch: not at import, so `--help` stays light

    spec = get_dtype(dtype)
    selector = ",dtype=fp8_w8a8" if spec.is_fp8 else spec.vllm_suffix
    block = _BLOCK_SHAPES.get(spec.fp8_scheme or "")
    if block is not None:
        selector += f",block_shape={block}"  # as Python prints a list: "[128, 128]"
    if spec.fp8_scheme == "channel":
        selector += ",per_channel_quant=True"
    return f"E={experts},N={n},device_name={device_name.replace(' ', '_')}{selector}.json"


def file_text(key: tuple, table: ConfigTable, shape: dict, made: Provenance) -> str:
    """The file's text, with no ``"triton_version"`` entry (SGLang would read it as a token count)."""
    return table.to_json()
