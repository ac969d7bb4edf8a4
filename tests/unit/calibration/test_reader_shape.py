"""READER's shape search (``calibration/reader_shape.py``): slot acceptance, predictions, the file."""

import json

import pytest

from specgraft.calibration.reader_shape import (
    BatchTuning, SearchRecord, SlotRecord, batch_budget, batch_step_s, load_shape, plain_choice, predict, save_shape, search_shape,
    search_tree_size,
)
from specgraft.methods.reader_shape_file import load_batch_budgets


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


def search_record() -> SearchRecord:
    rec = SearchRecord()
    # step 1: the target said 5 9 4; the tree's best-first paths (5,), (5, 9), (2,), (5, 9, 4)
    rec.add([(5,), (5, 9), (2,), (5, 9, 4)], accepted=[5, 9, 4], draft_s=0.01, seed_nodes=4)
    # step 2: retrieval found one node, rejected
    rec.add([(7,)], accepted=[], draft_s=0.01, seed_nodes=4)
    return rec


def test_search_record_slots_are_best_first_prefixes():
    rec = search_record()
    assert rec.nodes == [[1, 2, 0, 3], [0, 0, 0, 0]] and rec.sizes == [4, 1]
    assert [rec.mean_tokens(n) for n in (0, 1, 2, 3, 4)] == [1.0, 1.5, 2.0, 2.0, 2.5]
    assert rec.acceptance() == {"search": [0.5, 0.5, 0.0, 0.5]}
    # a step verifies the nodes it had, at most the size: step 2 had one
    assert rec.mean_verify_s([0.0, 1.0, 2.0, 3.0, 4.0], 3) == (3 + 1) / 2


def test_batch_step_pays_for_the_largest_tree():
    verify = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert batch_step_s(verify, [4, 0], batch=1) == 3.0
    # eight sequences: almost every group holds a 4-node tree, so the step costs ~verify[4]
    assert batch_step_s(verify, [4, 0], batch=8) == pytest.approx(5.0 - 4.0 / 2**8)
    assert batch_step_s(verify, [0, 0], batch=8) == 1.0
    with pytest.raises(ValueError, match="batch must be >= 1"):
        batch_step_s(verify, [0], batch=0)


def test_tree_size_per_batch_size_and_plain_fallback():
    rec = search_record()
    # one sequence: rows nearly free, the whole tree pays
    cheap = [1.0, 1.01, 1.02, 1.03, 1.04]
    best = search_tree_size(rec, cheap, 4, d_search=16)[0]
    assert (best.search_nodes, best.nodes, best.predicted_tokens_per_step) == (4, 4, 2.5)
    assert batch_budget(best, plain_choice(cheap)) == 4
    # eight sequences whose extra rows cost nearly a step each: plain decoding wins, budget 0
    dear = [1.0, 1.9, 2.8, 3.7, 4.6]
    at8 = search_tree_size(rec, dear, 4, d_search=16, batch=8)
    plain = plain_choice(dear, 8)
    assert plain.predicted_tokens_per_s == 8.0 and at8[0].predicted_tokens_per_s < plain.predicted_tokens_per_s
    assert batch_budget(at8[0], plain) == 0
    # the batch counts B x tokens over one step that drafts for all B
    c = at8[0]
    assert c.predicted_tokens_per_s == pytest.approx(8 * c.predicted_tokens_per_step / c.predicted_step_s)


def test_file_with_batch_budgets(tmp_path):
    rec = search_record()
    ident = {"model": "m", "draft_model": None, "preset": "cpu"}
    verify = {1: [1.0, 1.01, 1.02, 1.03, 1.04], 8: [1.0, 1.9, 2.8, 3.7, 4.6]}
    tuned = {b: BatchTuning(search_tree_size(rec, v, 4, 16, batch=b)[0], plain_choice(v, b), v) for b, v in verify.items()}
    path = save_shape(tmp_path / "s.json", {**ident, "device": "cpu"}, tuned[1].best, rec, verify[1], (0, 16, 0), {"method": "reader-search"},
                      by_batch=tuned, shape_extra={"min_match": 2})
    assert load_shape(path, ident) == {"draft_nodes": 0, "d_search": 16, "d_deep": 0, "search_nodes": 4, "min_match": 2}
    assert load_batch_budgets(path) == {1: 4, 8: 0}
    with pytest.raises(ValueError, match="tunes reader-search"):
        predict(path, 1, 0, 0)
    # a file of one batch size has no table; a broken table is an error
    one = save_shape(tmp_path / "one.json", ident, tuned[1].best, rec, verify[1], (0, 16, 0), {})
    assert load_batch_budgets(one) == {}
    data = json.loads(path.read_text())
    data["by_batch"]["8"] = {"budget": -1}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="budgets >= 0"):
        load_batch_budgets(tmp_path / "bad.json")
    from specgraft.methods.reader import tuned_policy

    policy = tuned_policy("reader-search", str(path))
    assert [policy.plan(b, [4] * b).cap for b in (1, 4, 8, 12)] == [4, 4, 0, 0]
    assert tuned_policy("pld", str(path)) is None and tuned_policy("reader-search", str(one)) is None
