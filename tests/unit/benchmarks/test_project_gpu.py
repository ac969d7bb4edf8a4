"""``benchmarks/tools/project_gpu.py``: forcing a model onto recorded tokens, and replaying a trace's forwards.

A GPU projection stands on two claims: a target whose logits are forced onto a recorded
continuation emits exactly it, whatever its weights and whatever the drafters propose (so a
random-weight model on a GPU follows a real model's text), and a replay feeds the forwards a
trace recorded. Both are checked here on the tiny CPU models.
"""

from __future__ import annotations

import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, build_method
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed
from tests.helpers.scripts import benchmark_script


def test_forced_rows_are_the_ones_on_the_recorded_path():
    """Rows from the root (after two prompt rows) whose path spells truth[k:] get their next
    recorded token as argmax; the others keep their logits."""
    pg = benchmark_script("project_gpu")
    torch.manual_seed(0)
    # rows: prompt p0 p1 | root | a (truth) | b (not) | c under a (truth) | d under b
    tokens = [11, 12, 13, 5, 6, 7, 8]
    parents = [-1, 0, 1, 2, 2, 3, 4]
    truth, k = [9, 5, 7, 4], 1  # emitted so far: 9; the root predicts 5, then 7, then 4
    logits = torch.randn(5, 16)
    before = logits.clone()
    pg.force_logits(logits, tokens, parents, 2, truth, k)
    assert logits[0].argmax() == 5 and logits[1].argmax() == 7 and logits[3].argmax() == 4
    assert torch.equal(logits[2], before[2]) and torch.equal(logits[4], before[4])


def test_a_forced_target_emits_the_recorded_tokens_under_every_method():
    """A tiny model forced onto another model's greedy output emits that output token for token
    with ``ar``, ``pld`` and ``draft-tree`` (trees of a perturbed draft), and the forward log
    sees each step's rows; a replay of the recorded steps runs the same forwards."""
    pg = benchmark_script("project_gpu")
    model, other = TINY_MODELS["llama"](), TINY_MODELS["llama"]()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn_like(p))
    draft = perturbed(model)
    target = HFTarget(model)
    prompts = [p for p, _ in make_prompts(4, model.config.vocab_size)]
    for name in ("ar", "pld", "draft-tree"):
        drafters, composer = build_method(name, target, MethodOptions(), draft)
        engine = SpecEngine(target, drafters, composer, method=name)
        with pg.ForwardLog(target) as log:
            for prompt in prompts:
                truth = hf_greedy(other, prompt, 16)
                assert truth != hf_greedy(model, prompt, 16)  # the forcing is what makes them equal
                seq = engine.start(prompt, GenerationConfig(max_new_tokens=16, budget=8))
                start_rows = [(is_t, r) for is_t, r, _ in log.take()]
                steps = []
                while not seq.done:
                    log.force = (truth, len(seq.new_tokens))
                    before = len(seq.new_tokens)
                    engine.step(seq)
                    calls = log.take()
                    steps.append({"target_rows": [r for is_t, r, _ in calls if is_t],
                                  "draft_rows": [r for is_t, r, _ in calls if not is_t],
                                  "emitted": len(seq.new_tokens) - before})
                log.force = None
                engine.finish(seq)
                assert list(seq.new_tokens) == truth, name
                assert all(len(s["target_rows"]) == 1 for s in steps)
                if name == "draft-tree":
                    assert any(s["draft_rows"] for s in steps)
                record = {"start_rows": start_rows, "prompt_tokens": len(prompt), "steps": steps}
                drafts = HFTarget(draft) if name == "draft-tree" else None
                start_s, steps_s = pg.replay_record(target, drafts, record, torch.Generator().manual_seed(0))
                assert start_s >= 0 and steps_s > 0


def test_host_model_separates_per_step_and_per_draft_forward_work():
    pg = benchmark_script("project_gpu")

    def step(n: int, host: float) -> dict:  # n draft forwards of 5 ms, a 10 ms target forward, host seconds
        return {"wall_s": 0.01 + 0.005 * n + host, "target_s": 0.01, "draft_s": 0.005 * n, "draft_rows": [1] * n}

    gpu = [
        {"variant": "a", "steps": [step(0, 0.0)] + [step(1, 0.002 + 0.001)] * 5},
        {"variant": "b", "steps": [step(0, 0.0)] + [step(8, 0.001 + 0.008)] * 5},
        {"variant": "c", "steps": [step(0, 0.0)] + [step(0, 0.0005)] * 5},
    ]
    base, per_draft = pg.host_model(gpu)
    # the slope through the drafting steps: (0.009 - 0.003) / (8 - 1); each variant's base the rest
    assert abs(per_draft - 0.006 / 7) < 1e-9
    assert abs(base["a"] - (0.003 - per_draft)) < 1e-9 and abs(base["b"] - (0.009 - 8 * per_draft)) < 1e-9
    assert abs(base["c"] - 0.0005) < 1e-9
