"""Shared test code, imported by test modules and conftests (never collected as tests).

- ``models``: the tiny random Llama / Qwen2 models and tokenizer, a perturbed draft, the packed
  attention twin, a saved tiny draft directory;
- ``lossless``: the prompts and plain greedy reference of the losslessness checks;
- ``sampling``: the ``V = 4`` synthetic target, its exact law and the derived TV bound;
- ``stubs``: stand-ins (a table draft model, its logit tables, a vocabulary-only target, an
  integer tokenizer) and drafter helpers;
- ``calibration``: a Graft calibration and a synthetic corpus;
- ``batch``: a random budget policy and a random continuous-batching schedule;
- ``cli``, ``server``, ``bench``: the command line in-process, a server in a thread, the
  benchmark's tiny byte-level models and its row checks;
- ``scripts``: the ``benchmarks/`` scripts imported by path, and the repository root;
- ``gguf_models``: tiny GGUF files for the llama.cpp backend.
"""
