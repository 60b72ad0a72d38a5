"""Sweep specs: what to run, from a YAML file or from CLI flags.

A spec names model shapes, token counts, dtypes and paths; ``SweepSpec.points``
expands it to the plan (problem x path). YAML specs are strict: an unknown key
is an error that names it. The shipped specs live in ``moebench/bench/sweeps/``
(package data; ``sweeps/`` at the top of the repository links to it), so an
installed ``moebench sweep quick`` finds them by name. Example (quick.yaml)::

    name: quick
    models: [mixtral-8x7b, deepseek-v3]
    m: [1, 16, 128, 1024, 4096]
    dtypes: [bf16]
    paths: [triton, cutlass]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from moebench.bounded import read_yaml
from moebench.dtypes import get_dtype
from moebench.errors import UserError, short
from moebench.models import MoEShape, explicit_shape, from_hf_config, get_model, shard
from moebench.paths.registry import get_path
from moebench.problem import M_MAX, Problem, check_seed
from moebench.routing import check_routing

SWEEPS_DIR = Path(__file__).resolve().parent / "sweeps"  # the shipped specs (package data)
CPU_SPEC, GPU_SPEC = "cpu", "quick"  # the default spec on the Triton interpreter / on a GPU

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
    "ep_map": "true: run ep's rank 0 through an expert_map (the whole batch, top-k over all experts)",
    "tune": "tune each shape and dtype on the tunable paths with moebench tune's search, then run the choices",
    "runs": "a list of blocks, each a mapping of block keys that override the top level's",
}
DEFAULT_PATHS = ("triton", "cutlass")  # a block's paths where it names none
EP_MAP_PATHS = ("triton",)  # ... under ep_map: the default ones that take an expert_map
# Keys that describe one block of the plan (a product of shapes x dtypes x M x paths).
BLOCK_KEYS = ("models", "hf_configs", "shapes", "m", "topk", "dtypes", "paths", "tp", "ep", "ep_map")
SHAPE_KEYS = ("name", "experts", "hidden", "intermediate", "topk", "moe_layers")
# A sweep's name ends its run folder's name: a letter, digit or "_" first (no "..", no hidden folder), then those,
# spaces and ". @ + = , -"; no "/" or "\\", so the folder stays inside --out.
PLAIN_NAME = re.compile(r"\w[\w .@+=,-]{0,99}")


@dataclass(frozen=True)
class Block:
    """One product of the plan: every shape x dtype x M x path."""

    shapes: tuple[MoEShape, ...]
    ms: tuple[int, ...]
    dtypes: tuple[str, ...]
    paths: tuple[str, ...]

    def validate(self, name: str) -> None:
        for field, value in (("models/shapes", self.shapes), ("m", self.ms), ("dtypes", self.dtypes),
                             ("paths", self.paths)):
            if not value:
                raise UserError(f"sweep '{name}': {field} is empty")
        for m in self.ms:
            if not 0 < m <= M_MAX:
                raise UserError(f"sweep '{name}': M must be a token count from 1 to {M_MAX}, got {short(m)}")
        for d in self.dtypes:
            get_dtype(d)
        for p in self.paths:
            get_path(p)


def union(items) -> tuple:
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class SweepSpec:
    name: str
    blocks: tuple[Block, ...]
    routing: str = "uniform"
    seed: int = 0
    tune: bool = False

    def __post_init__(self) -> None:
        if not PLAIN_NAME.fullmatch(self.name):
            raise UserError(f"sweep name {short(self.name)} is not a plain file-name part (letters, digits, _ first; "
                            "then also spaces and . @ + = , -; at most 100 characters)")
        if not self.blocks:
            raise UserError(f"sweep '{self.name}': nothing to run")
        for b in self.blocks:
            b.validate(self.name)
        check_routing(self.routing)

    shapes = property(lambda self: union(s for b in self.blocks for s in b.shapes))
    ms = property(lambda self: union(m for b in self.blocks for m in b.ms))
    dtypes = property(lambda self: union(d for b in self.blocks for d in b.dtypes))
    paths = property(lambda self: union(p for b in self.blocks for p in b.paths))

    def points(self) -> list[tuple[Problem, str]]:
        """The plan, grouped so one (shape, dtype) shares its weights: block, shape, dtype, M, path. A point
        named twice (``m: [1, 1]``, or in two blocks) is run once, where it first comes."""
        return list(dict.fromkeys(
            (Problem(shape, m, dtype, self.routing, self.seed), path)
            for b in self.blocks
            for shape in b.shapes
            for dtype in b.dtypes
            for m in b.ms
            for path in b.paths
        ))


def override(spec: SweepSpec, ms: tuple[int, ...] | None = None, dtypes: tuple[str, ...] | None = None,
             paths: tuple[str, ...] | None = None, topks: tuple[int, ...] | None = None,
             routing: str | None = None, seed: int | None = None, tune: bool | None = None) -> SweepSpec:
    """Flags given with a spec file: each one given replaces that list in every block."""
    blocks = []
    for b in spec.blocks:
        changes = {k: v for k, v in (("ms", ms), ("dtypes", dtypes), ("paths", paths)) if v}
        if topks:
            changes["shapes"] = tuple(_with_topk(list(b.shapes), topks))
        blocks.append(replace(b, **changes))
    top = {k: v for k, v in (("routing", routing), ("seed", seed), ("tune", tune)) if v is not None}
    return replace(spec, blocks=tuple(blocks), **top)


def _int_list(value, what: str) -> tuple[int, ...]:
    out = []
    for v in _items(value, (int, str), what, "integers"):
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise UserError(f"{what}: {short(part)} is not an integer") from None
    return tuple(out)


def _str_list(value, what: str) -> tuple[str, ...]:
    return tuple(p.strip() for v in _items(value, (str,), what, "names") for p in v.split(",") if p.strip())


def _items(value, types: tuple[type, ...], what: str, plural: str) -> list:
    """``value`` (one of ``types``, a list of them, or null) as a list; a UserError naming ``what`` where not."""
    items = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    if any(isinstance(v, bool) or not isinstance(v, types) for v in items):
        raise UserError(f"{what}: expected {plural}, one or a list, got {short(value)}")
    return items


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UserError(f"{what}: expected an integer, got {short(value)}")
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{what}: expected an integer, got {short(value)}") from None


def _bool(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{what}: expected true or false, got {short(value)}")
    return value


def _with_topk(shapes: list[MoEShape], topks: tuple[int, ...]) -> list[MoEShape]:
    if not topks:
        return shapes
    out = []
    for s in shapes:
        for k in topks:
            if k <= 0 or k > s.routed_experts:
                raise UserError(f"{s.name}: top-k {k} impossible with {s.routed_experts} experts")
            out.append(s if k == s.topk else replace(s, topk=k, name=f"{s.name}-top{k}"))
    return out


def build_block(
    models: tuple[str, ...] = (),
    hf_configs: tuple[str | Path, ...] = (),
    shapes: tuple[MoEShape, ...] = (),
    ms: tuple[int, ...] = (),
    topks: tuple[int, ...] = (),
    dtypes: tuple[str, ...] = ("bf16",),
    paths: tuple[str, ...] = (),
    tp: int = 1,
    ep: int = 1,
    ep_map: bool = False,
) -> Block:
    base = [get_model(m) for m in models] + [from_hf_config(p) for p in hf_configs] + list(shapes)
    if not base:
        raise UserError("nothing to sweep: give a spec file, --model, --hf-config or an explicit shape")
    sharded = [shard(s, tp=tp, ep=ep, ep_map=ep_map) for s in base]
    paths = paths or (EP_MAP_PATHS if ep_map else DEFAULT_PATHS)
    return Block(tuple(_with_topk(sharded, topks)), tuple(ms), tuple(dtypes), tuple(paths))


def build_spec(name: str, routing: str = "uniform", seed: int = 0, tune: bool = False, **block) -> SweepSpec:
    """A one-block spec from flags (the keyword arguments of ``build_block``)."""
    return SweepSpec(name, (build_block(**block),), routing, seed, tune)


def shipped_specs() -> list[str]:
    """The names of the specs shipped in the package, sorted."""
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def default_spec_file(interpreter: bool) -> Path:
    """The spec ``moebench sweep`` runs without SPEC or model flags: a tiny CPU one on the interpreter."""
    return SWEEPS_DIR / f"{CPU_SPEC if interpreter else GPU_SPEC}.yaml"


def find_spec(spec: str | Path) -> Path:
    """A SPEC argument as a file: the path itself, else a shipped spec of that name ("quick", "quick.yaml")."""
    path = Path(spec)
    if path.exists() and not path.is_dir():  # a FIFO or a device too: the reader refuses it by name
        return path
    shipped = SWEEPS_DIR / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    raise UserError(f"no sweep spec at {path}; shipped specs: {', '.join(shipped_specs())}")


def load_spec(path: str | Path, ms: tuple[int, ...] = ()) -> SweepSpec:
    """Read a YAML sweep spec; every error is one line that names the file. ``ms``: the token counts of a block
    that names none (``--m``, which replaces every block's anyway)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no sweep spec at {path}")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: a sweep spec is a mapping of keys ({', '.join(SPEC_KEYS)})")
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise UserError(f"{path}: unknown key {short(unknown[0])}; known keys: {', '.join(SPEC_KEYS)}")
    runs = data.get("runs")
    if runs is not None and (not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs)):
        raise UserError(f"{path}: runs must be a list of mappings of {', '.join(BLOCK_KEYS)}")
    defaults = {k: v for k, v in data.items() if k in BLOCK_KEYS}
    try:
        blocks = []
        for i, run in enumerate(runs or [{}]):
            bad = [k for k in run if k not in BLOCK_KEYS]
            if bad:
                raise UserError(f"runs[{i}]: unknown key {short(bad[0])}; block keys: {', '.join(BLOCK_KEYS)}")
            blocks.append(_block(path, {**defaults, **run}, ms))
        return SweepSpec(
            name=str(data.get("name") or path.stem),
            blocks=tuple(blocks),
            routing=str(data.get("routing", "uniform")),
            seed=check_seed(_int(data.get("seed", 0), "seed")),
            tune=_bool(data.get("tune", False), "tune"),
        )
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None


