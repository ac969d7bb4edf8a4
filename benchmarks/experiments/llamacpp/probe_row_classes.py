"""Probe llama.cpp's row invariance: the logits of the same row under different batch sizes.

Raw llama-cpp-python, no specgraft: a chat prompt is prefilled, then the same greedy chain is fed
in batches of 1 to 20 rows; for rows 0 and 1 it prints which batch sizes give bit-identical
logits, the largest difference to the one-row batch, whether repeats are deterministic, a
two-branch tree (sequence-id sets, unified KV) against a chain, and the same row at several
positions of one batch (copies in separate sequences). Findings: NOTES.md.

    python benchmarks/experiments/llamacpp/probe_row_classes.py ~/.cache/specgraft/models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 2
"""
import sys

import llama_cpp as L
import numpy as np

path = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
L.llama_backend_init()
from llama_cpp._logger import set_verbose

set_verbose(False)
mp = L.llama_model_default_params()
model = L.llama_model_load_from_file(path.encode(), mp)
vocab = L.llama_model_get_vocab(model)
V = L.llama_vocab_n_tokens(vocab)
cp = L.llama_context_default_params()
cp.n_ctx = 2048; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_seq_max = 64; cp.kv_unified = True
cp.n_threads = threads; cp.n_threads_batch = threads
ctx = L.llama_init_from_model(model, cp)
mem = L.llama_get_memory(ctx)
text = b"<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number.<|im_end|>\n<|im_start|>assistant\n"
buf = (L.llama_token * 512)()
n = L.llama_tokenize(vocab, text, len(text), buf, 512, True, True)
prompt = list(buf[:n])
batch = L.llama_batch_init(512, 0, 64)

def decode(tokens, pos0, seqs=None, parents=None):
    """tokens fed at positions; seqs: list of seq id lists; returns logits [n, V]"""
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = pos0[i] if isinstance(pos0, list) else pos0 + i
        s = seqs[i] if seqs else [0]
        batch.n_seq_id[i] = len(s)
        for j, x in enumerate(s):
            batch.seq_id[i][j] = x
        batch.logits[i] = 1
    rc = L.llama_decode(ctx, batch)
    assert rc == 0, rc
    ptr = L.llama_get_logits(ctx)
    return np.ctypeslib.as_array(ptr, shape=(len(tokens), V)).copy()

P = len(prompt) - 1
decode(prompt[:-1], 0)
# greedy continuation, one row at a time
cont = [prompt[-1]]
for i in range(20):
    lg = decode([cont[-1]], P + i)
    cont.append(int(lg[0].argmax()))
L.llama_memory_seq_rm(mem, 0, P, -1)
rows = {}
for n_rows in range(1, 21):
    lg = decode(cont[:n_rows], P)
    rows[n_rows] = lg
    L.llama_memory_seq_rm(mem, 0, P, -1)
# row 0 across sizes
print("model", path.split("/")[-1], "V", V, "prompt", P)
for r in (0, 1):
    ref = {}
    line = []
    for n_rows in range(r + 1, 21):
        x = rows[n_rows][r]
        key = next((k for k, v in ref.items() if np.array_equal(v, x)), None)
        if key is None:
            key = n_rows; ref[key] = x
        line.append(f"{n_rows}:{key}")
    print(f"row {r} class (by first size with identical logits):", " ".join(line))
base = rows[1][0]
print("max |diff| of row 0 vs 1-row:", {n: float(np.abs(rows[n][0] - base).max()) for n in range(2, 21)})
# repeat determinism
lg = decode(cont[:1], P); L.llama_memory_seq_rm(mem, 0, P, -1)
print("repeat 1-row identical:", np.array_equal(lg[0], base))
lg = decode(cont[:12], P); L.llama_memory_seq_rm(mem, 0, P, -1)
print("repeat 12-row identical:", np.array_equal(lg, rows[12]))
# tree: root + two branches sharing it: [root(s1,s2), a(s1), b(s2), a2(s1)]
L.llama_memory_seq_cp(mem, 0, 1, -1, -1); L.llama_memory_seq_cp(mem, 0, 2, -1, -1)
tokens = [cont[0], cont[1], cont[1] + 1, cont[2]]
pos = [P, P + 1, P + 1, P + 2]
seqs = [[1, 2], [1], [2], [1]]
lg = decode(tokens, pos, seqs)
chain4 = decode(cont[:3], P); L.llama_memory_seq_rm(mem, 0, P, -1)
print("tree rows (root,a,a2) vs 3-row chain max diff:", float(np.abs(lg[[0, 1, 3]] - chain4).max()))
L.llama_memory_seq_rm(mem, 1, -1, -1); L.llama_memory_seq_rm(mem, 2, -1, -1)
print("argmax agree tree vs chain:", (lg[[0,1,3]].argmax(1) == chain4.argmax(1)).all())
# all rows across sizes >= n0
for n0 in (4, 8, 12, 16):
    ok = all(np.array_equal(rows[n][r], rows[n0][r]) for n in range(n0, 21) for r in range(n0))
    print(f"every row r < {n0} identical for all sizes in [{n0}, 20]:", ok)
# same input at different batch positions: 16 copies of the same row in 16 sequences
for n_copies in (1, 2, 3, 4, 5, 8, 12, 16):
    for s in range(1, n_copies + 1):
        L.llama_memory_seq_cp(mem, 0, s, -1, -1)
    lg = decode([cont[0]] * n_copies, [P] * n_copies, [[s] for s in range(1, n_copies + 1)])
    for s in range(1, n_copies + 1):
        L.llama_memory_seq_rm(mem, s, -1, -1)
    same = all(np.array_equal(lg[i], lg[0]) for i in range(n_copies))
    print(f"{n_copies} copies at different rows identical: {same}; row0 vs 1-row {float(np.abs(lg[0]-base).max()):.4f}, vs 16-row class {float(np.abs(lg[0]-rows[16][0]).max()):.4f}")
print("last row of size n identical to 20-row class:", {n: bool(np.array_equal(rows[n][n-1], rows[20][n-1])) for n in range(1, 21)})
for n_copies in (9, 10, 11, 13):
    for s in range(1, n_copies + 1):
        L.llama_memory_seq_cp(mem, 0, s, -1, -1)
    lg = decode([cont[0]] * n_copies, [P] * n_copies, [[s] for s in range(1, n_copies + 1)])
    for s in range(1, n_copies + 1):
        L.llama_memory_seq_rm(mem, s, -1, -1)
    print(n_copies, "copies identical to 16-row class per row:", [bool(np.array_equal(lg[i], rows[16][0])) for i in range(n_copies)])
