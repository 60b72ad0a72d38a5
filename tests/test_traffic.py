"""Tuning for served traffic: a captured routing file (``--routing FILE``) and a histogram of batch token counts
(``--m-weights``): what is read, what is refused, where the keys go and what time a batch is expected to take."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import moebench_in_process

from moebench.errors import UserError
from moebench.models import get_model
from moebench.problem import Problem, make_inputs
from moebench.routing import captured, load_ids, route
from moebench.tune.traffic import expected_us, keys_for, nearest_key, read_weights, under_traffic

TINY = get_model("tiny")  # 8 experts, top-2


def ids_file(tmp_path, rows=None, suffix=".pt"):
    rows = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]], dtype=torch.int64) if rows is None else rows
    path = tmp_path / f"ids{suffix}"
    if suffix == ".npy":
        np.save(path, rows.numpy() if isinstance(rows, torch.Tensor) else rows)
    else:
        torch.save(rows, path)
    return path


# --- a captured routing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".pt", ".npy"])
def test_a_captured_routing_draws_its_batches_from_the_files_rows(tmp_path, suffix):
    path = ids_file(tmp_path, suffix=suffix)
    routing = captured(path, TINY.experts, TINY.topk)
    assert routing.startswith("file:") and str(path.absolute()) in routing
    weights, ids = route(64, TINY.experts, TINY.topk, routing, seed=3, device="cpu")
    file_rows = {tuple(r) for r in load_ids(path).tolist()}
    assert ids.dtype == torch.int32 and ids.shape == (64, 2) and {tuple(r) for r in ids.tolist()} <= file_rows
    assert len({tuple(r) for r in ids.tolist()}) > 1  # drawn, not one row repeated
    assert torch.allclose(weights.sum(-1), torch.ones(64)) and bool((weights[:, 0] >= weights[:, 1]).all())
    again = route(64, TINY.experts, TINY.topk, routing, seed=3, device="cpu")
    assert torch.equal(again[1], ids)  # seeded
    inputs = make_inputs(Problem(TINY, 5, "fp16", routing), "cpu")  # a Problem takes it as its routing
    assert {tuple(r) for r in inputs.topk_ids.tolist()} <= file_rows


def test_a_captured_routing_names_its_contents_and_refuses_a_changed_file(tmp_path):
    path = ids_file(tmp_path)
    routing = captured(path, TINY.experts, TINY.topk)
    torch.save(torch.tensor([[1, 2], [3, 4]]), path)
    assert captured(path, TINY.experts, TINY.topk) != routing
    with pytest.raises(UserError, match="changed since"):
        route(4, TINY.experts, TINY.topk, routing, seed=0, device="cpu")


@pytest.mark.parametrize("rows,suffix,says", [
    (torch.tensor([[0, 1, 2]]), ".pt", "routes to 2"),  # top-3 ids for a top-2 layer
    (torch.tensor([[0, 8]]), ".pt", "experts 0..7"),  # an expert the layer lacks
    (torch.tensor([[-1, 0]]), ".pt", "experts 0..7"),
    (torch.tensor([0, 1]), ".pt", "[tokens, topk]"),  # one dimension
    (torch.tensor([[0.0, 1.0]]), ".pt", "integer"),
    ({"ids": [0, 1]}, ".pt", "[tokens, topk]"),  # not a tensor
    (torch.tensor([[0, 1]]), ".csv", ".pt or .npy"),
])
def test_a_routing_file_that_does_not_fit_the_layer_is_one_line(tmp_path, rows, suffix, says):
    path = tmp_path / f"ids{suffix}"
    torch.save(rows, path)
    with pytest.raises(UserError, match=says.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        captured(path, TINY.experts, TINY.topk)


def test_a_missing_or_foreign_routing_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot be read"):
        captured(tmp_path / "none.pt", 8, 2)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match="cannot be read"):
        captured(tmp_path / "junk.npy", 8, 2)


# --- a histogram of token counts -------------------------------------------------------------------------

def test_a_histogram_reads_counts_or_pairs_with_a_header(tmp_path):
    (tmp_path / "h.csv").write_text("tokens,count\n1,10\n\n4,2.5\n1,5\n")
    assert read_weights(tmp_path / "h.csv") == {1: 15.0, 4: 2.5}
    (tmp_path / "lengths.txt").write_text("7\n7\n300\n")  # one batch per line
    assert read_weights(tmp_path / "lengths.txt") == {7: 2.0, 300: 1.0}


@pytest.mark.parametrize("text,says", [("", "no token counts"), ("0\n", "positive"), ("5,-1\n", "positive"),
                                       ("5,x\n", "expected"), ("5,1,2\n", "positive"), ("tokens\n", "no token")])
def test_a_bad_histogram_is_one_line_naming_the_line(tmp_path, text, says):
    (tmp_path / "h.csv").write_text(text)
    with pytest.raises(UserError, match=says):
        read_weights(tmp_path / "h.csv")


def test_keys_sit_where_the_batches_are():
    few = {m: 1.0 for m in (1, 2, 3)}
    assert keys_for(few) == (1, 2, 3)  # fewer counts than keys: each is a key
    decode_heavy = {**{m: 100.0 for m in range(1, 65)}, **{m: 1.0 for m in range(65, 4097, 64)}}
    keys = keys_for(decode_heavy)
    assert len(keys) <= 18 and keys[0] == 1 and keys[-1] == max(decode_heavy)
    assert sum(k <= 64 for k in keys) >= 14  # most keys among the decode batches that dominate
    assert all(k in decode_heavy for k in keys)


def test_the_expected_time_reads_each_batch_at_its_nearest_key():
    times = {1: 10.0, 8: 20.0, 64: 100.0}
    assert nearest_key(times, 4) == 1 and nearest_key(times, 5) == 8 and nearest_key(times, 4.5 * 2) == 8
    assert expected_us({1: 1, 4: 1, 36: 2}, times) == pytest.approx((10 + 10 + 2 * 20) / 4)  # 36: 8 and 64 tie
    got = under_traffic({1: 3, 64: 1}, times, {1: 20.0, 8: 20.0, 64: 100.0})
    assert got["tuned_us"] == pytest.approx(32.5) and got["default_us"] == pytest.approx(40.0)
    assert got["gain"] == pytest.approx(40 / 32.5) and got["batches"] == 4
    assert under_traffic({1: 1}, {1: None}, {1: 3.0}) is None


# --- the command ---------------------------------------------------------------------------------------------

def test_the_tune_command_takes_a_routing_file_and_places_its_keys_by_the_histogram(tmp_path, monkeypatch):
    """The request the command builds (a stand-in tune records it): the captured routing's name, the keys of
    the histogram when no --m is given, and the histogram itself (part of the request, so a resume matches)."""
    from moebench.tune import run

    path = ids_file(tmp_path)
    (tmp_path / "h.csv").write_text("1,50\n3,20\n7,5\n")
    asked = []
    monkeypatch.setattr(run, "tune", lambda request, out_base, **_: asked.append(request) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        moebench_in_process("tune", "--model", "tiny", "--no-progress", "--out", str(tmp_path / "out"),
                            "--routing", str(path), "--m-weights", str(tmp_path / "h.csv"))
    (request,) = asked
    assert request.routing == captured(path, 8, 2) and request.ms == (1, 3, 7)
    assert dict(request.m_weights) == {1: 50.0, 3: 20.0, 7: 5.0}


@pytest.mark.parametrize("args,says", [(("--routing", "nowhere.pt"), "cannot be read"),
                                       (("--routing", "zipf"), ".pt or .npy"),
                                       (("--m-weights", "missing.csv"), "--m-weights")])
def test_a_bad_routing_or_histogram_is_refused_before_anything_is_created(tmp_path, args, says):
    out = tmp_path / "out"
    proc = moebench_in_process("tune", "--model", "tiny", "--no-progress", "--out", str(out), *args, cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert says in proc.stderr and not out.exists()
