"""``best.json`` has one writer and one reader (``store.best``): what the tune writes reads back entry for entry,
files that are not a tune's are refused in one line, and a tuned sweep pins the fastest of the three timed."""

from __future__ import annotations

import json

import pytest

from moebench.store.best import BEST_FILE, BestFileError, fastest_entries, read_best, write_best

A = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64}
B = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}
C = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64}


def _write(tmp_path, configs):
    write_best(tmp_path, kernel="triton", model="m", shape={"name": "m", "experts": 8}, dtype="bf16",
               configs=configs, check={}, traffic={})


def test_what_the_writer_writes_the_reader_reads_with_int_keys_in_order(tmp_path):
    _write(tmp_path, {16: {"config": A, "time_us": 5.0, "default": B, "default_us": 6.0},
                      2: {"config": C, "time_us": 1.0}})
    best = read_best(tmp_path)
    assert list(best["configs"]) == [2, 16]  # keys are ints, sorted, whatever order they were given in
    assert best["configs"][16]["config"] == A and best["configs"][16]["default_us"] == 6.0
    assert best["configs"][2]["known"] is None  # every entry carries every field
    assert best["kernel"] == "triton" and best["model"] == "m"


@pytest.mark.parametrize("text, why", [
    ("{not json", "no readable"),  # broken JSON
    ("[]", "not a tune's"),  # valid JSON, not a mapping
    ('{"configs": {"one": {}}}', "not an integer"),  # an M that is no number
    ('{"configs": {"4": 7}}', "not a mapping"),  # an entry that is no mapping
    ("[" * 100_000 + "]" * 100_000, "no readable"),  # nesting deep enough to exhaust the parser's recursion
])
def test_a_file_that_is_not_a_tunes_is_refused_in_one_line(tmp_path, text, why):
    (tmp_path / BEST_FILE).write_text(text)
    with pytest.raises(BestFileError, match=why) as e:
        read_best(tmp_path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_the_fastest_of_choice_default_and_known_is_pinned_and_untimed_falls_back_to_the_choice(tmp_path):
    _write(tmp_path, {1: {"config": A, "time_us": 5.0, "default": B, "default_us": 4.0, "known": C, "known_us": 6.0},
                      2: {"config": A, "time_us": 5.0, "default": B, "default_us": 7.0, "known": C, "known_us": 3.0},
                      4: {"config": A},  # nothing timed: the choice
                      8: {"config": None}})  # nothing chosen: no pin
    assert fastest_entries(read_best(tmp_path)) == {1: B, 2: C, 4: A}


def test_the_file_is_json_a_person_can_read(tmp_path):
    _write(tmp_path, {1: {"config": A, "time_us": 5.0}})
    raw = json.loads((tmp_path / BEST_FILE).read_text())
    assert raw["configs"]["1"]["config"] == A and raw["shape"]["experts"] == 8
