"""Graft and its ablation variants: stage splits, templates, losslessness, calibration, registry.

Tiny fp32 models (the draft model is a perturbed copy of the target); ``TableLM`` stubs set
draft confidences exactly where a test needs a given pruning stage.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Sequence

import numpy as np
import pytest
import torch

from specgraft.calibration import CALIBRATED_VARIANTS, load_calibration, run_calibration, save_calibration
from specgraft.calibration.fit import choose_thresholds
from specgraft.composers.graft import GraftComposer, GraftConfig, StagePlanner, plan_budget
from specgraft.methods.graft import GRAFT_BEHAVIOUR, graft_config
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.draft_model import PRESETS, DraftModelDrafter, DraftTreeConfig, ModelDraft
from specgraft.drafters.graft_retrieval import GraftRetrieval
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.engine import SpecEngine
from specgraft.methods import GRAFT_METHODS, METHODS, GraftOptions, MethodOptions
from specgraft.methods.graft import build_graft_method
from specgraft.models.hf import HFTarget
from specgraft.tree.build import merge_drafts
from specgraft.tree.templates import FULL_ENVELOPE, STAGE_TEMPLATES, rank_template
from specgraft.types import Draft

from tests.helpers.calibration import corpus_records, make_calibration
from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed, tiny_llama, tiny_tokenizer
from tests.helpers.stubs import TableLM, Vocab, begin, peaked_table

MAX_NEW = 24
N_PROMPTS = 20
VARIANTS = list(GRAFT_BEHAVIOUR)
GRAFT_ONLY = [v for v in VARIANTS if v != "draft-tree"]


pytestmark = pytest.mark.usefixtures("one_thread")


class StageRecorder:
    """Wraps a drafter and counts the pruning stage of each draft it proposes."""

    def __init__(self, inner: DraftModelDrafter):
        self.inner = inner
        self.name = inner.name
        self.needs_hidden = inner.needs_hidden
        self.stages: Counter = Counter()

    def __getattr__(self, name):
        """The wrapped drafter's capabilities (``Drafter``'s declared attributes) and methods."""
        return getattr(self.inner, name)

    def prefill_request(self):
        return self.inner.prefill_request()

    def begin(self, prompt, prefill, config):
        return self.inner.begin(prompt, prefill, config)

    def propose(self, state, context, budget):
        draft = self.inner.propose(state, context, budget)
        self.stages[draft.stage] += 1
        return draft

    def observe(self, state, step) -> None:
        self.inner.observe(state, step)

    def end(self, state) -> None:
        self.inner.end(state)


# ---- templates and stage splits -----------------------------------------------------------


def test_templates_have_table7_depth_counts():
    plan = plan_budget(GraftConfig(), 60)
    assert plan.k_draft == (8, 24, 40) and plan.k_ret == (52, 36, 20)
    for template, name in zip(plan.stage_templates, ("d0", "d1", "d5"), strict=True):
        assert template.depth_counts() == list(STAGE_TEMPLATES[name])
    full = rank_template(FULL_ENVELOPE, 8)
    assert full.depth_counts() == [8, 16, 14, 11, 8, 7, 6, 5, 5] and len(full) == 80
    # the envelope holds the full template and every stage template
    envelope = set(plan.envelope.rank_paths)
    assert set(full.rank_paths) <= envelope
    for template, nodes in zip(plan.stage_templates, plan.stage_nodes, strict=True):
        assert [plan.envelope.rank_paths[i] for i in nodes] == template.rank_paths
    # scaled budgets keep the split exact
    for budget in (8, 16, 24, 32):
        plan = plan_budget(GraftConfig(), budget)
        assert [len(t) for t in plan.stage_templates] == list(plan.k_ret)
        assert all(kd + kr == budget for kd, kr in zip(plan.k_draft, plan.k_ret, strict=True))


def test_envelope_part_equals_filling_the_stage_template():
    """Filling the envelope once and taking the stage's part == filling the stage template."""
    rng = np.random.default_rng(0)
    matrix = SuccessorMatrix(50, k=8)
    # distinct successors per row, as a top-k gives
    matrix.table[:] = np.stack([rng.permutation(50)[:8] for _ in range(50)])
    matrix.table[rng.choice(50, 10, replace=False)] = -1  # unknown rows drop their sub-trees
    planner = StagePlanner(GraftConfig())
    retrieval = GraftRetrieval(50, planner, matrix)
    for budget in (24, 60):
        plan = planner.plan(budget)
        for root in range(50):
            envelope = retrieval.propose(begin(retrieval, [root]), [root], budget)
            for stage, template in enumerate(plan.stage_templates):
                in_stage = set(plan.stage_nodes[stage].tolist())
                part = envelope.subset([i for i, t in enumerate(envelope.template_nodes) if t in in_stage])
                toks, pars = matrix.fill_template(root, template)
                assert paths(part.tokens, part.parents) == paths(toks, pars)


def paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for t, p in zip(tokens, parents, strict=True):
        out.append((out[p] if p >= 0 else ()) + (t,))
    return sorted(out)


STUB_VOCAB = 4096


def stub_method(variant: str, preset: str, thresholds):
    """Drafters and composer over a stub draft model whose every row puts 0.5 on its top token
    (so ``c_d = 0.5 ** (d + 1)``), drafting tokens below 2048, with a matrix of tokens >= 2048:
    retrieved nodes never coincide with draft nodes, so the counts below are exact."""
    lm = TableLM(peaked_table(0.5, STUB_VOCAB, 0, 2048), STUB_VOCAB)
    # the stages alone: no early stop, no cost-aware cut (draft-tree's)
    options = GraftOptions(preset=preset, thresholds=thresholds, stop_min=0.0, row_cost=0.0)
    drafters, composer = build_graft_method(variant, Vocab(STUB_VOCAB), options, draft_model=lm)
    if len(drafters) > 1:
        drafters[1].matrix.table[:] = 2048 + (np.arange(STUB_VOCAB)[:, None] * 8 + np.arange(8)) % 2048
    return drafters, composer


@pytest.mark.parametrize("preset", ["gpu", "cpu"])
def test_each_stage_yields_its_split(preset):
    budget = PRESETS[preset].budget
    c = [0.5 ** (d + 1) for d in PRESETS[preset].checkpoints]
    # thresholds that stop at checkpoint 0, 1, 2, or never
    gates = {0: (0.6, 0.0, 0.0), 1: (c[0] - 0.01, c[1] + 0.01, 0.0), 2: (c[0] - 0.01, c[1] - 0.01, c[2] + 0.001), None: (0.0, 0.0, 0.0)}
    plan = plan_budget(GraftConfig(), budget)
    context = [3, 1, 4, 1, 5]
    for variant in VARIANTS:
        for want_stage, thresholds in gates.items():
            drafters, composer = stub_method(variant, preset, thresholds)
            drafts = [d.propose(begin(d, context), context, budget) for d in drafters]
            tree = composer.build(drafts, budget)
            split = Counter(tree.sources)
            stage = {"graft-fixed": 1, "graft-root": 2, "graft-tail": 2}.get(variant, want_stage if variant in ("graft", "graft-prune") else None)
            if stage is None:
                want = {"draft": budget}
            elif variant == "graft-prune":
                want = {"draft": plan.k_draft[stage]}
            else:
                want = {"draft": plan.k_draft[stage], "retrieval": plan.k_ret[stage]}
            assert dict(split) == want, f"{preset}/{variant} at stage {want_stage}: {dict(split)} != {want}"
            assert len(tree) <= budget
            if variant == "graft-tail" and stage is not None:
                # retrieved nodes hang below the end of the best draft path, none at the root
                assert all(tree.sources[p] == "draft" or tree.sources[i] == "retrieval" for i, p in enumerate(tree.parents) if p >= 0)
                assert all(tree.sources[i] == "draft" for i, p in enumerate(tree.parents) if p < 0)


# ---- losslessness -------------------------------------------------------------------------


