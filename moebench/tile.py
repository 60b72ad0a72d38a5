"""One tile configuration of the fused-MoE Triton kernels, its fields declared once, and the default choice.

Field names match the keys of vLLM's and SGLang's tuned-config JSON files, so a
row of such a file loads as ``TileConfig.from_dict`` and ``to_vllm_dict`` writes
one back unchanged. ``FIELDS`` declares each field once: what it is, its mark in
a short label, and whether the engines' kernels read it; ``portable``,
``to_vllm_dict`` and ``short_label`` are derived from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace

from moebench.errors import UserError, short
from moebench.hardware import DeviceLimits


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


MAX_FIELD = 1024  # no integer field of a config that runs is larger (the engines' tiles are at most 256 wide)


def _size(name: str, v) -> int:
    """An integer field's value: an int (or an integral float, as some writers store them) of at most MAX_FIELD;
    16.5, "16", true or 2**40 is a UserError, never truncated or compiled."""
    if isinstance(v, float) and v.is_integer() and abs(v) <= MAX_FIELD:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise UserError(f"tile config: {name}={short(v)} must be an integer")
    if not -MAX_FIELD <= v <= MAX_FIELD:
        raise UserError(f"tile config: {name}={short(v)} is past the largest taken ({MAX_FIELD})")
    return v


def _flag(name: str, v) -> bool:
    """A flag's value: a bool, or 0 or 1 (older rows); "no" is a UserError, not True."""
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise UserError(f"tile config: {name}={short(v)} must be true or false")


@dataclass(frozen=True)
class TileField:
    """One field of ``TileConfig``: what it is, how a short label shows it, and who can run it."""

    name: str
    doc: str  # what the field sets
    mark: str  # its mark in a short label, "{}" standing for the value; "" for the tile's shape (MxNxK)
    engine: bool = False  # one of the six keys vLLM's and SGLang's kernels read; else moebench-only
    always: bool = False  # marked in every label; else only where it is away from its default
    default_as: str = ""  # a field whose value means the same as this field's default


