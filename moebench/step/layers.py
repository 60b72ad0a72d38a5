"""The computations of a model's layers beyond the MoE layer, as plain PyTorch: the same function runs on the
part's own dtype (timed) and on float32 copies of its tensors (the reference).

    x [M, hidden] -> rms_norm -> attention (GQA or MLA) -> [M, hidden]
    x [M, hidden] -> rms_norm -> router logits [M, E] -> softmax top-k
    x [M, hidden] -> mlp (gate/up, SiLU, down) -> [M, hidden]

Every function writes no host-visible value and takes no host decision from tensor contents, so the timed closures
are graph-safe. Attention goes through ``torch.nn.functional.scaled_dot_product_attention``, which picks its own
backend (FlashAttention, cuDNN or memory-efficient on an H200; math on the CPU).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS = 1e-6


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., D] * rsqrt(mean(x^2) + eps) * w [D], computed in float32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def rotary(n: int, dim: int, device: torch.device, dtype: torch.dtype, start: int = 0,
           theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, dim / 2] of positions start..start+n-1 (the rotate-half form)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)  # [dim / 2]
    angles = torch.arange(start, start + n, device=device, dtype=torch.float32)[:, None] * inv  # [n, dim / 2]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [M, heads, dim] rotated by cos, sin [M, dim / 2] (one position per row)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def mlp(h: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """h [M, hidden], w13 [2I, hidden] (gate rows, then up rows), w2 [hidden, I] -> [M, hidden]."""
    gate_up = h @ w13.T  # [M, 2I]
    inter = w2.shape[1]
    return (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2.T


def router(h: torch.Tensor, gate: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [M, hidden] (normed), gate [E, hidden] -> probabilities [M, E] float32, top-k weights [M, topk] float32
    (renormalized) and ids [M, topk] int32."""
    probs = torch.softmax((h @ gate.T).float(), dim=-1)  # [M, E]
    weights, ids = torch.topk(probs, topk, dim=-1)
    return probs, weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)


# ---- GQA ---------------------------------------------------------------------------------------------------------

