"""Run one vLLM engine over a list of token-id inputs, timed: the process behind ``specgraft bench``'s
vLLM peers (and the end-to-end test). It runs in vLLM's own virtual environment::

    python -m specgraft.integrations.vllm_worker REQUEST.json RESULTS.jsonl

``REQUEST.json``: ``{"model": DIR, "speculative_config": {...} | null, "max_new_tokens": 128,
"eos_token_ids": [...], "inputs": [{"key": "...", "ids": [...]}, ...], "warmup_ids": [...],
"engine": {extra LLM(...) arguments}}``. Each input is generated alone (batch of one, greedy,
``temperature=0``), ``time.perf_counter()`` around ``LLM.generate`` only, after a warm-up
generation; one JSON line per input is appended to ``RESULTS.jsonl`` as soon as it is measured:
``{"key", "tokens", "time_s", "drafts", "draft_tokens", "accepted_tokens", "vllm_version"}``
(drafts and tokens from vLLM's spec-decode counters, 0 without speculation).

Only vLLM, numpy and (through the proposers) specgraft's token-level drafters are imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

#: ``LLM(...)`` arguments used unless the request overrides them (fp32 is faster than bf16 on
#: CPUs without native bf16; eager mode starts in ~30 s instead of ~150 s).
ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 4096,
    "enforce_eager": True,
    "max_num_seqs": 4,
    "seed": 0,
}

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def make_llm(model: str, speculative_config: dict[str, Any] | None, **engine: Any):
    """A vLLM ``LLM`` with stats on (the spec-decode counters) and the defaults above."""
    from vllm import LLM

    kwargs = {**ENGINE_DEFAULTS, **engine, "disable_log_stats": False}
    if speculative_config is not None:
        kwargs["speculative_config"] = speculative_config
    return LLM(model=model, **kwargs)


def spec_counters(llm: Any) -> dict[str, int]:
    """vLLM's spec-decode counters so far (drafts, draft tokens, accepted tokens)."""
    out = {v: 0 for v in SPEC_COUNTERS.values()}
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[metric.name]] += int(metric.value)
    return out


def sampling_params(max_new_tokens: int, eos_token_ids: Sequence[int]):
    """Greedy, exactly ``max_new_tokens`` unless an EOS id comes first (kept in the output, as our
    engine and the Hugging Face peers count it); no repetition penalty, whatever the model's
    ``generation_config.json`` says."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(eos_token_ids), repetition_penalty=1.0,
        skip_special_tokens=False, detokenize=False,
    )


def generate(llm: Any, ids: Sequence[int], params: Any) -> dict[str, Any]:
    """One timed generation; its tokens (EOS included when it ended it) and spec-decode counts."""
    from vllm.inputs import TokensPrompt

    before = spec_counters(llm)
    t0 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    after = spec_counters(llm)
    tokens = list(out[0].outputs[0].token_ids)
    return {"tokens": tokens, "time_s": elapsed, **{k: after[k] - before[k] for k in after}}


def run(request: dict[str, Any], results: Path) -> None:
    import vllm

    llm = make_llm(request["model"], request.get("speculative_config"), **request.get("engine", {}))
    params = sampling_params(request["max_new_tokens"], request["eos_token_ids"])
    warm = sampling_params(request.get("warmup_tokens", 16), request["eos_token_ids"])
    if request.get("warmup_ids"):
        generate(llm, request["warmup_ids"], warm)
    with results.open("a", encoding="utf-8") as f:
        for item in request["inputs"]:
            row = {"key": item["key"], **generate(llm, item["ids"], params), "vllm_version": vllm.__version__}
            f.write(json.dumps(row) + "\n")
            f.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m specgraft.integrations.vllm_worker REQUEST.json RESULTS.jsonl", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    run(json.loads(Path(args[0]).read_text()), Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
