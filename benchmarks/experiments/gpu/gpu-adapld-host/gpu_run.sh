#!/usr/bin/env bash
# One device call (H200): the CUDA tests; where fusing the prompt into the first forward stops paying
# on a GPU (measure_fuse_length.py, random bf16 1.5B); AdaPLD's host work per step, forced onto the
# real text of the CPU trace (project_gpu.py trace --force), with a cProfile of AdaPLD's steps.
#   OUT=... bash benchmarks/experiments/gpu/gpu-adapld-host/gpu_run.sh   (carry .gpu)
set -u
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection
STAGES=${STAGES:-tests,fuse,forced}
want() { [[ ",$STAGES," == *",$1,"* ]]; }
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; timeout $secs "$@" > $R/$name.log 2>&1; echo "== $name rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/$name.log | tail -${TAILN:-8} | cut -c1-300; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > $R/machine.txt 2>&1; cat $R/machine.txt
want tests && TAILN=12 stage cuda-tests 150 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q -rA
stage random-models 60 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-1.5b-instruct --out $M
T=$M/qwen2.5-coder-1.5b-instruct
want fuse && TAILN=20 stage fuse-length 120 python3 benchmarks/experiments/gpu/measure_fuse_length.py --model $T --device cuda --dtype bfloat16 \
  --methods pld,adapld --lengths 64,128,256,512,768,1024,1536,2048,3072,4096 --rounds 5 --out $R/fuse-length.json
want forced && TAILN=6 stage forced-adapld 150 python3 benchmarks/tools/project_gpu.py trace --model $T --device cuda --dtype bfloat16 \
  --force $P/cpu-adapld.jsonl --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
  --variants "ar,pld,adapld,adapld-full" --profile $R/adapld-profile.txt --profile-variants adapld --out $R/forced-adapld.jsonl
ls -la $OUT
