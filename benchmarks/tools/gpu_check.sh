#!/usr/bin/env bash
# The checks a lent GPU machine runs, in one pass, most valuable first; each stage has its own
# time limit so the archive at the end always comes back.
#
#   1. the CUDA-marked tests (greedy and sampling exactness on the GPU, fp32 tiny models);
#   2. random-weight copies of the catalog models (benchmarks/tools/random_models.py: no weights can
#      be downloaded there) and their cost tables (`specgraft profile`, bf16);
#   3. `specgraft bench` of the 1.5B target with the 0.5B draft, and `specgraft bench-serve`:
#      the engine's time per step and tokens/s against Hugging Face generate on the same
#      weights (random weights: acceptance and speedups mean nothing there, costs do);
#   4. (stage `attention`) the CPU's packed grouped-query attention against `sdpa` on the GPU:
#      forwards of the random 1.5B and 0.5B over 1-64 rows (measure_packed_attention.py);
#   5. (stage `fusion`) q/k/v and gate/up fused against the plain layout, bf16 forwards of the
#      same models (measure_fusion.py; loaders fuse on CPU and GPU since the H100 run said so);
#   6. (stage `graphs`) CUDA graphs of the forwards against eager ones: ar and draft-tree on one
#      prompt, HF generate beside them, batched ar steps (measure_cuda_graphs.py).
#   7. (stage `projection`) the committed CPU step traces (benchmarks/experiments/gpu/raw.tar.xz,
#      unpacked if needed) on this GPU (project_gpu.py): their forwards replayed with the graphs'
#      rows padded and not, and the model-free variants forced onto the real text for their host
#      work; `project_gpu.py project` then prices them (benchmarks/experiments/gpu/NOTES.md).
#
# Usage on the device (configs: folders with config.json + tokenizer files, carried along):
#   OUT=/some/dir CONFIGS=.gpu/configs [STAGES=tests,profile,bench,serve,attention,fusion,graphs,projection] bash benchmarks/tools/gpu_check.sh
set -u
OUT=${OUT:?set OUT}
CONFIGS=${CONFIGS:-.gpu/configs}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/specgraft-gpu}
T=${STAGE_SCALE:-1}            # scales every stage's limit (e.g. 0.5 for a dry run)
STAGES=${STAGES:-tests,profile,bench,serve,attention,fusion,graphs}
export SPECGRAFT_CACHE=$WORK/cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
RES=$WORK/results
mkdir -p "$RES" "$WORK/models"
limit() { awk -v s="$1" -v t="$T" 'BEGIN { printf "%d", s * t }'; }
stage() {  # stage NAME SECONDS CMD...: run with a time limit, log to $RES/NAME.log
    local name=$1 secs; secs=$(limit "$2"); shift 2
    echo "== $name (limit ${secs}s): $*"
    local t0=$SECONDS
    timeout "$secs" "$@" >"$RES/$name.log" 2>&1
    echo "== $name: rc $? in $((SECONDS - t0))s"; tail -n 15 "$RES/$name.log"
    tar czf "$OUT/gpu-results.tgz" -C "$WORK" results   # after every stage: a run cut short still brings back the rest
}
want() { [[ ",$STAGES," == *",$1,"* ]]; }

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
    nproc; uname -r
} >"$RES/machine.txt" 2>&1
cat "$RES/machine.txt"

want tests && stage cuda-tests 150 $PY -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q

MODELS=$(ls "$CONFIGS")
want profile || want bench || want serve || want attention || want fusion || want graphs || want projection && stage random-models 90 $PY benchmarks/tools/random_models.py $(for m in $MODELS; do echo "$CONFIGS/$m"; done) --out "$WORK/models"
want profile && for m in $MODELS; do
    stage "profile-$m" 45 $PY -m specgraft.cli profile --model "$WORK/models/$m" --device "$DEVICE" --dtype bfloat16 \
        ${PROFILE_ARGS:---batch-sizes 1,2,4,8,16,32 --rows 1,2,4,8,16,32,64 --reps 5}
done
cp "$SPECGRAFT_CACHE"/costs/*.json "$RES/" 2>/dev/null

TARGET=$WORK/models/${TARGET_NAME:-qwen2.5-coder-1.5b-instruct} DRAFT=$WORK/models/${DRAFT_NAME:-qwen2.5-coder-0.5b-instruct}
if [ -d "$TARGET" ] && [ -d "$DRAFT" ]; then
    want bench && stage bench 150 $PY -m specgraft.cli bench --model "$TARGET" --draft-model "$DRAFT" --device "$DEVICE" \
        --methods ar,pld,recycling,draft-tree,graft,hf-assisted --suite ${BENCH_SUITE:-spec-bench:1,humaneval:2} --max-new-tokens 64 \
        --out "$RES/bench"
    want serve && stage bench-serve 100 $PY -m specgraft.cli bench-serve --model "$TARGET" --device "$DEVICE" --methods ar,pld \
        --batch-sizes ${SERVE_SIZES:-1,4,16} --suite ${SERVE_SUITE:-spec-bench:2,humaneval:4} --max-new-tokens 32 --out "$RES/bench-serve"
    want attention && stage attention 90 $PY benchmarks/experiments/cpu-kernels/measure_packed_attention.py --device "$DEVICE" --dtype bfloat16 \
        --forwards --per-task 0 --context ${ATTENTION_CONTEXT:-512} --model "$TARGET" --draft-model "$DRAFT" --out "$RES/attention.json"
    want fusion && stage fusion 90 $PY benchmarks/experiments/cpu-kernels/measure_fusion.py --device "$DEVICE" --context ${ATTENTION_CONTEXT:-512} \
        --repeats 20 --model "$TARGET" --draft-model "$DRAFT" --out "$RES/fusion.json"
    want graphs && stage graphs 170 $PY benchmarks/experiments/gpu/measure_cuda_graphs.py --model "$TARGET" --draft-model "$DRAFT" \
        --tokens 64 --repeats 3 --out "$RES/cuda-graphs.json"
    P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection   # the committed CPU traces, from the archive
    want projection && { [ -d $P ] || tar -xJf benchmarks/experiments/gpu/raw.tar.xz -C benchmarks/experiments/gpu; }
    want projection && stage replay-reader 150 $PY benchmarks/tools/project_gpu.py replay --trace $P/cpu-reader.jsonl \
        --model "$TARGET" --draft-model "$DRAFT" --out "$RES/replay-reader.jsonl"
    want projection && stage forced-adapld 70 $PY benchmarks/tools/project_gpu.py trace --model "$TARGET" --device "$DEVICE" \
        --dtype bfloat16 --force $P/cpu-adapld.jsonl --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
        --variants "ar,pld,adapld,adapld-rerank-only,adapld-full,pld-gpu=pld:min_prob=0.02:budget=64,adapld-gpu=adapld:min_prob=0.02:budget=64" \
        --out "$RES/forced-adapld.jsonl"
    want projection && stage replay-adapld 90 $PY benchmarks/tools/project_gpu.py replay --trace $P/cpu-adapld.jsonl \
        --model "$TARGET" --out "$RES/replay-adapld.jsonl"
fi
ls -la "$OUT"   # one archive: $OUT brings back at most 8 files