def median_confidences(draft_model, prompts) -> tuple[float, ...]:
    """Median ``c_d`` at the cpu preset's checkpoints: thresholds that make every stage occur."""
    drafter = DraftModelDrafter(draft_model, DraftTreeConfig(depth=3, top_k=4, checkpoints=PRESETS["cpu"].checkpoints))
    conf = []
    for prompt, _ in prompts:
        state = begin(drafter, prompt)
        conf.append(drafter.draft_pool(state, prompt).confidences)
        drafter.end(state)
    return tuple(float(x) for x in np.median(np.array(conf), axis=0))


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_graft_variants_greedy_equal_plain_decoding(arch):
    model = TINY_MODELS[arch]()
    draft = perturbed(model)
    vocab = model.config.vocab_size
    prompts = make_prompts(N_PROMPTS, vocab)
    references = [hf_greedy(model, p, MAX_NEW) for p, _ in prompts]
    thresholds = median_confidences(draft, prompts)
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=16)
    target = HFTarget(model)
    for variant in GRAFT_ONLY:
        options = GraftOptions(depth=3, top_k=4, thresholds=thresholds, stop_min=0.0)  # the gates alone
        drafters, composer = build_graft_method(variant, target, options, draft_model=draft)
        recorder = StageRecorder(drafters[0])
        engine = SpecEngine(target, [recorder, *drafters[1:]], composer, method=variant)
        mats = []
        accepted, proposed = Counter(), Counter()
        for (prompt, _), reference in zip(prompts, references, strict=True):
            got = engine.generate_ids(prompt, config)
            assert got == reference, f"{arch}/{variant} diverged from plain greedy on {prompt}"
            mats.append(engine.last_stats.mat)
            accepted.update(engine.last_stats.accepted_by_source)
            proposed.update(engine.last_stats.proposed_by_source)
        assert sum(mats) / len(mats) > 1.5, f"{arch}/{variant}: mean MAT {sum(mats) / len(mats):.2f}; drafts were not accepted"
        assert accepted["draft"] > 0
        if variant != "graft-prune":
            # retrieved nodes are verified; where they share the budget with many draft nodes
            # (ROOT, TAIL: a 5-node branch beside 11 draft nodes of a near-copy draft model)
            # they need not win here, but with the larger retrieval shares they must
            assert proposed["retrieval"] > 0, f"{arch}/{variant}: no retrieved node was ever verified"
            if variant in ("graft", "graft-fixed"):
                assert accepted["retrieval"] > 0, f"{arch}/{variant}: no retrieved node was ever accepted"
        if variant in ("graft", "graft-prune"):
            assert len(recorder.stages) >= 3, f"{arch}/{variant}: stages {dict(recorder.stages)}; the gates must vary"


def test_graft_sampling_is_seeded_and_uses_rejection():
    model = tiny_llama()
    draft = perturbed(model)
    target = HFTarget(model)
    options = GraftOptions(sample_drafts=True, thresholds=(0.0, 1.0, 1.0), seed=5)  # every step prunes after depth 1
    config = GenerationConfig(max_new_tokens=20, budget=16, sampling=SamplingConfig(temperature=1.0, seed=2))
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    drafters, composer = build_graft_method("graft", target, options, draft_model=draft)
    engine = SpecEngine(target, drafters, composer, method="graft")
    outputs = [engine.generate_ids(prompt, config) for _ in range(2)]
    assert outputs[0] == outputs[1], "same seeds, same output: what a request learns starts afresh in the next"
    # steps in, until the sequence's matrix knows the root's row (retrieval then offers nodes)
    seq = engine.start(prompt, config)
    for _ in range(12):
        engine.step(seq)
        drafts = [d.propose(state, seq.context, 16) for d, state in zip(drafters, seq.drafter_states, strict=True)]
        if len(drafts[1]):
            break
    tree = composer.build(drafts, 16)
    engine.finish(seq)
    assert tree.draft_probs is not None and any(r >= 0 for r in tree.prob_rows), "sampled draft nodes keep their q rows"
    retrieved = [i for i, s in enumerate(tree.sources) if s == "retrieval"]
    assert retrieved and all(tree.prob_rows[i] == -1 for i in retrieved), "retrieved nodes: sample-and-match (row -1)"


def test_parents_of_retrieved_nodes_fall_back_to_sample_and_match():
    q = torch.tensor([[0.5, 0.2, 0.2, 0.1]])
    sampled = ModelDraft(source="draft", tokens=[0, 1, 2], parents=[-1, -1, 0], draft_probs=q, prob_rows=[0, 0, 0])
    # a retrieved root child that repeats a sampled one, and a new child under node 1
    retrieved = Draft(source="retrieval", tokens=[1, 3], parents=[-1, 0])
    tree = merge_drafts([sampled, retrieved], 8)
    assert tree.tokens == [0, 1, 2, 3] and tree.parents == [-1, -1, 0, 1]
    assert tree.prob_rows == [-1, -1, 0, -1], "root children and node 1's child: sample-and-match; node 0's child keeps q"
    # TAIL: a draft anchored at the path 0 -> 2 changes nothing above the node it hangs from
    tail = Draft(source="retrieval", tokens=[3], parents=[-1], anchor=(0, 2))
    tree = merge_drafts([sampled, tail], 8)
    assert tree.tokens == [0, 1, 2, 3] and tree.parents == [-1, -1, 0, 2]
    assert tree.prob_rows == [0, 0, 0, -1]
    # an offer that is never admitted still decides the rule (here: no budget left for it)
    tree = merge_drafts([sampled], 3, offers=[Draft(source="retrieval", tokens=[3], parents=[-1], anchor=(0,))])
    assert tree.prob_rows == [0, 0, -1]
    # an anchor path the tree does not hold: the draft is dropped
    assert merge_drafts([sampled, Draft("retrieval", [3], [-1], anchor=(3, 3))], 8).tokens == [0, 1, 2]


