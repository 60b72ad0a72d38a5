"""Bad inputs of each kind found by trying them as a user would: each is refused with one line on stderr and exit
status 2 before anything is created (the folder the command runs in is as it was). The real commands through
their entry point (``helpers.moebench_in_process``); one case per kind, the kind named above it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import moebench_in_process

from moebench.store.runfolder import load_run

DATA = Path(__file__).resolve().parent / "data"
QUICK = DATA / "h200-quick"  # a GPU sweep's run folder
SPEC = "name: t\nmodels: [tiny]\nm: [1]\ndtypes: [fp16]\npaths: [torch]\n"
SWEEP = ("sweep", "--model", "tiny", "--m", "1", "--path", "torch", "--no-progress")


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(where: Path, *args: str) -> str:
    """Runs ``moebench ARGS`` in ``where``; asserts a one-line refusal, exit 2, nothing created; the line."""
    before = _tree(where)
    proc = moebench_in_process(*args, cwd=where)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert _tree(where) == before, "a refusal left something behind"
    return lines[0]


def _run_folder(parent: Path, name: str = "run", **meta_over) -> Path:
    """A copy of the committed quick run with ``meta_over`` over its meta.json."""
    run = parent / name
    run.mkdir(parents=True)
    meta = json.loads((QUICK / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, **meta_over}))
    shutil.copy(QUICK / "rows.jsonl", run / "rows.jsonl")
    return run


# ---- a seed out of range: a traceback from torch or numpy mid-run, a run folder left failed ------------------

@pytest.mark.parametrize("args", [
    ("sweep", "s.yaml"),  # seed: in a spec file
    (*SWEEP, "--seed", str(10**23)),
    ("sweep", "--model", "tiny", "--seed", "-5"),  # numpy's generators take no negative seed
    ("tune", "--model", "tiny", "--m", "1", "--seed", str(10**23)),
    ("trace", "--seed", "-1"),
], ids=["spec", "sweep", "sweep-negative", "tune", "trace"])
def test_a_seed_out_of_range_is_refused(tmp_path, args):
    (tmp_path / "s.yaml").write_text(SPEC + f"seed: {10**23}\n")
    assert "seed must be an integer from 0 to 4294967295" in _refused(tmp_path, *args)


# ---- a meta.json key of the wrong type: a traceback in plot, "run ...: 5" in report --------------------------

@pytest.mark.parametrize("command", ["report", "plot"])
@pytest.mark.parametrize("over, says", [
    ({"ceilings": "fast"}, "key 'ceilings' is string 'fast', expected object"),
    ({"ceilings": {"read_gbps": "x"}}, "ceilings['read_gbps'] is string 'x', expected a number"),
    ({"status": 5}, "key 'status' is int 5, expected string"),
    ({"interpreter": "no"}, "key 'interpreter' is string 'no', expected bool"),
], ids=["ceilings", "a-ceiling", "status", "interpreter"])
def test_a_meta_json_key_of_the_wrong_type_is_named_with_its_file(tmp_path, command, over, says):
    run = _run_folder(tmp_path / "runs", **over)
    assert _refused(tmp_path, command, str(run)) == f"error: {run / 'meta.json'}: {says}"


# ---- a run named twice: its rows counted twice without a word --------------------------------------------------

@pytest.mark.parametrize("command", ["report", "plot"])
def test_a_run_named_twice_is_refused(tmp_path, command):
    run = _run_folder(tmp_path / "base")
    assert "is named twice" in _refused(tmp_path, command, str(QUICK), str(QUICK))
    assert "is named twice" in _refused(tmp_path, command, str(tmp_path / "base"), str(run))  # it and its folder


def test_compare_still_takes_one_run_on_both_sides(tmp_path):
    proc = moebench_in_process("compare", str(QUICK), str(QUICK), "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# ---- a number option that is not finite: nan and inf read as floats and gated nothing --------------------------

@pytest.mark.parametrize("flag", ["--threshold", "--fail-slower"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_compare_refuses_a_number_that_is_not_finite_and_non_negative(tmp_path, flag, value):
    assert "is not a finite number of 0 or more" in _refused(tmp_path, "compare", str(QUICK), str(QUICK), flag, value)


# ---- a spec's list key holding another type: Python's own words ("'int' object is not iterable") ----------------

@pytest.mark.parametrize("line, says", [
    ("hf_configs: 5", "hf_configs: expected names, one or a list, got 5"),
    ("m: [[1, 2]]", "m: expected integers, one or a list, got [[1, 2]]"),
    ("m: {a: 1}", "m: expected integers, one or a list, got {'a': 1}"),
    ("dtypes: [[fp16]]", "dtypes: expected names, one or a list, got [['fp16']]"),
], ids=["scalar", "nested", "mapping", "nested-names"])
def test_a_spec_list_of_the_wrong_type_is_named(tmp_path, line, says):
    key = line.split(":")[0]
    text = "\n".join(ln for ln in SPEC.splitlines() if not ln.startswith(f"{key}:")) + f"\n{line}\n"
    (tmp_path / "s.yaml").write_text(text)
    assert _refused(tmp_path, "sweep", "s.yaml") == f"error: s.yaml: {says}"


# ---- trace: requests beyond any replay (a numpy allocation traceback), --csv and --dist both given ---------------

def test_trace_refuses_more_requests_than_it_replays_and_two_sources_of_counts(tmp_path):
    assert "--requests" in _refused(tmp_path, "trace", "--requests", str(10**12))
    (tmp_path / "t.csv").write_text("prompt_len\n5\n")
    line = _refused(tmp_path, "trace", "--csv", "t.csv", "--dist", "uniform")
    assert line == "error: --csv gives the token counts and --dist draws them: give one of the two"


# ---- a table the run reads its configs from, read only once the run has started --------------------------------

def test_trace_refuses_an_unreadable_configs_table_before_its_run_folder(tmp_path):
    from moebench.environment import device_name
    from moebench.tables.formats.moebench import file_name

    table = tmp_path / "cfg" / file_name(8, 64, device_name(), "fp16")  # the tiny shape's table here
    table.parent.mkdir()
    table.write_text("{not json")
    assert f"{table}: not JSON" in _refused(tmp_path, "trace", "--configs", "cfg", "--requests", "2")


# ---- a path that names nothing: --out "" wrote into the current folder, --html page/ a file named page ----------

@pytest.mark.parametrize("args, says", [
    ((*SWEEP, "--out", ""), "an empty path names nothing"),
    (("tune", "--model", "tiny", "--out", ""), "an empty path names nothing"),
    (("report", ""), "an empty path names nothing"),
    (("report", str(QUICK), "--html", "page/"), "ends in a slash"),
], ids=["sweep-out", "tune-out", "report-run", "html-folder"])
def test_a_path_that_names_nothing_is_refused(tmp_path, args, says):
    assert says in _refused(tmp_path, *args)


# ---- the same point named twice: run twice, two rows of one point --------------------------------------------

def test_a_point_named_twice_is_run_once(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC.replace("m: [1]", "m: [1, 1]") + "runs: [{}, {dtypes: [fp16]}]\n")
    proc = moebench_in_process("sweep", "s.yaml", "--out", "out", "--no-progress", "--format", "csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "out").iterdir()
    assert load_run(run)[1]["M"].tolist() == [1]


# ---- --ep-map without an EP degree, or with one that leaves no whole experts per rank -----------------------------

@pytest.mark.parametrize("args, spec_line, says", [
    ((*SWEEP, "--ep-map"), "", "--ep-map (ep_map: true) needs --ep (ep) above 1"),
    ((*SWEEP, "--ep", "3", "--ep-map"), "", "tiny: 8 experts are not divisible by --ep 3"),
    (("sweep", "s.yaml"), "ep_map: true", "s.yaml: --ep-map (ep_map: true) needs --ep (ep) above 1"),
    (("sweep", "s.yaml"), "ep: 2\nep_map: 1", "s.yaml: ep_map: expected true or false, got 1"),
    (("sweep", "s.yaml", "--ep-map"), "", "with a SPEC file set tp/ep/ep_map in the file"),
    (("sweep", "--model", "tiny", "--m", "1", "--dtype", "fp16", "--ep", "2", "--ep-map", "--path", "triton-classic"),
     "", "path 'triton-classic' cannot run any point of this sweep"),
], ids=["no-ep", "ep-not-dividing", "spec-no-ep", "spec-not-bool", "flag-with-spec", "no-path-runs-it"])
def test_ep_map_without_an_ep_degree_that_fits_is_refused(tmp_path, args, spec_line, says):
    (tmp_path / "s.yaml").write_text(SPEC + spec_line + "\n")
    assert says in _refused(tmp_path, *args)
