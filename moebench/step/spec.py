"""Step specs: several models' steps in one command, from a YAML file (one run folder per model).

Top-level keys set the points every model runs; each entry of ``models`` names one model's shard and its MoE
paths. Strict, as sweep specs are: an unknown key is a one-line error naming it. The shipped specs live in
``moebench/step/specs/`` and are found by name (``moebench step h200``). Example::

    name: h200
    prompt: [128, 1024, 4096]
    batch: [1, 8, 64, 256]
    context: 4096
    models:
      - {model: deepseek-v3, tp: 8, dtype: fp8-block128, paths: [triton, triton-classic], vs: triton-classic}
      - {model: mixtral-8x7b, dtype: fp8-tensor, paths: [triton, triton-classic, cutlass], vs: cutlass}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moebench.bounded import read_yaml
from moebench.errors import UserError, short

SPECS_DIR = Path(__file__).resolve().parent / "specs"  # the shipped step specs (package data)
MAX_STACK = 64  # layers of a composition check, as --stack takes them
TOP_KEYS = {
    "name": "run name",
    "description": "free text",
    "prompt": "prefill prompt lengths",
    "prefill_batch": "prompts prefilled together",
    "batch": "decode batch sizes",
    "context": "decode context (tokens in the KV cache)",
    "stack": "layers of the composition check (0: none)",
    "models": "a list of {model | hf_config, tp, dtype, paths, vs}",
}
ENTRY_KEYS = {
    "model": "a preset name",
    "hf_config": "a Hugging Face config.json (relative to the spec)",
    "tp": "tensor-parallel degree",
    "ep": "expert-parallel degree (equal to tp: the experts split over the tensor-parallel group)",
    "dtype": "the MoE layer's dtype",
    "paths": "MoE paths",
    "vs": "the path the others are compared against",
}


@dataclass(frozen=True)
class StepEntry:
    """One model's shard in a spec: a preset (``model``) or a config.json (``hf_config``), and its MoE paths."""

    model: str | None
    hf_config: Path | None
    tp: int
    dtype: str | None
    paths: tuple[str, ...] | None
    vs: str | None
    ep: int = 1


@dataclass(frozen=True)
class StepSpec:
    """What ``moebench step SPEC`` runs: the points (None where the spec leaves them to flags and defaults) and
    one entry per model."""

    name: str
    entries: tuple[StepEntry, ...]
    prompts: tuple[int, ...] | None = None
    prefill_batch: int | None = None
    batches: tuple[int, ...] | None = None
    context: int | None = None
    stack: int | None = None


def find_step_spec(spec: str | Path) -> Path:
    """The spec file ``spec`` names: a path that exists, else a shipped spec of that name."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = SPECS_DIR / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if shipped.is_file():
        return shipped
    known = ", ".join(sorted(p.stem for p in SPECS_DIR.glob("*.yaml")))
    raise UserError(f"no step spec at {short(str(spec))} and none shipped of that name (shipped: {known})")


def _int(value, key: str, low: int = 1, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        within = f">= {low}" if high is None else f"from {low} to {high}"
        raise UserError(f"{key}: {short(value)} is not an integer {within}")
    return value


def _ints(value, key: str) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(sorted({_int(v, key) for v in values}))


def _names(value, key: str) -> tuple[str, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise UserError(f"{key}: {short(value)} is not a list of names")
    return tuple(v.strip() for v in values)


def _entry(i: int, raw, base: Path) -> StepEntry:
    where = f"models[{i}]"
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a mapping of {', '.join(ENTRY_KEYS)}")
    if bad := [k for k in raw if k not in ENTRY_KEYS]:
        raise UserError(f"{where}: unknown key {short(bad[0])}; entry keys: {', '.join(ENTRY_KEYS)}")
    if ("model" in raw) == ("hf_config" in raw):
        raise UserError(f"{where}: give model or hf_config, not both or neither")
    for key in ("model", "hf_config", "dtype", "vs"):
        if key in raw and not (isinstance(raw[key], str) and raw[key].strip()):
            raise UserError(f"{where}.{key}: {short(raw[key])} is not a name")
    return StepEntry(model=raw.get("model"), hf_config=base / raw["hf_config"] if "hf_config" in raw else None,
                     tp=_int(raw.get("tp", 1), f"{where}.tp"), dtype=raw.get("dtype"),
                     paths=_names(raw["paths"], f"{where}.paths") if "paths" in raw else None, vs=raw.get("vs"),
                     ep=_int(raw.get("ep", 1), f"{where}.ep"))


def load_step_spec(path: str | Path) -> StepSpec:
    """Read a YAML step spec; every error is one line that names the file."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a step spec is a mapping of keys ({', '.join(TOP_KEYS)})")
    try:
        if bad := [k for k in data if k not in TOP_KEYS]:
            raise UserError(f"unknown key {short(bad[0])}; known keys: {', '.join(TOP_KEYS)}")
        models = data.get("models")
        if not isinstance(models, list) or not models:
            raise UserError("models: a non-empty list of {model | hf_config, tp, dtype, paths, vs}")
        opt = {k: data[k] for k in TOP_KEYS if k in data}
        return StepSpec(
            name=str(data.get("name") or path.stem),
            entries=tuple(_entry(i, m, path.parent) for i, m in enumerate(models)),
            prompts=_ints(opt["prompt"], "prompt") if "prompt" in opt else None,
            prefill_batch=_int(opt["prefill_batch"], "prefill_batch") if "prefill_batch" in opt else None,
            batches=_ints(opt["batch"], "batch") if "batch" in opt else None,
            context=_int(opt["context"], "context") if "context" in opt else None,
            stack=_int(opt["stack"], "stack", low=0, high=MAX_STACK) if "stack" in opt else None,
        )
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
