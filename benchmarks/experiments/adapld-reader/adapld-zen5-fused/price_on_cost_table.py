"""Price the committed CPU step trace of issue 13's AdaPLD set (`../gpu-projection/cpu-adapld.jsonl`: every step's
verified rows, deterministic) with this CPU's cost table (one sequence, rows interpolated) plus each method's host
work per step measured this session, and a prefill common to every method (`pld`'s measured start):
a speed comparison the VM's 10-18% drift cannot move. Run from the repository root:
``python benchmarks/experiments/adapld-reader/adapld-zen5-fused/price_on_cost_table.py``."""
import json, collections, numpy as np
table = json.load(open("specgraft/data/costs/qwen2.5-coder-1.5b-instruct-cpu-avx512-t2.json"))["seconds"]["1"]
xs = sorted(int(k) for k in table); ys = [table[str(k)] for k in xs]
cost = lambda rows: float(np.interp(rows, xs, ys))
host = {"pld": 0.36e-3 + 0.1e-3, "adapld": 3.2e-3 + 1.0e-3, "adapld-rerank-only": 0.1e-3 + 1.0e-3}  # this session's drafting + observe per step
dec = collections.defaultdict(lambda: collections.defaultdict(float)); pre = collections.defaultdict(float); steps = collections.Counter(); toks = collections.Counter()
for l in open("benchmarks/experiments/gpu/raw/results-issue13/gpu-projection/cpu-adapld.jsonl"):
    r = json.loads(l)
    v = r["variant"]
    if v not in ("ar", "pld", "adapld", "adapld-rerank-only"):
        continue
    pre[(r["prompt"], v)] = r["start_s"]
    for s in r["steps"]:
        dec[v][r["task"]] += cost(s["rows"]) + host.get(v, 0.0)
    steps[v] += len(r["steps"]); toks[v] += r["new_tokens"]
# prefill: the same for every method of a prompt (pld's measured start), ar included
tasks = ["summarization", "rag", "mt_bench", "code_edit"]
pf = collections.defaultdict(float)
for l in open("benchmarks/experiments/gpu/raw/results-issue13/gpu-projection/cpu-adapld.jsonl"):
    r = json.loads(l)
    if r["variant"] == "pld":
        pf[r["task"]] += r["start_s"]
print("priced decode s (steps) and speedup vs ar with a common prefill")
for v in ("ar", "pld", "adapld", "adapld-rerank-only"):
    row = []
    for t in tasks + ["all"]:
        d = sum(dec[v].values()) if t == "all" else dec[v][t]
        a = sum(dec["ar"].values()) if t == "all" else dec["ar"][t]
        p = sum(pf.values()) if t == "all" else pf[t]
        row.append(f"{t} {(a + p) / (d + p):.3f}x")
    print(f"{v:20s} steps {steps[v]:4d} MAT {toks[v]/steps[v]:.2f} decode {sum(dec[v].values()):6.1f} s  " + "  ".join(row))