# The statistical sampling tests of every variant (and their negative control) are in
# tests/lossless/test_graft_sampling.py.


# ---- calibration --------------------------------------------------------------------------


def test_choose_thresholds_prunes_only_when_it_pays():
    conf = np.array([[0.1], [0.2], [0.8], [0.9]])
    # pruning at the root loses nothing on low-confidence steps and saves 3 of 4 draft forwards
    accepted = np.array([[0, 0], [0, 0], [1, 3], [1, 3]])
    choice = choose_thresholds(conf, accepted, [1, 4], t_verify=1.0, t_draft=0.4)
    assert choice.thresholds == (0.2,) and choice.stage_share == (0.5, 0.5)
    assert choice.tokens_per_s > choice.dense_tokens_per_s
    # free drafting: never prune
    choice = choose_thresholds(conf, accepted, [1, 4], t_verify=1.0, t_draft=0.0)
    assert choice.thresholds == (0.0,) and choice.stage_share == (0.0, 1.0)
    # free drafting, but a pruned tree is smaller and verifies in half the time (a CPU): prune
    # the steps where the dense tree gains nothing
    per_stage = np.array([[0.5, 1.0]] * 4)
    choice = choose_thresholds(conf, accepted, [1, 4], t_verify=per_stage, t_draft=0.0)
    assert choice.thresholds == (0.2,) and choice.stage_share == (0.5, 0.5)
    assert choice.tokens_per_s == pytest.approx((1 + 1 + 4 + 4) / (0.5 + 0.5 + 1 + 1))


def test_calibration_round_trip_and_use(tmp_path):
    cal = make_calibration()
    path = save_calibration(cal, tmp_path / "calib.json")
    assert path.with_suffix(".npz").is_file()
    loaded = load_calibration(path, vocab_size=96)
    assert loaded.thresholds == cal.thresholds and loaded.checkpoints == cal.checkpoints
    assert np.array_equal(loaded.matrix.table, cal.matrix.table) and loaded.matrix.k == 8
    assert loaded.costs == cal.costs and loaded.draft == cal.draft and loaded.meta == cal.meta
    # a method built from the file uses its thresholds and its matrix
    draft = tiny_llama()
    for variant in ("graft", "graft-prune"):
        drafters, composer = build_graft_method(variant, Vocab(96), GraftOptions(calibration=str(path)), draft_model=draft)
        assert drafters[0].config.thresholds == cal.thresholds[variant]
    drafters, _ = build_graft_method("graft", Vocab(96), GraftOptions(calibration=str(path)), draft_model=draft)
    assert np.array_equal(drafters[1].matrix.table, cal.matrix.table), "the retrieval drafter shares the calibration's matrix"
    drafters, _ = build_graft_method("graft", Vocab(96), GraftOptions(calibration=str(path), thresholds=(0.5, 0.5, 0.5)), draft_model=draft)
    assert drafters[0].config.thresholds == (0.5, 0.5, 0.5)


def test_calibration_file_errors(tmp_path):
    draft = tiny_llama()
    with pytest.raises(ValueError, match="does not exist"):
        build_graft_method("graft", Vocab(96), GraftOptions(calibration=str(tmp_path / "missing.json")), draft_model=draft)
    path = save_calibration(make_calibration(), tmp_path / "c.json")
    with pytest.raises(ValueError, match="vocabulary is 90"):
        load_calibration(path, vocab_size=90)
    with pytest.raises(ValueError, match="made for checkpoints"):
        build_graft_method("graft", Vocab(96), GraftOptions(calibration=str(path), preset="gpu"), draft_model=draft)
    with pytest.raises(ValueError, match=r"\.json name"):
        save_calibration(make_calibration(), tmp_path / "c.npz")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_calibration(bad)
    bad.write_text(json.dumps({"thresholds": {}}))
    with pytest.raises(ValueError, match="not a specgraft Graft calibration file"):
        load_calibration(bad)
    data = json.loads(path.read_text())
    data["thresholds"]["graft"] = [0.1]
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="must be 3 values"):
        load_calibration(bad)
    path.with_suffix(".npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable"):
        load_calibration(path)
    path.with_suffix(".npz").unlink()
    with pytest.raises(ValueError, match="does not exist"):
        load_calibration(path)


