#!/usr/bin/env bash
# One device call on a lent H200 after the structure refactor (TargetOptions, budget/ package,
# MethodSpec hooks): the CUDA tests, then bench (B = 1) and bench-serve (B = 16, 4) of random-weight
# copies of the catalog's 1.5B target and 0.5B draft, through benchmarks/tools/gpu_check.sh.
# Carried: .gpu (model configs and tokenizers, no weights) and .whl (gguf, pydivsufsort for cp312).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
OUT=$OUT CONFIGS=.gpu/configs STAGES=tests,bench,serve SERVE_SIZES=16,4 BENCH_SUITE=spec-bench:1 \
    TARGET_NAME=qwen2.5-coder-1.5b-instruct DRAFT_NAME=qwen2.5-coder-0.5b-instruct \
    bash benchmarks/tools/gpu_check.sh
