"""The request streams ``moebench trace`` replays: token counts drawn from a distribution, or read from a CSV of
prompt lengths, and how a run's meta.json names them."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from moebench.bounded import Refused, read_text
from moebench.errors import UserError, one_line, short

DISTRIBUTIONS = ("lognormal", "uniform", "decode-mix")
MAX_TOKENS = 4096  # the largest token count drawn (prefill chunks of 4096 tokens and more are split)
LOGNORMAL_MEDIAN, LOGNORMAL_SIGMA = 150, 1.3  # prompt lengths: median 150 tokens, a long right tail
# decode-mix: each request is a decode batch of 1..DECODE_MAX tokens (uniform) with probability DECODE_SHARE,
# else a prefill drawn as lognormal is: a server that mostly decodes, with prompts arriving now and then.
DECODE_SHARE, DECODE_MAX = 0.8, 64
PROMPT_COLUMNS = ("prompt_len", "tokens")  # a CSV's column of token counts, by name, in this order


def token_counts(kind: str, n: int, seed: int = 0, max_tokens: int = MAX_TOKENS) -> list[int]:
    """``n`` requests' token counts drawn from ``kind`` (one of DISTRIBUTIONS) with numpy's generator seeded
    by ``seed``, within 1..``max_tokens``: "lognormal" (median LOGNORMAL_MEDIAN, sigma LOGNORMAL_SIGMA,
    rounded, clipped), "uniform" (1..max_tokens), "decode-mix" (DECODE_SHARE decode batches of 1..DECODE_MAX,
    the rest lognormal)."""
    if kind not in DISTRIBUTIONS:
        raise UserError(f"unknown distribution {kind!r}; choose one of: {', '.join(DISTRIBUTIONS)}")
    if n < 1 or max_tokens < 1:
        raise UserError(f"need at least one request of at least one token, got {n} requests, max {max_tokens}")
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return [int(m) for m in rng.integers(1, max_tokens + 1, size=n)]
    prompts = np.clip(np.rint(rng.lognormal(math.log(LOGNORMAL_MEDIAN), LOGNORMAL_SIGMA, size=n)), 1, max_tokens)
    if kind == "decode-mix":
        decode = rng.random(n) < DECODE_SHARE
        batches = rng.integers(1, min(DECODE_MAX, max_tokens) + 1, size=n)
        prompts = np.where(decode, batches, prompts)
    return [int(m) for m in prompts]


def distribution_label(kind: str, max_tokens: int = MAX_TOKENS) -> str:
    """How meta.json names a distribution, with its parameters."""
    prompts = f"lognormal(median={LOGNORMAL_MEDIAN}, sigma={LOGNORMAL_SIGMA})"
    return {"lognormal": prompts, "decode-mix": f"decode-mix({DECODE_SHARE:.0%} 1..{DECODE_MAX}, else {prompts})"
            }.get(kind, kind) + f" in 1..{max_tokens}"


def _plain(value: object) -> object:
    """A cell as a plain Python value, so a message shows ``-3``, not ``np.int64(-3)``."""
    return value.item() if hasattr(value, "item") else value


def read_prompt_lengths(path: Path | str) -> list[int]:
    """The token counts in a CSV file, in order: its column ``prompt_len`` or ``tokens``, else its first
    numeric column. UserError (one line) for a file that is missing, not CSV, or holds no positive integers."""
    path = Path(path)
    try:
        text = read_text(path, gz=False)
    except Refused as e:
        raise UserError(f"--csv {path}: cannot read it ({e.why})") from None
    try:
        df = pd.read_csv(io.StringIO(text))
    except (OSError, ValueError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
        raise UserError(f"--csv {path}: cannot read it as CSV ({one_line(e)})") from None
    names = {str(c).strip().lower(): c for c in df.columns}
    column = next((names[n] for n in PROMPT_COLUMNS if n in names), None)
    if column is None:
        numeric = [c for c in df.columns if not df[c].empty and pd.to_numeric(df[c], errors="coerce").notna().all()]
        if not numeric:
            raise UserError(f"--csv {path}: no column {' or '.join(PROMPT_COLUMNS)} and no numeric column")
        column = numeric[0]
    values = pd.to_numeric(df[column], errors="coerce")
    bad = [i for i, v in enumerate(values) if not (v >= 1 and float(v).is_integer())]
    if bad or values.empty:
        where = f"line {bad[0] + 2} holds {short(_plain(df[column].iloc[bad[0]]))}" if bad else "it has no rows"
        raise UserError(f"--csv {path}: column {short(column)} must hold positive token counts; {where}")
    return [int(v) for v in values]
