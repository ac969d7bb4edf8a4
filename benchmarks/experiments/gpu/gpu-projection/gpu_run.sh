#!/usr/bin/env bash
# The one device call of the GPU projection (RESULTS: issue 13 on a GPU, projected): random bf16
# copies of the 1.5B and 0.5B, their B = 1 cost tables with CUDA graphs, GPU step traces of the
# issue 13 variants (host work per step, start times), then the CUDA tests. Each stage has its
# own limit and the archive is rewritten after each, so a cut run still brings back the rest.
set -u
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; timeout $secs "$@" > $R/$name.log 2>&1; echo "== $name rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/$name.log | tail -6 | cut -c1-300; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > $R/machine.txt 2>&1; cat $R/machine.txt
stage random-models 70 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-1.5b-instruct .gpu/configs/qwen2.5-coder-0.5b-instruct --out $M
T=$M/qwen2.5-coder-1.5b-instruct; D=$M/qwen2.5-coder-0.5b-instruct
stage profile-target 45 python3 -m specgraft.cli profile --model $T --device cuda --dtype bfloat16 --batch-sizes 1 --rows 1,2,3,4,6,8,12,16,24,32,48,64,96,128,256,512 --reps 5 --out $R/target-cuda.json
stage profile-draft 35 python3 -m specgraft.cli profile --model $D --device cuda --dtype bfloat16 --batch-sizes 1 --rows 1,2,4,8,16,24,32,48,64,128,256,512 --reps 5 --out $R/draft-cuda.json
stage trace-adapld 90 python3 $P/../../project_gpu.py trace --model $T --device cuda --dtype bfloat16 --max-new-tokens 24 \
  --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
  --variants "ar,pld,adapld,adapld-rerank-only,adapld-full,pld-gpu=pld:min_prob=0.02:budget=64,adapld-gpu=adapld:min_prob=0.02:budget=64" \
  --out $R/gpu-adapld.jsonl
stage trace-reader 120 python3 $P/../../project_gpu.py trace --model $T --draft-model $D --device cuda --dtype bfloat16 --max-new-tokens 24 \
  --suite humaneval:6,benchmarks/experiments/adapld-reader/suites/math.jsonl --datastore .gpu/ds/answers \
  --variants "ar,draft-tree,reader,reader-deep=reader:deepen_depth=64:d_deep=8:d_search=16,draft-tree-gpu=draft-tree:preset=gpu,reader-gpu=reader:preset=gpu:deepen_depth=64:d_deep=8:d_search=16" \
  --out $R/gpu-reader.jsonl
stage cuda-tests 100 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q
ls -la $OUT
