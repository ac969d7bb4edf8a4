#!/usr/bin/env bash
# The second device call: the CUDA tests with the graphs' rows padded; the AdaPLD variants forced onto
# the real text (trace --force: the real tokens, so real anchors and trees, at this GPU's costs); the CPU step traces'
# forwards replayed on random bf16 copies of the 1.5B / 0.5B (project_gpu.py replay), today's
# unpadded graphs against padded ones, each variant's prompts in one pass from cold graphs.
set -u
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
STAGES=${STAGES:-tests,forced,replay-adapld,replay-reader}
want() { [[ ",$STAGES," == *",$1,"* ]]; }
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; timeout $secs "$@" > $R/$name.log 2>&1; echo "== $name rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/$name.log | tail -${TAILN:-8} | cut -c1-300; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > $R/machine.txt 2>&1; cat $R/machine.txt
want tests && stage cuda-tests 100 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q -rA
stage random-models 40 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-1.5b-instruct .gpu/configs/qwen2.5-coder-0.5b-instruct --out $M
T=$M/qwen2.5-coder-1.5b-instruct; D=$M/qwen2.5-coder-0.5b-instruct
want replay-reader && TAILN=14 stage replay-reader 150 python3 $P/../../project_gpu.py replay --trace $P/cpu-reader.jsonl --model $T --draft-model $D --device cuda --dtype bfloat16 --out $R/replay-reader.jsonl
want forced && TAILN=4 stage forced-adapld 70 python3 $P/../../project_gpu.py trace --model $T --device cuda --dtype bfloat16 --force $P/cpu-adapld.jsonl \
  --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
  --variants "ar,pld,adapld,adapld-rerank-only,adapld-full,pld-gpu=pld:min_prob=0.02:budget=64,adapld-gpu=adapld:min_prob=0.02:budget=64" \
  --out $R/forced-adapld.jsonl
want replay-adapld && TAILN=16 stage replay-adapld 90 python3 $P/../../project_gpu.py replay --trace $P/cpu-adapld.jsonl --model $T --device cuda --dtype bfloat16 --out $R/replay-adapld.jsonl
ls -la $OUT