def _block(path: Path, data: dict, ms: tuple[int, ...] = ()) -> Block:
    """One block from the block keys of a spec file (the top level merged with one entry of runs)."""
    shapes = []
    for i, s in enumerate(data.get("shapes") or []):
        if not isinstance(s, dict):
            raise UserError(f"shapes[{i}] must be a mapping of {', '.join(SHAPE_KEYS)}")
        bad = [k for k in s if k not in SHAPE_KEYS]
        missing = [k for k in SHAPE_KEYS[1:5] if k not in s]
        if bad or missing:
            what = f"unknown key {short(bad[0])}" if bad else f"missing {missing[0]!r}"
            raise UserError(f"shapes[{i}]: {what}; keys: {', '.join(SHAPE_KEYS)}")
        sizes = [_int(s.get(k, 1), f"shapes[{i}].{k}") for k in SHAPE_KEYS[1:]]  # 8.5 is refused, not cut to 8
        name = s.get("name")
        if name is not None and not isinstance(name, str):
            raise UserError(f"shapes[{i}].name: expected a name, got {short(name)}")
        shapes.append(explicit_shape(*sizes[:4], name, sizes[4]))
    return build_block(
        models=_str_list(data.get("models"), "models"),
        hf_configs=tuple(path.parent / p for p in _str_list(data.get("hf_configs"), "hf_configs")),
        shapes=tuple(shapes),
        ms=_int_list(data.get("m"), "m") or ms,
        topks=_int_list(data.get("topk"), "topk"),
        dtypes=_str_list(data.get("dtypes"), "dtypes") or ("bf16",),
        paths=_str_list(data.get("paths"), "paths"),
        tp=_int(data.get("tp", 1), "tp"),
        ep=_int(data.get("ep", 1), "ep"),
        ep_map=_bool(data.get("ep_map", False), "ep_map"),
    )


