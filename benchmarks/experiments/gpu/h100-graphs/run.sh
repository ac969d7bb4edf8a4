#!/usr/bin/env bash
# one device call: CUDA tests, random models, CUDA graphs measurement, bench-serve B=16
set -u
pip install -q --no-deps .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 SPECGRAFT_CACHE=/tmp/sg/cache
R=/tmp/sg/results; M=/tmp/sg/models; mkdir -p $R $M
pack() { tar czf $OUT/gpu-results.tgz -C /tmp/sg results; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee $R/machine.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $R/machine.txt
t0=$SECONDS; timeout 130 python3 -m pytest -m cuda tests/lossless/test_cuda.py -p no:cacheprovider -p no:warnings -q -x > $R/cuda-tests.log 2>&1; echo "tests rc $? $((SECONDS-t0))s"; tail -25 $R/cuda-tests.log | cut -c1-400; pack
t0=$SECONDS; timeout 60 python3 benchmarks/tools/random_models.py .gpu/configs/qwen2.5-coder-0.5b-instruct .gpu/configs/qwen2.5-coder-1.5b-instruct --out $M > $R/random-models.log 2>&1; echo "models rc $? $((SECONDS-t0))s"
t0=$SECONDS; timeout ${GRAPH_LIMIT:-170} python3 benchmarks/experiments/gpu/measure_cuda_graphs.py --model $M/qwen2.5-coder-1.5b-instruct --draft-model $M/qwen2.5-coder-0.5b-instruct --tokens 64 --repeats 3 --out $R/cuda-graphs.json > $R/cuda-graphs.log 2>&1; echo "graphs rc $? $((SECONDS-t0))s"; grep -v "Loading weights" $R/cuda-graphs.log | tail -30 | cut -c1-400; pack
if [ "${SERVE:-1}" = 1 ]; then
t0=$SECONDS; timeout 90 python3 -m specgraft.cli bench-serve --model $M/qwen2.5-coder-1.5b-instruct --device cuda --methods ar,pld --batch-sizes 16 --suite spec-bench:2,humaneval:4 --max-new-tokens 32 --out $R/bench-serve > $R/bench-serve.log 2>&1; echo "serve rc $? $((SECONDS-t0))s"; grep -A8 "^| B" $R/bench-serve.log | cut -c1-300; pack
fi
ls -la $OUT
