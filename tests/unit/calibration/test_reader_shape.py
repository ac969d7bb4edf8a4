"""READER's shape search (``calibration/reader_shape.py``): slot acceptance, predictions, the file."""

import json

import pytest

from specgraft.calibration.reader_shape import SlotRecord, load_shape, predict, save_shape, search_shape


def record() -> SlotRecord:
    rec = SlotRecord()
    seed = (2, 3, 2)
    # step 1: the target said 5 9 4 7; draft paths (5,), (5, 9); widening 5 9 4; deepening after (5,): 9 8
    rec.add([(5,), (5, 9)], [5, 9, 4], [5], [9, 8], accepted=[5, 9, 4], draft_s=0.1, seed=seed)
    # step 2: the target said 3; nothing matched
    rec.add([(2,), (2, 1)], [6], [2], [1], accepted=[], draft_s=0.3, seed=seed)
    return rec


def test_slots_and_predicted_tokens():
    rec = record()
    assert rec.draft == [[1, 2], [0, 0]]
    assert rec.widen == [[1, 2, 3], [0, 0, 0]]
    assert rec.deep == [[2, 0], [0, 0]]  # deep:1 = (5, 9) accepted, deep:2 = (5, 9, 8) not
    assert rec.mean_tokens(2, 0, 0) == 1 + (2 + 0) / 2
    assert rec.mean_tokens(1, 3, 0) == 1 + (3 + 0) / 2
    assert rec.mean_tokens(1, 0, 1) == 1 + (2 + 0) / 2
    assert rec.acceptance()["widen"] == [0.5, 0.5, 0.5]
    # each step is costed at the nodes it had: step 2's paths were shorter than the shape
    assert rec.sizes == [(2, 3, 2), (2, 1, 1)]
    assert rec.mean_verify_s(list(range(8)), 2, 3, 2) == ((2 + 3 + 2) + (2 + 1 + 1)) / 2


def test_search_prefers_tokens_per_second():
    rec = record()
    cheap_rows = [0.1] * 8  # rows are free: the biggest shape wins
    best = search_shape(rec, cheap_rows, (2, 3, 2))[0]
    assert (best.draft_nodes, best.d_search, best.d_deep) == (1, 3, 0) and best.predicted_tokens_per_step == 2.5
    costly = [0.1 + 1.0 * n for n in range(8)]  # every row costs a step: one draft node
    best = search_shape(rec, costly, (2, 3, 2))[0]
    assert (best.draft_nodes, best.d_search, best.d_deep) == (1, 0, 0)


def test_file_round_trip_and_identity(tmp_path):
    rec = record()
    ident = {"model": "m", "draft_model": "d", "preset": "cpu"}
    choice = search_shape(rec, [0.1] * 8, (2, 3, 2))[0]
    path = save_shape(tmp_path / "s.json", {**ident, "device": "cpu"}, choice, rec, [0.1] * 8, (2, 3, 2), {})
    assert load_shape(path, ident) == {"draft_nodes": choice.draft_nodes, "d_search": choice.d_search, "d_deep": choice.d_deep}
    assert predict(path, 2, 0, 0).predicted_tokens_per_step == 2.0
    with pytest.raises(ValueError, match="outside the tuned seed"):
        predict(path, 3, 0, 0)
    with pytest.raises(ValueError, match="tuned for another setup: model 'm' \\(now 'x'\\)"):
        load_shape(path, {**ident, "model": "x"})
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a READER shape file"):
        load_shape(tmp_path / "bad.json")
