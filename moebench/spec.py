"""Sweep specs: what to run, from a YAML file in sweeps/ or from CLI flags.

A spec names model shapes, token counts, dtypes and paths; ``SweepSpec.points``
expands it to the plan (problem x path). YAML specs are strict: an unknown key
is an error that names it. Example (sweeps/quick.yaml)::

    name: quick
    models: [mixtral-8x7b, deepseek-v3]
    m: [1, 16, 128, 1024, 4096]
    dtypes: [bf16]
    paths: [triton, cutlass]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from moebench.dtypes import get_dtype
from moebench.errors import UserError
from moebench.models import MoEShape, from_hf_config, get_model, shard
from moebench.paths import get_path
from moebench.problem import Problem
from moebench.routing import ROUTINGS

# key -> what it holds (the strict schema, also shown in errors)
SPEC_KEYS = {
    "name": "run name (folder suffix)",
    "description": "free text",
    "models": "preset names",
    "hf_configs": "paths to Hugging Face config.json files (relative to the spec)",
    "shapes": "explicit shapes: {name, experts, hidden, intermediate, topk[, moe_layers]}",
    "m": "token counts",
    "topk": "override the models' top-k (int or list)",
    "dtypes": "dtype names",
    "paths": "path names",
    "routing": "uniform or skewed",
    "seed": "int",
    "tp": "tensor-parallel degree (divides intermediate)",
    "ep": "expert-parallel degree (divides experts)",
}
SHAPE_KEYS = ("name", "experts", "hidden", "intermediate", "topk", "moe_layers")


@dataclass(frozen=True)
class SweepSpec:
    name: str
    shapes: tuple[MoEShape, ...]
    ms: tuple[int, ...]
    dtypes: tuple[str, ...]
    paths: tuple[str, ...]
    routing: str = "uniform"
    seed: int = 0

    def __post_init__(self) -> None:
        for field, value in (("models/shapes", self.shapes), ("m", self.ms), ("dtypes", self.dtypes),
                             ("paths", self.paths)):
            if not value:
                raise UserError(f"sweep '{self.name}': {field} is empty")
        for m in self.ms:
            if m <= 0:
                raise UserError(f"sweep '{self.name}': M must be positive, got {m}")
        for d in self.dtypes:
            get_dtype(d)
        for p in self.paths:
            get_path(p)
        if self.routing not in ROUTINGS:
            raise UserError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTINGS)}")

    def points(self) -> list[tuple[Problem, str]]:
        """The plan, grouped so one (shape, dtype) shares its weights: shape, dtype, M, path."""
        return [
            (Problem(shape, m, dtype, self.routing, self.seed), path)
            for shape in self.shapes
            for dtype in self.dtypes
            for m in self.ms
            for path in self.paths
        ]


def _int_list(value, what: str) -> tuple[int, ...]:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    out = []
    for v in value or []:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise UserError(f"{what}: {part!r} is not an integer") from None
    return tuple(out)


def _str_list(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    return tuple(p.strip() for v in value or [] for p in str(v).split(",") if p.strip())


def _with_topk(shapes: list[MoEShape], topks: tuple[int, ...]) -> list[MoEShape]:
    if not topks:
        return shapes
    out = []
    for s in shapes:
        for k in topks:
            if k <= 0 or k > s.experts:
                raise UserError(f"{s.name}: top-k {k} impossible with {s.experts} experts")
            out.append(s if k == s.topk else replace(s, topk=k, name=f"{s.name}-top{k}"))
    return out


def build_spec(
    name: str,
    models: tuple[str, ...] = (),
    hf_configs: tuple[str | Path, ...] = (),
    shapes: tuple[MoEShape, ...] = (),
    ms: tuple[int, ...] = (),
    topks: tuple[int, ...] = (),
    dtypes: tuple[str, ...] = ("bf16",),
    paths: tuple[str, ...] = ("triton", "cutlass"),
    routing: str = "uniform",
    seed: int = 0,
    tp: int = 1,
    ep: int = 1,
) -> SweepSpec:
    base = [get_model(m) for m in models] + [from_hf_config(p) for p in hf_configs] + list(shapes)
    if not base:
        raise UserError("nothing to sweep: give a spec file, --model, --hf-config or an explicit shape")
    sharded = [shard(s, tp=tp, ep=ep) for s in base]
    return SweepSpec(name, tuple(_with_topk(sharded, topks)), tuple(ms), tuple(dtypes), tuple(paths),
                     routing, seed)


def explicit_shape(experts: int, hidden: int, intermediate: int, topk: int, name: str | None = None,
                   moe_layers: int = 1) -> MoEShape:
    return MoEShape(name or f"custom-e{experts}-h{hidden}-i{intermediate}", experts, hidden, intermediate,
                    topk, moe_layers)


def load_spec(path: str | Path) -> SweepSpec:
    """Read a YAML sweep spec; every error is one line that names the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no sweep spec at {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UserError(f"{path}: malformed YAML{where}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a sweep spec is a mapping of keys ({', '.join(SPEC_KEYS)})")
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; known keys: {', '.join(SPEC_KEYS)}")
    shapes = []
    for i, s in enumerate(data.get("shapes") or []):
        if not isinstance(s, dict):
            raise UserError(f"{path}: shapes[{i}] must be a mapping of {', '.join(SHAPE_KEYS)}")
        bad = [k for k in s if k not in SHAPE_KEYS]
        missing = [k for k in SHAPE_KEYS[1:5] if k not in s]
        if bad or missing:
            what = f"unknown key {bad[0]!r}" if bad else f"missing {missing[0]!r}"
            raise UserError(f"{path}: shapes[{i}]: {what}; keys: {', '.join(SHAPE_KEYS)}")
        try:
            shapes.append(explicit_shape(int(s["experts"]), int(s["hidden"]), int(s["intermediate"]),
                                         int(s["topk"]), s.get("name"), int(s.get("moe_layers", 1))))
        except (TypeError, ValueError):
            raise UserError(f"{path}: shapes[{i}]: sizes must be integers") from None
    hf = [(path.parent / p) for p in _str_list(data.get("hf_configs"))]
    try:
        return build_spec(
            name=str(data.get("name") or path.stem),
            models=_str_list(data.get("models")),
            hf_configs=tuple(hf),
            shapes=tuple(shapes),
            ms=_int_list(data.get("m"), f"{path}: m"),
            topks=_int_list(data.get("topk"), f"{path}: topk"),
            dtypes=_str_list(data.get("dtypes")) or ("bf16",),
            paths=_str_list(data.get("paths")) or ("triton", "cutlass"),
            routing=str(data.get("routing", "uniform")),
            seed=int(data.get("seed", 0)),
            tp=int(data.get("tp", 1)),
            ep=int(data.get("ep", 1)),
        )
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