# In the order a short label lists them. Moebench-only fields are portable (the engines run the config)
# only at their default, which is each field's off position.
FIELDS: tuple[TileField, ...] = (
    TileField("BLOCK_SIZE_M", "token-slot rows per tile (the align step pads each expert to this)", "", engine=True),
    TileField("BLOCK_SIZE_N", "output columns per tile", "", engine=True),
    TileField("BLOCK_SIZE_K", "reduction step", "", engine=True),
    TileField("num_warps", "warps per program", "w{}", engine=True, always=True),
    TileField("num_stages", "software-pipeline stages of the K loop", "s{}", engine=True, always=True),
    TileField("GROUP_SIZE_M", "row tiles visited together, for L2 reuse of weights", "g{}", engine=True),
    TileField("swap_ab", "compute C^T = W . X^T: the expert dimension fills the MMA's 64-row side", "swap"),
    TileField("atomic_sum", "top-k sum by atomics in GEMM2's epilogue, else rows stored then summed",
              "stored-sum"),
    TileField("atomic_out", "the atomic sum adds into the output's own dtype, no float32 buffer", "out-sum"),
    TileField("split_k", "GEMM1 programs per output tile, each over a share of K", "split{}"),
    TileField("gemm2_split_k", "GEMM2 programs per output tile, each over a share of K; needs atomic_sum",
              "g2split{}"),
    TileField("direct_route", "a tile per token slot, its expert read from topk_ids: no align step", "direct"),
    TileField("gemm2_block_n", "GEMM2's output columns per tile; 0: BLOCK_SIZE_N", "n2={}",
              default_as="BLOCK_SIZE_N"),
    TileField("gemm2_n_tiles", "GEMM2 column tiles per program, in one pipelined loop", "n2tiles={}"),
    TileField("gemm1_merged", "GEMM1 as one MMA per K step over gate and up rows together", "merged"),
    TileField("gemm1_quant_x", "fp8-block128: GEMM1 quantizes x in its K loop, no launch for it", "quant-x"),
    TileField("gemm1_tma", "GEMM1 reads its weight tiles by TMA, not pointer loads", "tma"),
    TileField("gemm2_columns_first", "GEMM2 runs every row tile of a column chunk before the next", "cols-first"),
    TileField("gemm2_preload", "direct_route: GEMM2 reads 2 K steps of weights before GEMM1 ends", "preload"),
    TileField("tail_tiles", "an expert's last row tile runs at BLOCK_M >> i rows, i <= this, where it fits",
              "tail{}"),
)
FIELD = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class TileConfig:
    """A tile configuration; ``FIELDS`` says what each field is."""

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False
    atomic_sum: bool = True
    split_k: int = 1
    direct_route: bool = False
    gemm2_block_n: int = 0
    gemm2_n_tiles: int = 1
    gemm1_merged: bool = False
    gemm1_quant_x: bool = False
    gemm1_tma: bool = False
    gemm2_split_k: int = 1
    atomic_out: bool = False
    gemm2_columns_first: bool = False
    gemm2_preload: bool = False
    tail_tiles: int = 0

    def __post_init__(self) -> None:
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, name)
            if not _pow2(v) or v < 16:
                raise UserError(f"tile config: {name}={v} must be a power of two >= 16")
        if self.GROUP_SIZE_M < 1:
            raise UserError(f"tile config: GROUP_SIZE_M={self.GROUP_SIZE_M} must be >= 1")
        if not _pow2(self.num_warps) or self.num_warps > 16:
            raise UserError(f"tile config: num_warps={self.num_warps} must be 1, 2, 4, 8 or 16")
        if self.split_k < 1:
            raise UserError(f"tile config: split_k={self.split_k} must be >= 1")
        if self.gemm2_n_tiles < 1:
            raise UserError(f"tile config: gemm2_n_tiles={self.gemm2_n_tiles} must be >= 1")
        if self.num_stages < 1:
            raise UserError(f"tile config: num_stages={self.num_stages} must be >= 1")
        if self.gemm2_block_n and (not _pow2(self.gemm2_block_n) or self.gemm2_block_n < 16):
            raise UserError(f"tile config: gemm2_block_n={self.gemm2_block_n} must be 0 or a power of two >= 16")
        if self.gemm1_quant_x and not self.direct_route:
            raise UserError("tile config: gemm1_quant_x needs direct_route (a tile per slot)")
        if self.gemm2_split_k < 1:
            raise UserError(f"tile config: gemm2_split_k={self.gemm2_split_k} must be >= 1")
        if self.gemm2_split_k > 1 and (not self.atomic_sum or self.gemm2_n_tiles > 1):
            raise UserError("tile config: gemm2_split_k adds its partial sums by the atomic top-k sum "
                            "(atomic_sum), one column tile per program (gemm2_n_tiles=1)")
        if self.atomic_out and not self.atomic_sum:
            raise UserError("tile config: atomic_out is a form of atomic_sum (set both)")
        if self.gemm2_preload and not (self.direct_route and self.gemm2_n_tiles == 1):
            raise UserError("tile config: gemm2_preload needs direct_route and one GEMM2 column tile per program")
        if not 0 <= self.tail_tiles <= 2 or (self.tail_tiles and self.BLOCK_SIZE_M >> self.tail_tiles < 16):
            raise UserError(f"tile config: tail_tiles={self.tail_tiles} must be 0, 1 or 2, with BLOCK_SIZE_M >> "
                            "tail_tiles >= 16")
        if self.tail_tiles and self.direct_route:
            raise UserError("tile config: tail_tiles is for tiles of the align step's slots (not direct_route)")
        if self.gemm1_tma and self.gemm1_merged:
            raise UserError("tile config: gemm1_tma is for GEMM1 as a gate and an up MMA (not gemm1_merged)")

    @classmethod
    def from_dict(cls, d: Mapping) -> TileConfig:
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"tile config: unknown key {short(unknown[0])}; known: {', '.join(sorted(known))}")
        missing = [f.name for f in fields(cls)[:3] if f.name not in d]  # the tile's shape has no default
        if missing:
            raise UserError(f"tile config: missing key {missing[0]!r}")
        flags = {f.name for f in fields(cls) if f.type in ("bool", bool)}
        return cls(**{k: _flag(k, v) if k in flags else _size(k, v) for k, v in d.items()})

    @property
    def portable(self) -> bool:
        """Whether vLLM's and SGLang's kernels run this config as written: every moebench-only field off."""
        d = asdict(self)
        return all(_at_default(f, d) for f in FIELDS if not f.engine)

    @property
    def block_n2(self) -> int:
        """GEMM2's BLOCK_N."""
        return self.gemm2_block_n or self.BLOCK_SIZE_N

    @property
    def label(self) -> str:
        """The config as tables print it (``short_label``)."""
        return short_label(asdict(self))

    def to_vllm_dict(self) -> dict[str, int]:
        """The six keys the engines read, in their files' order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if FIELD[f.name].engine}

    def as_dict(self) -> dict:
        """Every field, for moebench's own rows (``to_vllm_dict`` drops what vLLM does not read)."""
        return asdict(self)

    def key(self) -> tuple:
        return tuple(asdict(self).values())


