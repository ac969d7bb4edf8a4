#!/usr/bin/env bash
# The second device call (H200): the CUDA tests again (tree inputs now built on the host); the small
# host pieces timed (host_bench.py); the fuse crossover over the whole range, both methods; AdaPLD's
# and prompt lookup's host work per step forced onto the real text, as in the first call.
#   OUT=... bash benchmarks/experiments/gpu/gpu-adapld-host/gpu_run2.sh   (carry .gpu)
set -u
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
P=benchmarks/experiments/gpu/raw/results-issue13/gpu-projection; H=benchmarks/experiments/gpu/raw/results-issue13/gpu-adapld-host
STAGES=${STAGES:-tests,host,fuse,forced}
want() { [[ ",$STAGES," == *",$1,"* ]]; }
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
stage() { local name=$1 secs=$2; shift 2; local t0=$SECONDS; timeout $secs "$@" > $R/$name.log 2>&1; echo "== $name rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/$name.log | tail -${TAILN:-8} | cut -c1-400; pack; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } > $R/machine.txt 2>&1; cat $R/machine.txt
want tests && TAILN=3 stage cuda-tests 150 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q -rA
stage random-models 60 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-1.5b-instruct --out $M
T=$M/qwen2.5-coder-1.5b-instruct
want host && TAILN=6 stage host-bench 90 python3 $H/host_bench.py $T
want fuse && TAILN=24 stage fuse-length 150 python3 benchmarks/experiments/gpu/measure_fuse_length.py --model $T --device cuda --dtype bfloat16 \
  --methods pld,adapld --lengths 64,128,256,384,512,768,1024,1536,2048,3072,4096 --rounds 7 --out $R/fuse-length.json
want forced && TAILN=4 stage forced-adapld 150 python3 benchmarks/tools/project_gpu.py trace --model $T --device cuda --dtype bfloat16 \
  --force $P/cpu-adapld.jsonl --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \
  --variants "ar,pld,adapld,adapld-full" --profile $R/adapld-profile.txt --profile-variants adapld --out $R/forced-adapld.jsonl
ls -la $OUT
