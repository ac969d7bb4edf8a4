"""Per sequence, prompt lookup or the draft tree by each one's measured tokens per second (a
decayed ratio, the other mode tried every eighth step; lookup outright when its estimate reaches
tau): a prototype (NOTES.md, *A draft model in Q4_0*).

    python benchmarks/experiments/llamacpp/switch_adaptive_probe.py spec-bench:1,humaneval:1,code-edit:1 2.0:0.9,1.0:0.8
"""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from switch_probe import load, switch_engine, time_engines  # noqa: E402

class Adaptive:
    name = "adaptive"
    needs_hidden = False
    hidden_layer = None
    prefill_optional = False
    deferred_prefill = False
    def __init__(self, pld, model, tau_hi, decay=0.9, explore=8):
        self.pld, self.model, self.tau_hi, self.decay, self.explore = pld, model, tau_hi, decay, explore
        self.used = {"pld": 0, "model": 0}
    def prefill_request(self): return self.model.prefill_request()
    def begin(self, prompt, prefill, config):
        return {"p": self.pld.begin(prompt, prefill, config), "m": self.model.begin(prompt, prefill, config),
                "stats": {"pld": [0.0, 0.0], "model": [0.0, 0.0]}, "n": 0, "mode": None, "t0": 0.0}
    def rate(self, st, mode):
        tok, sec = st["stats"][mode]
        return float("inf") if sec == 0 else tok / sec
    def propose(self, st, context, budget):
        st["t0"] = time.perf_counter()
        d = self.pld.propose(st["p"], context, budget)
        e = sum(d.scores) if d.scores else 0.0
        st["n"] += 1
        if e >= self.tau_hi:
            mode = "pld"
        else:
            best = max(("model", "pld"), key=lambda m: self.rate(st, m))
            other = "pld" if best == "model" else "model"
            mode = other if st["n"] % self.explore == 0 else best
        st["mode"] = mode
        self.used[mode] += 1
        return d if mode == "pld" else self.model.propose(st["m"], context, budget)
    def propose_batch(self, states, contexts, budgets):
        return [self.propose(s, c, n) for s, c, n in zip(states, contexts, budgets)]
    def pending_prefill(self, st, context): return self.model.pending_prefill(st["m"], context)
    def catch_up(self, st): return self.model.catch_up(st["m"])
    def observe(self, st, step):
        dt = time.perf_counter() - st["t0"]
        s = st["stats"][st["mode"]]
        s[0] = self.decay * s[0] + len(step.new_tokens)
        s[1] = self.decay * s[1] + dt
        self.pld.observe(st["p"], step); self.model.observe(st["m"], step)
    def end(self, st):
        self.pld.end(st["p"]); self.model.end(st["m"])

suite = sys.argv[1] if len(sys.argv) > 1 else "spec-bench:1,humaneval:1,code-edit:1"
settings = [tuple(float(x) for x in t.split(":")) for t in (sys.argv[2] if len(sys.argv) > 2 else "2.0:0.9,1.0:0.8").split(",")]
base, pld, dt, engines = load()
for tau, decay in settings:
    engines[f"ad{tau}:{decay}"] = switch_engine(base, dt, Adaptive(pld.engine.drafters[0], dt.engine.drafters[0], tau, decay))
time_engines(base, engines, suite)