DEFAULTS = {f.name: f.default for f in fields(TileConfig) if f.default is not MISSING}


def _at_default(f: TileField, config: Mapping) -> bool:
    value = config.get(f.name, DEFAULTS.get(f.name))
    return value == DEFAULTS.get(f.name) or (bool(f.default_as) and value == config.get(f.default_as))


def short_label(config: Mapping) -> str:
    """A config dict as tables print it: the tile's shape (MxNxK), then the mark of each field ``FIELDS``
    shows always or that is away from its default, e.g. "128x128x64 w8 s3 g8 swap". A field the dict lacks
    (rows of older runs) counts as at its default."""
    shape = "x".join(str(config[f.name]) for f in FIELDS if not f.mark)
    marks = [f.mark.format(config.get(f.name, DEFAULTS.get(f.name)))
             for f in FIELDS if f.mark and (f.always or not _at_default(f, config))]
    return " ".join([shape, *marks])


def tma_rows(row_elems: int, elem_bytes: int) -> bool:
    """Whether rows of a matrix can be read by TMA (``gemm1_tma``): their bytes a multiple of 16."""
    return row_elems * elem_bytes % 16 == 0


def smem_bytes(cfg: TileConfig, elem_bytes: int) -> int:
    """Pipelined operand tiles of GEMM1 (one A tile, gate and up B tiles) over num_stages buffers."""
    per_stage = (cfg.BLOCK_SIZE_M + 2 * cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * elem_bytes
    return per_stage * cfg.num_stages


def fit_stages(cfg: TileConfig, elem_bytes: int, limits: DeviceLimits | None = None) -> TileConfig:
    """The config with num_stages lowered until its operand tiles fit in a block's shared memory
    (``limits``: the current device's if not given)."""
    smem = (limits or DeviceLimits.current()).smem_bytes
    while cfg.num_stages > 1 and smem_bytes(cfg, elem_bytes) > smem:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def busy_slots(per_expert: float) -> float:
    """The slots of a busy expert under uniform routing, for ``per_expert`` on average: about binomial, so the
    average plus two standard deviations (about its square root each); about 1 expert in 40 gets more."""
    return per_expert + 2 * per_expert**0.5


def default_config(M: int, experts: int, topk: int, weight_bytes: int = 2, fp8_scheme: str | None = None,
                   limits: DeviceLimits | None = None) -> TileConfig:
    """The untuned config moebench's kernel (the triton path) runs for ``M`` tokens: small token tiles at decode,
    large at prefill.

    The tile height follows the token slots per expert (``M * topk / experts``): padding each expert to a tall
    tile wastes the tensor core when experts see few tokens. Up to 32 rows it is the lowest that holds a busy
    expert's slots (``busy_slots``) in one row tile, so most experts take one tile; then 64 rows up to 96 slots
    per expert on average, 128 above. For 128x128 block-scaled fp8 (``fp8_scheme`` "block128") K steps by one
    scale block (128). num_stages is lowered until the tiles of ``weight_bytes`` elements fit ``limits``.
    """
    per_expert = M * topk / experts
    busy = busy_slots(per_expert)
    if busy <= 16:
        cfg = TileConfig(16, 64, 128, 1, 4, 4)
    elif busy <= 32:
        cfg = TileConfig(32, 64, 128, 1, 4, 4)
    elif per_expert <= 96:
        cfg = TileConfig(64, 64, 64, 8, 4, 4)
    else:
        cfg = TileConfig(128, 128, 64, 8, 8, 3)
    if fp8_scheme == "block128":
        cfg = replace(cfg, BLOCK_SIZE_K=128)
    return fit_stages(cfg, weight_bytes, limits)