GPU_MS = (1, 16, 128, 1024, 4096)  # the flags' M: decode to prefill
INTERPRETER_MS = (1, 16, 64)  # the cpu spec's M: what the interpreter runs in seconds
DEFAULT_MS = ",".join(map(str, GPU_MS))


def from_options(spec_file: Path | None, default_file: Path, *, models=(), hf_configs=(), experts=None,
                 hidden=None, intermediate=None, topk=None, ms=None, dtypes=None, paths=None, routing=None,
                 seed=None, tp=1, ep=1, ep_map=False, tune=False) -> SweepSpec:
    """The plan of `moebench sweep`: a spec file with flags over it, or flags alone, or the default file.

    List options arrive as the user typed them (comma lists, possibly repeated).
    """
    for flag, value in (("--m", ms), ("--topk", topk), ("--dtype", dtypes), ("--path", paths)):
        if value is not None and not _str_list(value, flag):
            raise UserError(f"{flag} is empty: give one or more values, comma separated")
    shape_flags = (experts, hidden, intermediate)
    flags_given = bool(models or hf_configs) or any(v is not None for v in shape_flags)
    if spec_file and flags_given:
        raise UserError("give either a SPEC file or --model/--hf-config/shape flags, not both")
    if spec_file or not flags_given:
        if tp != 1 or ep != 1 or ep_map:
            raise UserError("--tp/--ep/--ep-map shard the flags' models; with a SPEC file set tp/ep/ep_map in the file")
        flag_ms = _int_list(ms, "--m") if ms else None
        return override(
            load_spec(find_spec(spec_file) if spec_file else default_file, flag_ms or ()),
            ms=flag_ms,
            dtypes=_str_list(dtypes, "--dtype") or None,
            paths=_str_list(paths, "--path") or None,
            topks=_int_list(topk, "--topk") if topk else None,
            routing=routing,
            seed=seed,
            tune=tune or None,
        )
    topks = _int_list(topk, "--topk") if topk else ()
    shapes = ()
    if any(v is not None for v in shape_flags):
        if None in shape_flags or not topks:
            raise UserError("an explicit shape needs --experts, --hidden, --intermediate and --topk")
        shapes = (explicit_shape(experts, hidden, intermediate, topks[0]),)
        topks = topks if len(topks) > 1 else ()
    return build_spec(
        name="sweep",
        models=_str_list(models, "--model"),
        hf_configs=tuple(hf_configs),
        shapes=shapes,
        ms=_int_list(ms or DEFAULT_MS, "--m"),
        topks=topks,
        dtypes=_str_list(dtypes, "--dtype") or ("bf16",),
        paths=_str_list(paths, "--path"),
        routing=routing or "uniform",
        seed=seed or 0,
        tp=tp,
        ep=ep,
        ep_map=ep_map,
        tune=tune,
    )
