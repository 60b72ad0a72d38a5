"""``moebench tune`` refuses a bad request before it creates anything: each refusal is one line on stderr, exit
status 2, and the ``--out`` folder is not created (no empty folder, no run folder). Strategy options are checked
against their ranges. The real command through its entry point (``helpers.moebench_in_process``).
"""

from __future__ import annotations

import json

import pytest
from helpers import moebench_in_process

from moebench.tune.strategies import exhaustive, fast

TUNE = ("tune", "--model", "tiny", "--m", "1", "--no-progress")


def _refused(tmp_path, *args: str, out=None) -> str:
    """Runs ``moebench tune`` with ``args`` into a fresh ``--out``; asserts the refusal; its line."""
    out = out or tmp_path / "fresh" / "out"
    assert not out.exists()
    proc = moebench_in_process(*TUNE, *args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "fresh").exists()  # neither --out nor a folder above it
    return proc.stderr.strip()


CASES = [
    (("--option", "nope=1"), "takes options"),  # not an option of any strategy
    (("--strategy", "exhaustive", "--option", "climbs=2"), "takes options"),  # the fast strategy's option
    (("--dtype", "fp7"), "unknown dtype 'fp7'"),
    (("--gpus", "0"), "--gpus 0"),
    (("--option", "top=-1"), "top"),  # out of its range: ran forever
    (("--option", "final=0"), "final"),  # nothing re-timed: nothing chosen
]


@pytest.mark.parametrize("args,says", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_refused_request_is_one_line_and_creates_nothing(tmp_path, args, says):
    assert says in _refused(tmp_path, *args)


def test_a_bad_check_against_run_is_refused_before_the_out_folder(tmp_path):
    other = tmp_path / "other"
    other.mkdir()  # a folder, but no best.json in it
    assert "--check-against" in _refused(tmp_path, "--check-against", str(other))
    (other / "best.json").write_text(json.dumps({"kernel": "triton", "shape": {"name": "tiny"}, "dtype": "fp16",
                                                 "configs": {}}))
    assert "it tuned triton tiny fp16" in _refused(tmp_path, "--check-against", str(other))
    for broken in ([], {"kernel": "triton-classic", "shape": {"name": "tiny"}, "dtype": "fp16", "configs": []},
                   {"kernel": "triton-classic", "shape": {"name": "tiny"}, "dtype": "fp16", "configs": {"1": "x"}},
                   {"kernel": "triton-classic", "shape": {"name": "tiny"}, "dtype": "fp16",
                    "configs": {"1": {"config": {"BLOCK_SIZE_M": "big"}}}}):
        (other / "best.json").write_text(json.dumps(broken))
        assert "best.json" in _refused(tmp_path, "--check-against", str(other)), broken


def test_an_out_name_too_long_for_the_file_system_is_refused_before_any_folder(tmp_path):
    line = _refused(tmp_path, out=tmp_path / "fresh" / ("a" * 300))
    assert "too long" in line


OPTION_RANGES = [
    (fast.Options, {"top": -1}, "top"),
    (fast.Options, {"top": 10**12}, "top"),  # a count past any space: an exhaustive tune that never ends
    (fast.Options, {"climbs": 10**6}, "climbs"),
    (fast.Options, {"borrow": -1}, "borrow"),
    (fast.Options, {"lead": 0}, "lead"),
    (fast.Options, {"climbs": -1}, "climbs"),
    (fast.Options, {"final": 0}, "final"),
    (fast.Options, {"share": 2}, "share"),
    (fast.Options, {"per_shape": -1}, "per_shape"),
    (fast.Options, {"top": 0, "per_shape": 0}, "top"),  # no seeds at all
    (exhaustive.Options, {"final": 0}, "final"),
    (exhaustive.Options, {"limit": -1}, "limit"),
    (exhaustive.Options, {"limit": 10**9}, "limit"),
]


@pytest.mark.parametrize("cls,values,named", OPTION_RANGES, ids=[f"{c.__module__}:{v}" for c, v, _ in OPTION_RANGES])
def test_each_strategy_option_checks_its_range(cls, values, named):
    from moebench.errors import UserError

    with pytest.raises(UserError, match=named) as e:
        cls(**values)
    assert "\n" not in str(e.value)


def test_the_default_options_are_in_range():
    assert fast.Options() and exhaustive.Options()
    assert fast.Options(share=0, climbs=0, top=1, per_shape=0) and exhaustive.Options(limit=1, final=1)


def test_on_the_interpreter_without_m_it_tunes_the_small_list_and_says_so(tmp_path, monkeypatch):
    """No --m on the interpreter: the tune is asked for the sweep's small M list (1,16,64), not vLLM's 18, and
    without --option for the short search (``fast.INTERPRETER``); a note line says each once it starts. The tune
    itself is a stand-in that records its request, starts and stops: what runs after the request is the tune's
    own tests' business."""
    from moebench._interpret import interpreting
    from moebench.bench.spec import INTERPRETER_MS
    from moebench.errors import UserError
    from moebench.tune import run
    from moebench.tune.strategies.fast import INTERPRETER

    if not interpreting():
        pytest.skip("describes a machine without a CUDA GPU")
    asked, options = [], []

    def stand_in(request, out_base, *, on_progress=None, **_):
        asked.append(request.ms)
        options.append(request.options)
        on_progress("screen", 0, 1)
        raise UserError("stand-in stops here")

    monkeypatch.setattr(run, "tune", stand_in)
    proc = moebench_in_process("tune", "--model", "tiny", "--no-progress", "--out", str(tmp_path))
    assert [list(ms) for ms in asked] == [list(INTERPRETER_MS)] == [[1, 16, 64]], asked
    said = [line for line in proc.stderr.splitlines() if "in place of vLLM's 18" in line]
    assert len(said) == 1 and "M 1,16,64" in said[0], proc.stderr
    assert options == [INTERPRETER] and sum("a short search (top=1" in line for line in proc.stderr.splitlines()) == 1
    given = []
    monkeypatch.setattr(run, "tune", lambda request, out_base, **_: given.append(request) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # --m and --option given: kept as they are
        moebench_in_process("tune", "--model", "tiny", "--no-progress", "--out", str(tmp_path), "--m", "2,3",
                            "--option", "top=3")
    assert list(given[0].ms) == [2, 3] and given[0].options == (("top", 3),)
