"""One tile configuration of the fused-MoE Triton kernels, and the default choice.

Field names match the keys of vLLM's and SGLang's tuned-config JSON files, so a
row of such a file loads as ``TileConfig.from_dict`` and ``to_vllm_dict`` writes
one back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

from moebench.errors import UserError

_VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def uses_retired_field(d: Mapping) -> bool:
    """Whether a config dict sets ``block_rescale``, a moebench-only field that was retired: rows of
    commit bab17e1 carry it (mostly false); a false one loads, a true one describes no kernel built now."""
    return bool(d.get("block_rescale", False))


@dataclass(frozen=True)
class TileConfig:
    BLOCK_SIZE_M: int  # token-slot rows per tile (the align step pads each expert to this)
    BLOCK_SIZE_N: int  # output columns per tile
    BLOCK_SIZE_K: int  # reduction step
    GROUP_SIZE_M: int = 1  # tiles along M visited together, for L2 reuse of weights
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False  # compute C^T = W . X^T (moebench's kernels only; not written to vLLM/SGLang files)
    atomic_sum: bool = True  # top-k sum by atomics in GEMM2's epilogue, else rows stored then summed (moebench only)
    split_k: int = 1  # GEMM1 programs per output tile, each over a share of K (moebench only)
    direct_route: bool = False  # a tile per token slot, its expert read from topk_ids: no align step (moebench only)
    gemm2_block_n: int = 0  # GEMM2's output columns per tile, if not GEMM1's; 0: the same (moebench only)
    gemm2_n_tiles: int = 1  # GEMM2 column tiles per program, in one pipelined loop (moebench only)
    gemm1_merged: bool = False  # GEMM1 as one MMA per K step over gate and up rows together (moebench only)
    gemm1_quant_x: bool = False  # fp8-block128: GEMM1 quantizes x in its K loop, no launch for it (moebench only)
    gemm1_tma: bool = False  # GEMM1 reads its weight tiles by TMA, not pointer loads (moebench only)
    gemm2_split_k: int = 1  # GEMM2 programs per output tile, each over a share of K; needs atomic_sum (moebench only)
    atomic_out: bool = False  # atomic_sum adds into the output's own dtype (bf16), no float32 buffer (moebench only)
    gemm2_columns_first: bool = False  # GEMM2 runs every row tile of a column chunk before the next (moebench only)
    gemm2_preload: bool = False  # direct_route: GEMM2 reads 2 K steps of weights before GEMM1 ends (moebench only)
    tail_tiles: int = 0  # an expert's last row tile runs at BLOCK_M >> i rows, i <= this, where it fits (moebench only)

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
    def from_dict(cls, d: dict) -> TileConfig:
        d = dict(d)
        if uses_retired_field(d):
            raise UserError("tile config: block_rescale (rescaled fp8-block128 accumulation) is no longer built")
        d.pop("block_rescale", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"tile config: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
        flags = {f.name for f in fields(cls) if f.type in ("bool", bool)}
        return cls(**{k: bool(v) if k in flags else int(v) for k, v in d.items()})

    @property
    def portable(self) -> bool:
        """Whether vLLM's and SGLang's kernels run this config as written (no moebench-only field set)."""
        return (not self.swap_ab and self.atomic_sum and self.split_k == 1 and not self.direct_route
                and self.gemm2_block_n in (0, self.BLOCK_SIZE_N)
                and self.gemm2_n_tiles == 1 and not self.gemm1_merged
                and not self.gemm1_tma and not self.atomic_out
                and self.gemm2_split_k == 1 and not self.gemm2_columns_first
                and not self.tail_tiles)  # gemm1_quant_x implies direct_route

    @property
    def block_n2(self) -> int:
        """GEMM2's BLOCK_N."""
        return self.gemm2_block_n or self.BLOCK_SIZE_N

    def to_vllm_dict(self) -> dict[str, int]:
        d = asdict(self)
        return {k: d[k] for k in _VLLM_KEYS}

    def as_dict(self) -> dict:
        """Every field, for moebench's own rows (``to_vllm_dict`` drops what vLLM does not read)."""
        return asdict(self)

    def key(self) -> tuple:
        return tuple(asdict(self).values())


def tma_rows(row_elems: int, elem_bytes: int) -> bool:
    """Whether rows of a matrix can be read by TMA (``gemm1_tma``): their bytes a multiple of 16."""
    return row_elems * elem_bytes % 16 == 0


SMEM_LIMIT = 227 * 1024  # bytes of shared memory one block may use on sm90


def smem_bytes(cfg: TileConfig, elem_bytes: int) -> int:
    """Pipelined operand tiles of GEMM1 (one A tile, gate and up B tiles) over num_stages buffers."""
    per_stage = (cfg.BLOCK_SIZE_M + 2 * cfg.BLOCK_SIZE_N) * cfg.BLOCK_SIZE_K * elem_bytes
    return per_stage * cfg.num_stages


def fit_stages(cfg: TileConfig, elem_bytes: int) -> TileConfig:
    """The config with num_stages lowered until its operand tiles fit in shared memory."""
    while cfg.num_stages > 1 and smem_bytes(cfg, elem_bytes) > SMEM_LIMIT:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def busy_slots(per_expert: float) -> float:
    """The slots of a busy expert under uniform routing, for ``per_expert`` on average: about binomial, so the
    average plus two standard deviations (about its square root each); about 1 expert in 40 gets more."""
    return per_expert + 2 * per_expert**0.5


def default_config(M: int, experts: int, topk: int, elem_bytes: int = 2, block_k: int | None = None) -> TileConfig:
    """A reasonable untuned tile for ``M`` tokens: small token tiles at decode, large at prefill.

    The tile height follows the number of token slots per expert (``M * topk / experts``): padding each expert
    to a tall tile wastes the tensor core when experts see few tokens. Up to 32 rows it is the lowest that
    holds a busy expert's slots (``busy_slots``) in one row tile, so most experts take one tile: on an H200
    (these configs' rows in the tuned run of results/h200-kernels-b71c20a) 32 rows at 16 slots per expert
    took 0.77-0.94x the time of 16 at Mixtral M=64 and Qwen3 bf16 M=256 (1.02x at Qwen3 fp8-block128), and
    64 rows at DeepSeek-V3@tp8 M=1024 (32 per expert) 0.82x that of 32. At 64 per expert, 128-row tiles
    took 0.97-1.08x the time of 64-row ones at bf16 and fp8-tensor and 1.37x at fp8-block128, so taller
    tiles follow the average. ``block_k`` pins BLOCK_SIZE_K (128 for 128x128 block-scaled fp8).
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
    if block_k is not None:
        cfg = replace(cfg, BLOCK_SIZE_K=block_k)
    return fit_stages(cfg, elem_bytes)
