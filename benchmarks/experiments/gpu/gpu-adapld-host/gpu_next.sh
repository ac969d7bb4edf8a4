#!/usr/bin/env bash
# The device call a next session with a GPU should make (~8 min on an H200): everything
# `project_gpu.py project` needs to price issue 13's methods again with today's code (tree inputs built
# on the host, AdaPLD's packed copies and at-once prompt top-k), which the committed replays and cost
# tables predate: the CUDA tests; the 1.5B's and 0.5B's cost tables at B = 1; the CPU step traces'
# forwards replayed (padded rows); the host work of every variant, AdaPLD's forced onto the real text
# and READER's on random text, each variant warmed up untimed and none profiled.
#   OUT=... bash benchmarks/experiments/gpu/gpu-adapld-host/gpu_next.sh   (carry .gpu)
# then, here (G = the unpacked results):
#   python benchmarks/tools/project_gpu.py project --cpu $P/cpu-adapld.jsonl --gpu $G/forced-adapld.jsonl \
#       --replay $G/replay-adapld.jsonl --target-costs $G/target-cuda.json --context-trace $G/forced-adapld.jsonl
#   python benchmarks/tools/project_gpu.py project --cpu $P/cpu-reader.jsonl --gpu $G/gpu-reader.jsonl --replay $G/replay-reader.jsonl \
#       --target-costs $G/target-cuda.json --draft-costs $G/draft-cuda.json --context-trace $G/forced-adapld.jsonl
set -u
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection
STAGES=${STAGES:-tests,profile,forced,replay-adapld,reader,replay-reader}
DEVICE=${DEVICE:-cuda}
want() { [[ ",$STAGES," == *",$1,"* ]]; }
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; timeout $secs "$@" > $R/$name.log 2>&1; echo "== $name rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/$name.log | tail -${TAILN:-6} | cut -c1-300; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > $R/machine.txt 2>&1; cat $R/machine.txt
want tests && TAILN=3 stage cuda-tests 120 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q
stage random-models 70 python3 benchmarks/tools/random_models.py ${CONFIGS:-.gpu/configs}/qwen2.5-coder-1.5b-instruct ${CONFIGS:-.gpu/configs}/qwen2.5-coder-0.5b-instruct --out $M
T=$M/qwen2.5-coder-1.5b-instruct; D=$M/qwen2.5-coder-0.5b-instruct
want profile && stage profile-target 45 python3 -m specgraft.cli profile --model $T --device $DEVICE --dtype bfloat16 --batch-sizes 1 \
  --rows 1,2,3,4,6,8,12,16,24,32,48,64,96,128,256,512 --reps 5 --out $R/target-cuda.json
want profile && stage profile-draft 35 python3 -m specgraft.cli profile --model $D --device $DEVICE --dtype bfloat16 --batch-sizes 1 \
  --rows 1,2,4,8,16,24,32,48,64,128,256,512 --reps 5 --out $R/draft-cuda.json
want forced && stage forced-adapld 100 python3 benchmarks/tools/project_gpu.py trace --model $T --device $DEVICE --dtype bfloat16 \
  --force $P/cpu-adapld.jsonl --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
  --variants "ar,pld,adapld,adapld-rerank-only,adapld-full,pld-gpu=pld:min_prob=0.02:budget=64,adapld-gpu=adapld:min_prob=0.02:budget=64" \
  --out $R/forced-adapld.jsonl
want replay-adapld && stage replay-adapld 80 python3 benchmarks/tools/project_gpu.py replay --trace $P/cpu-adapld.jsonl --model $T \
  --device $DEVICE --settings padded --out $R/replay-adapld.jsonl
want reader && stage trace-reader 110 python3 benchmarks/tools/project_gpu.py trace --model $T --draft-model $D --device $DEVICE --dtype bfloat16 \
  --max-new-tokens 24 --suite humaneval:6,benchmarks/experiments/adapld-reader/suites/math.jsonl --datastore .gpu/ds/answers \
  --variants "ar,draft-tree,reader,reader-deep=reader:deepen_depth=64:d_deep=8:d_search=16,draft-tree-gpu=draft-tree:preset=gpu,reader-gpu=reader:preset=gpu:deepen_depth=64:d_deep=8:d_search=16" \
  --out $R/gpu-reader.jsonl
want replay-reader && stage replay-reader 120 python3 benchmarks/tools/project_gpu.py replay --trace $P/cpu-reader.jsonl --model $T --draft-model $D \
  --device $DEVICE --settings padded --out $R/replay-reader.jsonl
ls -la $OUT