def test_run_calibration_end_to_end(tmp_path):
    model = tiny_llama()
    draft = perturbed(model)
    tokenizer = tiny_tokenizer()
    target = HFTarget(model)
    records = corpus_records(8)
    prompts = [tokenizer(p + " " + r[:20])["input_ids"] for p, r in records[6:]]
    checkpoints = PRESETS["cpu"].checkpoints
    cal = run_calibration(
        target, draft, tokenizer, records[:6], prompts, depth=3, top_k=3, checkpoints=checkpoints, budget=10,
        max_new_tokens=12, progress=False,
    )
    assert set(cal.thresholds) == set(CALIBRATED_VARIANTS) and all(len(t) == len(checkpoints) for t in cal.thresholds.values())
    assert cal.report["steps"] >= 2 and cal.costs["draft_forward_s"] > 0 and cal.costs["verify_s"] > 0
    assert (cal.matrix.table[:, 0] >= 0).sum() > 10, "the warm-up must fill matrix rows"
    path = save_calibration(cal, tmp_path / "tiny.json")
    # a method built from the file stays lossless
    drafters, composer = build_graft_method("graft", target, GraftOptions(calibration=str(path), depth=3, top_k=3), draft_model=draft)
    assert drafters[0].config.thresholds == cal.thresholds["graft"]
    engine = SpecEngine(target, drafters, composer, method="graft")
    prompt = prompts[0]
    assert engine.generate_ids(prompt, GenerationConfig(max_new_tokens=16, budget=10)) == hf_greedy(model, prompt, 16)