def gqa(t: dict[str, torch.Tensor], batch: int, q_len: int, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The attention block of GQA over tensors ``t``: x [M, hidden], norm [hidden], wqkv [(heads + 2 kv) * d, hidden],
    wo [hidden, heads * d], cos/sin [M, d / 2]; prefill (``q_len`` > 1): causal over the prompt; decode: k_cache,
    v_cache [batch, kv, context, d], the new token written at the last slot, one query over the whole cache."""
    x = t["x"]
    M, d = x.shape[0], head_dim
    qkv = rms_norm(x, t["norm"]) @ t["wqkv"].T  # [M, (heads + 2 kv) * d]
    q, k, v = qkv.split((heads * d, kv_heads * d, kv_heads * d), dim=-1)
    q = apply_rotary(q.reshape(M, heads, d), t["cos"], t["sin"])
    k = apply_rotary(k.reshape(M, kv_heads, d), t["cos"], t["sin"])
    v = v.reshape(M, kv_heads, d)
    if "k_cache" in t:  # decode
        t["k_cache"][:, :, -1].copy_(k)  # [B, kv, d]: this step's key and value in the last slot
        t["v_cache"][:, :, -1].copy_(v)
        # Each KV head's group of query heads as its queries (query head j reads KV head j // group): no copy of
        # the cache per query head, whatever backend SDPA picks.
        q = q.view(batch, kv_heads, heads // kv_heads, d)
        o = F.scaled_dot_product_attention(q, t["k_cache"], t["v_cache"])  # [B, kv, group, d]
        return o.reshape(M, heads * d) @ t["wo"].T
    q = q.view(batch, q_len, heads, d).transpose(1, 2)  # [B, heads, q_len, d]
    k = k.view(batch, q_len, kv_heads, d).transpose(1, 2)  # [B, kv, P, d]
    v = v.view(batch, q_len, kv_heads, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(M, heads * d) @ t["wo"].T  # [M, hidden]


# ---- MLA ---------------------------------------------------------------------------------------------------------

def _mla_q_kv(t: dict[str, torch.Tensor], heads: int, nope: int, rope: int, kv_lora: int):
    """MLA's projections: q_nope [M, heads, nope], q_pe [M, heads, rope] (rotated), latent c [M, kv_lora] (normed),
    k_pe [M, rope] (rotated, shared by the heads)."""
    h = rms_norm(t["x"], t["norm"])
    q_in = rms_norm(h @ t["q_a"].T, t["q_a_norm"]) if "q_a" in t else h  # [M, q_lora] or [M, hidden]
    q = (q_in @ t["q_b"].T).view(-1, heads, nope + rope)
    q_nope, q_pe = q.split((nope, rope), dim=-1)
    q_pe = apply_rotary(q_pe, t["cos"], t["sin"])
    kv = h @ t["kv_a"].T  # [M, kv_lora + rope]
    c = rms_norm(kv[:, :kv_lora], t["kv_a_norm"])
    k_pe = apply_rotary(kv[:, None, kv_lora:], t["cos"], t["sin"])[:, 0]  # [M, rope]
    return q_nope, q_pe, c, k_pe


def _naive_attention(q_nope, q_pe, c, k_pe, kv_b, batch, q_len, kv_len, heads, nope, v_dim, causal):
    """Attention with the latent expanded per head: k = [kv_b(c)'s nope | k_pe], v = kv_b(c)'s v. q_* [B*q_len, ...],
    c [B*kv_len, kv_lora], k_pe [B*kv_len, rope] -> [B*q_len, heads * v_dim]."""
    rope = q_pe.shape[-1]
    kv = (c @ kv_b.T).view(batch, kv_len, heads, nope + v_dim)
    k_nope, v = kv.split((nope, v_dim), dim=-1)
    k = torch.cat((k_nope, k_pe.view(batch, kv_len, 1, rope).expand(-1, -1, heads, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1).view(batch, q_len, heads, nope + rope)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                       scale=1 / math.sqrt(nope + rope))
    return o.transpose(1, 2).reshape(batch * q_len, heads * v_dim)


def mla(t: dict[str, torch.Tensor], batch: int, q_len: int, heads: int, nope: int, rope: int, v_dim: int,
        kv_lora: int, absorbed: bool) -> torch.Tensor:
    """The attention block of MLA over tensors ``t``: x, norm, q_a/q_a_norm (where q has a low rank), q_b, kv_a,
    kv_a_norm, kv_b [heads * (nope + v), kv_lora], wo [hidden, heads * v], cos/sin; decode: latent cache
    [batch, context, kv_lora + rope], the new token's latent written at the last slot.

    Prefill runs the naive form (causal). Decode runs the absorbed form where ``absorbed`` (kv_b's key part folded
    into the query, attention over the latent as one KV head, kv_b's value part applied after: w_uk
    [heads, nope, kv_lora], w_uv [heads, v, kv_lora] in ``t``), else the naive form over the whole cache (the
    float32 reference of the absorbed one: the same product in another order)."""
    q_nope, q_pe, c, k_pe = _mla_q_kv(t, heads, nope, rope, kv_lora)
    if "cache" not in t:  # prefill
        o = _naive_attention(q_nope, q_pe, c, k_pe, t["kv_b"], batch, q_len, q_len, heads, nope, v_dim, True)
        return o @ t["wo"].T
    cache = t["cache"]  # [B, C, kv_lora + rope]
    cache[:, -1, :kv_lora].copy_(c)
    cache[:, -1, kv_lora:].copy_(k_pe)
    if absorbed:
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope, t["w_uk"])  # [B, heads, kv_lora]
        # One KV head (the latent) with the heads as its queries: [B, 1, heads, kv_lora + rope] over [B, 1, C, ...]
        q = torch.cat((q_lat, q_pe), dim=-1)[:, None]
        kv = cache[:, None]
        o = F.scaled_dot_product_attention(q, kv, kv[..., :kv_lora], scale=1 / math.sqrt(nope + rope))[:, 0]
        o = torch.einsum("bhc,hvc->bhv", o, t["w_uv"]).reshape(batch, heads * v_dim)
        return o @ t["wo"].T
    context = cache.shape[1]
    chunk = max(1, (1 << 26) // max(1, context * heads * (2 * nope + rope + v_dim)))  # sequences per pass
    outs = []
    for b in range(0, batch, chunk):
        part = cache[b:b + chunk]  # [n, C, kv_lora + rope]
        outs.append(_naive_attention(q_nope[b:b + chunk], q_pe[b:b + chunk], part[..., :kv_lora].reshape(-1, kv_lora),
                                     part[..., kv_lora:].reshape(-1, rope), t["kv_b"], part.shape[0], 1, context,
                                     heads, nope, v_dim, False))
    return torch.cat(outs) @ t["wo"].T
