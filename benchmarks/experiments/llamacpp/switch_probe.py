"""Prompt lookup first, the draft tree where lookup expects little: a prototype switch (NOTES.md,
*A draft model in Q4_0*), timed beside ``ar``, ``pld`` and ``draft-tree`` in one process.

    python benchmarks/experiments/llamacpp/switch_probe.py spec-bench:1,humaneval:1,code-edit:1 0.3,1.0

Each step ``pld`` proposes; when the sum of its nodes' estimated acceptance reaches tau its tree
is verified, else the draft tree's (the draft model catches up on the skipped tokens at its next
forward). Greedy outputs stay the target's whatever the switch picks.
"""
import sys, time
import torch
from specgraft import SpecDecoder
from specgraft.methods import GraftOptions, MethodOptions
from specgraft.suites import load_suite
from specgraft.engine import SpecEngine
from specgraft.composers.base import MergeComposer

class CopyFirst:
    name = "copy-first"
    needs_hidden = False
    hidden_layer = None
    prefill_optional = False
    deferred_prefill = False
    def __init__(self, pld, model, tau):
        self.pld, self.model, self.tau = pld, model, tau
        self.used = {"pld": 0, "model": 0}
    def prefill_request(self): return self.model.prefill_request()
    def begin(self, prompt, prefill, config): return (self.pld.begin(prompt, prefill, config), self.model.begin(prompt, prefill, config))
    def propose(self, state, context, budget):
        d = self.pld.propose(state[0], context, budget)
        if d.scores is not None and sum(d.scores) >= self.tau:
            self.used["pld"] += 1
            return d
        self.used["model"] += 1
        return self.model.propose(state[1], context, budget)
    def propose_batch(self, states, contexts, budgets):
        return [self.propose(s, c, n) for s, c, n in zip(states, contexts, budgets)]
    def pending_prefill(self, state, context): return self.model.pending_prefill(state[1], context)
    def catch_up(self, state): return self.model.catch_up(state[1])
    def observe(self, state, step):
        self.pld.observe(state[0], step); self.model.observe(state[1], step)
    def end(self, state):
        self.pld.end(state[0]); self.model.end(state[1])

class Switch:
    def __init__(self, model_composer): self.mc = model_composer; self.merge = MergeComposer()
    def build(self, drafts, budget):
        return (self.merge if drafts[0].source == "pld" else self.mc).build(drafts, budget)

def load():
    """The 1.5B target on llama.cpp with ``pld`` and ``draft-tree`` (0.5B draft) over it, and
    their engines beside ``ar``'s."""
    torch.set_num_threads(1)
    options = MethodOptions(graft=GraftOptions(draft_model="qwen2.5-coder-0.5b-instruct"))
    base = SpecDecoder.from_pretrained("qwen2.5-coder-1.5b-instruct", method="ar", options=options, backend="llamacpp", threads=2)
    dt = base.with_method("draft-tree", options)
    pld = base.with_method("pld", options)
    return base, pld, dt, {"ar": base.engine, "pld": pld.engine, "draft-tree": dt.engine}


def switch_engine(base, dt, drafter) -> SpecEngine:
    """An engine whose one drafter hands it lookup's or the draft model's tree."""
    return SpecEngine(base.engine.target, [drafter], Switch(dt.engine.composer), method="draft-tree",
                      eos_token_ids=sorted(base.engine.eos_token_ids), default_budget=16)


def time_engines(base, engines: dict, suite: str) -> None:
    """Every engine on every prompt's first turn (128 tokens, alternating order), then totals,
    speedup over ``ar`` and MAT, and how often each switch took which mode."""
    config = base.make_config(max_new_tokens=128)
    tot = {m: [0.0, 0, 0] for m in engines}
    for e in engines.values():
        e.generate_ids(base.encode("Say hello.", chat=True), base.make_config(max_new_tokens=8))
    for i, p in enumerate(load_suite(suite).prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        outs = {}
        for m in order:
            t0 = time.perf_counter(); out = engines[m].generate_ids(ids, config); d = time.perf_counter() - t0
            tot[m][0] += d; tot[m][1] += len(out); tot[m][2] += engines[m].last_stats.steps; outs[m] = round(d, 1)
        print(p.id, outs, flush=True)
    for m, (s, n, st) in tot.items():
        print(f"{m:12s} {s:7.1f} s {tot['ar'][0]/s:5.2f}x MAT {n/max(st,1):.2f}")
    for m in list(engines)[3:]:  # the switches, after load()'s ar, pld and draft-tree
        print(m, engines[m].drafters[0].used)


def main() -> None:
    suite = sys.argv[1] if len(sys.argv) > 1 else "spec-bench:1,humaneval:1,code-edit:1"
    taus = [float(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1.0,2.0").split(",")]
    base, pld, dt, engines = load()
    for tau in taus:
        engines[f"cf{tau}"] = switch_engine(base, dt, CopyFirst(pld.engine.drafters[0], dt.engine.drafters[0], tau))
    time_engines(base, engines, suite)


if __name__ == "__main__":
    main()