def test_calibrate_command(tmp_path, tiny_model_dir):
    import typer
    from typer.testing import CliRunner

    from specgraft.cli.calibrate import calibrate

    app = typer.Typer()
    app.command()(calibrate)
    app.command("noop")(lambda: None)  # a second command keeps `calibrate` a named subcommand
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"turns": [p], "response": r}) + "\n" for p, r in corpus_records(5)))
    out = tmp_path / "calib.json"
    args = ["calibrate", "--model", tiny_model_dir, "--draft-model", tiny_model_dir, "--corpus", str(corpus), "--out", str(out),
            "--prompts", "2", "--max-new-tokens", "8", "--budget", "10", "--dtype", "float32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cal = load_calibration(out, vocab_size=96)
    assert cal.meta["draft_model"] == tiny_model_dir and cal.checkpoints == PRESETS["cpu"].checkpoints
    assert cal.meta["warm_records"] == 3 and cal.meta["prompts"] == 2, "per corpus: warm-up records first, then prompts"
    # a second calibration starts from the first one's matrix and warms up no further
    again = tmp_path / "again.json"
    result = CliRunner().invoke(app, [*args[:args.index("--out") + 1], str(again), *args[args.index("--out") + 2:], "--matrix", str(out.with_suffix(".npz")), "--limit", "0"])
    assert result.exit_code == 0, result.output
    second = load_calibration(again, vocab_size=96)
    assert second.meta["warm_records"] == 0 and second.meta["start_matrix"] == str(out.with_suffix(".npz"))
    known = lambda c: set(np.flatnonzero(c.matrix.table[:, 0] >= 0).tolist())  # noqa: E731
    assert known(cal) <= known(second), "rows the first calibration knew are still known: it started from that matrix"
    result = CliRunner().invoke(app, [*args[:-8], "--method", "draft-tree"])
    assert isinstance(result.exception, ValueError) and "calibration is for graft or graft-prune" in str(result.exception)


# ---- the registry -------------------------------------------------------------------------


def test_registry_entries_build_from_method_options(tiny_model_dir):
    assert sorted(m for m in METHODS if METHODS[m].needs_draft_model and not m.startswith("reader")) == sorted(GRAFT_METHODS) == sorted(VARIANTS)
    options = MethodOptions(graft=GraftOptions(draft_model=tiny_model_dir, draft_dtype="float32"))
    model = tiny_llama()
    target = HFTarget(model)
    drafters, composer = METHODS["graft"].build(target, options)
    again, _ = METHODS["graft-tail"].build(target, options)
    assert drafters[0].lm.model is again[0].lm.model, "decoders alive together share the loaded draft model"
    engine = SpecEngine(target, drafters, composer, method="graft")
    prompt = [5, 6, 7, 5, 6, 7]
    assert engine.generate_ids(prompt, GenerationConfig(max_new_tokens=12, budget=16)) == hf_greedy(model, prompt, 12)
    with pytest.raises(ValueError, match="needs a draft model"):
        METHODS["draft-tree"].build(target, MethodOptions())
    # a loaded model passed to build is used as it is
    own = tiny_llama(seed=3)
    drafters, _ = METHODS["draft-tree"].build(target, MethodOptions(), own)
    assert drafters[0].lm.model is own


def test_variant_names_are_validated():
    with pytest.raises(ValueError, match="unknown Graft variant"):
        graft_config("graft-everything")
    with pytest.raises(ValueError, match="unknown Graft variant"):
        build_graft_method("graft-everything", Vocab(96), GraftOptions(), draft_model=tiny_llama())


# ---- refilling freed slots ----------------------------------------------------------------


def refill_tree(refill_min_prior: float):
    """Stage 0 at K = 8 (1 draft node, 7 retrieved) where the draft's node repeats the root's
    rank-0 successor, so one retrieved node merges into it. Returns the tree, the plan, the
    envelope priors by rank path and the matrix."""
    from specgraft.tree.templates import node_priors

    config = GraftConfig(variant="graft", refill_min_prior=refill_min_prior)
    planner = StagePlanner(config)
    matrix = SuccessorMatrix(64, k=8)
    matrix.table[:] = (np.arange(64)[:, None] * 8 + np.arange(8) + 13) % 64
    matrix.table[1] = [5, 6, 7, 8, 9, 10, 11, 12]
    retrieval = GraftRetrieval(64, planner, matrix)
    envelope = retrieval.propose(begin(retrieval, [0, 1]), [0, 1], 8)
    draft = ModelDraft(source="draft", tokens=[5], parents=[-1], scores=[0.0], stage=0)
    tree = GraftComposer(config, planner).compose(draft, envelope, 8, stage=0)
    plan = planner.plan(8)
    prior = dict(zip(plan.envelope.rank_paths, node_priors(plan.envelope), strict=True))
    return tree, plan, prior, matrix


def token_paths(tree) -> set[tuple[int, ...]]:
    paths: dict[int, tuple[int, ...]] = {}
    for i, (tok, p) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        paths[i] = (paths[p] if p >= 0 else ()) + (tok,)
    return set(paths.values())


def filled(matrix: SuccessorMatrix, root: int, rank_path: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens a rank path reaches from ``root``."""
    out, tok = [], root
    for r in rank_path:
        tok = int(matrix.table[tok, r])
        out.append(tok)
    return tuple(out)


def test_retrieval_refills_slots_freed_by_merged_nodes():
    tree, plan, prior, matrix = refill_tree(0.02)
    assert plan.k_draft[0] == 1 and plan.k_ret[0] == 7
    # the stage template's rank-0 root child merged into the draft node: its slot is refilled
    assert len(tree) == 8 and Counter(tree.sources) == {"draft": 1, "retrieval": 7}
    stage = set(plan.stage_templates[0].rank_paths)
    # every stage node is in the tree, and so is the best envelope node outside the stage
    refill = [p for p in plan.envelope.rank_paths if p not in stage and prior[p] >= 0.02]
    best = max(refill, key=lambda p: (prior[p], -len(p)))
    in_tree = token_paths(tree)
    for path in stage | {best}:
        assert filled(matrix, 1, path) in in_tree, f"rank path {path} missing"


def test_refill_floor_leaves_slots_empty():
    tree, plan, _, matrix = refill_tree(0.99)
    # only the stage template is offered: the merged node's slot stays empty
    assert len(tree) == 7 and Counter(tree.sources) == {"draft": 1, "retrieval": 6}
    assert token_paths(tree) == {filled(matrix, 1, p) for p in plan.stage_templates[0].rank_paths}
