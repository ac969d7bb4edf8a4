#!/usr/bin/env bash
# second device call: CUDA tests, cost tables with graphs, bench-serve (batched prefill + graphs), bench B=1
set -u
pip install -q --no-deps .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
pack() { cp /tmp/sg/cache/costs/*.json $R/ 2>/dev/null; tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee $R/machine.txt
t0=$SECONDS; timeout 100 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q -x > $R/cuda-tests.log 2>&1; echo "tests rc $? $((SECONDS-t0))s"; tail -5 $R/cuda-tests.log | cut -c1-400; pack
t0=$SECONDS; timeout 60 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-0.5b-instruct .gpu/configs/qwen2.5-coder-1.5b-instruct --out $M > $R/random-models.log 2>&1; echo "models rc $? $((SECONDS-t0))s"
for m in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct; do
t0=$SECONDS; timeout 50 python3 -m specgraft.cli profile --model $M/$m --device cuda --dtype bfloat16 --batch-sizes 1,2,4,8,16,32 --rows 1,2,4,8,16,32,64 --reps 5 > $R/profile-$m.log 2>&1; echo "profile $m rc $? $((SECONDS-t0))s"; tail -12 $R/profile-$m.log | cut -c1-300; pack
done
t0=$SECONDS; timeout 75 python3 -m specgraft.cli bench-serve --model $M/qwen2.5-coder-1.5b-instruct --device cuda --methods ar,pld --batch-sizes 16,4 --suite spec-bench:2,humaneval:4 --max-new-tokens 32 --out $R/bench-serve > $R/bench-serve.log 2>&1; echo "serve rc $? $((SECONDS-t0))s"; grep -A8 "^| B" $R/bench-serve.log | cut -c1-300; pack
t0=$SECONDS; timeout 70 python3 -m specgraft.cli bench --model $M/qwen2.5-coder-1.5b-instruct --draft-model $M/qwen2.5-coder-0.5b-instruct --device cuda --methods ar,pld,draft-tree,hf-assisted --suite spec-bench:1 --max-new-tokens 64 --out $R/bench > $R/bench.log 2>&1; echo "bench rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/bench.log | tail -25 | cut -c1-300; pack
ls -la $OUT
