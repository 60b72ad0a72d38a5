"""vLLM's tuned fused-MoE config files: one ``ConfigTable`` per file, six tile keys per M.

What vLLM does (``vllm/model_executor/layers/fused_moe/fused_moe.py``: ``get_config_file_name``,
``get_moe_configs``, ``try_get_optimal_moe_config``): it looks for
``E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[bn,bk]].json``, with ``E, _, N = w2.shape``
(local experts, per-GPU intermediate size), ``device = get_device_name().replace(" ", "_")`` and any device whose
name has an ``H200`` part mapped to ``NVIDIA_H200``; the block shape is written without spaces (``[128,128]``);
fp8 is ``dtype=fp8_w8a8`` and float32 activations ``dtype=float32``. It reads the file from
``$VLLM_TUNED_CONFIG_FOLDER`` or its own ``configs/`` folder, drops a top-level ``"triton_version"`` entry, and
picks the key nearest M (``ConfigTable.nearest``). The configs come from the engines' kernel form (``PATH``).
"""

from __future__ import annotations

from pathlib import Path

from moebench.tables.table import ENGINE_PATH, ConfigTable, Provenance

READER = "vLLM"  # who reads these files, for messages
PATH = ENGINE_PATH  # the path whose rows pick the configs
ENV_VAR = "VLLM_TUNED_CONFIG_FOLDER"  # the folder vLLM reads tuned files from: the export's OUT
ENGINE_TRITON = None  # the folder does not depend on the serving engine's Triton
HINT = "tune with `moebench tune --path triton-classic`; moebench's own kernel's tables: --layout moebench"


def folder(out_dir: Path, engine_triton: str | None) -> Path:
    """Where under the export's folder the files go: the folder itself (``$VLLM_TUNED_CONFIG_FOLDER``)."""
    return Path(out_dir)


def file_name(experts: int, n: int, device_name: str, dtype: str) -> str:
    """The file name vLLM looks up for E local experts, per-GPU intermediate size N, a device and a dtype.

    ``device_name`` is ``torch.cuda.get_device_name()`` as recorded in the rows (e.g. "NVIDIA H200");
    ``dtype`` a moebench dtype name (an unknown one is a UserError).
    """
    from moebench.dtypes import get_dtype  # loads torch: not at import, so `--help` stays light

    device = device_name.replace(" ", "_")
    if "H200" in device.split("_"):
        device = "NVIDIA_H200"  # vLLM folds the H200 family (e.g. "NVIDIA H200 NVL") into one name
    return f"E={experts},N={n},device_name={device}{get_dtype(dtype).vllm_suffix}.json"


def file_text(key: tuple, table: ConfigTable, shape: dict, made: Provenance) -> str:
    """The file's text, ending in the ``"triton_version"`` the run was timed with (as vLLM's tuner writes it;
    vLLM drops it when reading)."""
    return table.to_json(made.triton_version)
