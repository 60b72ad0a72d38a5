"""A tune's choice per M, ``best.json`` in its run folder: the one writer and the one reader of that file.

    {"kernel": path, "model": name, "shape": {MoEShape fields}, "dtype": d,
     "configs": {"M": {"config", "time_us", "default", "default_us", "known", "known_us"}},
     "check": {"M": {"config_us", "other", "other_us"}}, "traffic": {...}}

``config`` is the chosen tile config (a ``TileConfig.as_dict``, None where nothing was chosen), ``default`` the
path's untuned one and ``known`` the best hand-picked seed, each with its time re-timed back to back (us).
``read_best`` checks the shape of the file and raises ``BestFileError`` (one line) where it is not a tune's.
"""

from __future__ import annotations

from pathlib import Path

from moebench.bounded import Refused, read_json
from moebench.store.atomic import write_json_atomic

BEST_FILE = "best.json"
ENTRY_FIELDS = ("config", "time_us", "default", "default_us", "known", "known_us")


class BestFileError(ValueError):
    """A ``best.json`` that cannot be read or is not a tune's; the message is one line."""


def best_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / BEST_FILE


def write_best(run_dir: Path | str, *, kernel: str, model: str, shape: dict, dtype: str, configs: dict[int, dict],
               check: dict[int, dict], traffic: dict) -> None:
    """``best.json`` of a tune in ``run_dir``, written whole (``configs``, ``check``: by M, see the module)."""
    write_json_atomic(best_path(run_dir), {
        "kernel": kernel, "model": model, "shape": shape, "dtype": dtype,
        "configs": {str(M): {f: v.get(f) for f in ENTRY_FIELDS} for M, v in sorted(configs.items())},
        "check": {str(M): v for M, v in sorted(check.items())}, "traffic": traffic})


def read_best(run_dir: Path | str) -> dict:
    """The ``best.json`` of ``run_dir``, its ``configs`` keyed by int M (sorted) with dict entries, ``model``
    filled from the shape's name where missing; ``BestFileError`` where the file cannot be read or is not a tune's."""
    file = best_path(run_dir)
    try:
        best = read_json(file, gz=False)
    except Refused as e:
        raise BestFileError(f"no readable {BEST_FILE} ({e.why})") from None
    if not isinstance(best, dict) or not isinstance(best.get("configs"), dict):
        raise BestFileError(f"{BEST_FILE} is not a tune's (no 'configs' mapping)")
    configs = {}
    for m, entry in best["configs"].items():
        try:
            M = int(m)
        except (TypeError, ValueError):
            raise BestFileError(f"{BEST_FILE} is not a tune's (M {str(m)[:40]!r} is not an integer)") from None
        if not isinstance(entry, dict):
            raise BestFileError(f"{BEST_FILE} is not a tune's (entry {M} is not a mapping)")
        configs[M] = entry
    shape = best.get("shape") if isinstance(best.get("shape"), dict) else {}
    return {**best, "shape": shape, "model": best.get("model") or shape.get("name"),
            "configs": dict(sorted(configs.items()))}


def fastest_entries(best: dict) -> dict[int, dict]:
    """Per M of ``read_best``'s answer, the fastest of the choice, the default and the best known seed as the
    tune re-timed them back to back (the choice where none was timed): the config's dict; Ms with none left out."""
    out = {}
    for M, entry in best["configs"].items():
        three = ((entry.get("time_us"), entry.get("config")), (entry.get("default_us"), entry.get("default")),
                 (entry.get("known_us"), entry.get("known")))
        timed = [(t, c) for t, c in three if isinstance(t, (int, float)) and c is not None]
        config = min(timed, key=lambda tc: tc[0])[1] if timed else entry.get("config")
        if config is not None:
            out[M] = config
    return out
