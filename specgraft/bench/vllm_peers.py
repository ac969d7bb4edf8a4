"""vLLM as benchmark peers, each run in vLLM's own virtual environment by a subprocess.

- ``vllm``: plain vLLM (greedy): the baseline of the other vLLM peers and their exactness reference.
- ``vllm-ngram``: vLLM's prompt lookup (``{"method": "ngram", "prompt_lookup_max": 4,
  "prompt_lookup_min": 2}``).
- ``vllm-specgraft-pld``, ``vllm-specgraft-reader``: specgraft's proposers inside vLLM
  (:mod:`specgraft.integrations.vllm`; the reader one searches the bench's ``--datastore``
  directories through ``$SPECGRAFT_VLLM_DATASTORE``).

vLLM pins its own torch and transformers, so it cannot share the bench's process: after our
methods and the Hugging Face peers have run on every input, each vLLM peer runs once over the
same token ids (the ids of every prompt and turn, MT-bench's second turns included) in one
subprocess of ``vllm_python`` (``python -m specgraft.integrations.vllm_worker``, specgraft on
its ``PYTHONPATH``), which loads the model once, warms up, and times each generation alone
(batch of one). One engine at a time, so memory holds one vLLM copy of the model.

Example::

    runs = run_vllm_peer("vllm-ngram", VLLMSettings(model="/models/smollm2"), [("p0:0", [1, 5, 6])], eos=[2],
                         max_new_tokens=32, warmup_ids=[1, 7], workdir=Path("bench-out/vllm"))
    runs["p0:0"].tokens, runs["p0:0"].time_s
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import specgraft
from specgraft.bench.contract import MethodRun
from specgraft.integrations.vllm import DATASTORE_ENV, speculative_config

#: Environment variable naming the vLLM venv's python (``--vllm-python`` wins).
VLLM_PYTHON_ENV = "SPECGRAFT_VLLM_PYTHON"
#: Without it: the venv docs/vllm.md creates in the working directory.
DEFAULT_VLLM_PYTHON = ".venv-vllm/bin/python"
VLLM_BASELINE = "vllm"

VLLM_PEERS: dict[str, str] = {
    "vllm": "vLLM, plain (greedy)",
    "vllm-ngram": "vLLM speculative_config method ngram (prompt lookup, n-grams 2-4)",
    "vllm-specgraft-pld": "vLLM + specgraft's PLD proposer (custom_class)",
    "vllm-specgraft-reader": "vLLM + specgraft's READER retrieval proposer (custom_class)",
}


def default_vllm_python() -> str:
    return os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_PYTHON


def speculative_config_for(name: str, num_speculative_tokens: int) -> dict[str, Any] | None:
    """What ``LLM(speculative_config=...)`` gets for a vLLM peer.

    >>> speculative_config_for("vllm-ngram", 5)["method"]
    'ngram'
    >>> speculative_config_for("vllm", 5) is None
    True
    """
    if name == "vllm":
        return None
    if name == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if name == "vllm-specgraft-pld":
        return speculative_config("pld", num_speculative_tokens)
    if name == "vllm-specgraft-reader":
        return speculative_config("reader", num_speculative_tokens)
    raise ValueError(f"unknown vLLM peer {name!r}; choose one of {', '.join(VLLM_PEERS)}")


@dataclass(frozen=True)
class VLLMSettings:
    """How the vLLM peers run (recorded in every vLLM row's ``method_config``)."""

    model: str
    """Local model directory (a catalog name is resolved before)."""
    python: str = field(default_factory=default_vllm_python)
    """The vLLM venv's python."""
    num_speculative_tokens: int = 5
    """Draft tokens per step for every speculative vLLM peer."""
    datastores: tuple[str, ...] = ()
    """Datastore directories of ``vllm-specgraft-reader``."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Extra ``LLM(...)`` arguments (over :data:`specgraft.integrations.vllm_worker.ENGINE_DEFAULTS`)."""
    kv_cache_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE``."""


def _project_root() -> str:
    """The directory holding the ``specgraft`` package, for the subprocess's ``PYTHONPATH``."""
    return str(Path(specgraft.__file__).resolve().parent.parent)


def check_vllm_python(python: str) -> str:
    """The vLLM version behind ``python``; ``ValueError`` in one line if it cannot run vLLM 0.32."""
    if not Path(python).exists():
        raise ValueError(f"vLLM python {python!r} does not exist; create the vLLM venv (README, vLLM) or pass --vllm-python")
    code = "from specgraft.integrations.vllm import require_vllm; print(require_vllm())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_project_root(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"{python} cannot run the vLLM peers: {last}")
    return proc.stdout.strip()


def run_vllm_peer(
    name: str, settings: VLLMSettings, inputs: Sequence[tuple[str, Sequence[int]]], eos: Sequence[int],
    max_new_tokens: int, warmup_ids: Sequence[int], workdir: Path, warmup_tokens: int = 16,
) -> dict[str, MethodRun]:
    """Run peer ``name`` on every ``(key, ids)`` input in one vLLM subprocess; its log is
    ``workdir/NAME.log``. A failed subprocess raises ``RuntimeError`` with the log's tail."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec = speculative_config_for(name, settings.num_speculative_tokens)
    request = {
        "model": settings.model, "speculative_config": spec, "max_new_tokens": max_new_tokens,
        "eos_token_ids": sorted(int(t) for t in eos), "warmup_ids": list(warmup_ids), "warmup_tokens": warmup_tokens,
        "engine": settings.engine, "inputs": [{"key": k, "ids": [int(t) for t in ids]} for k, ids in inputs],
    }
    request_file, results_file, log_file = (workdir / f"{name}.{ext}" for ext in ("request.json", "results.jsonl", "log"))
    request_file.write_text(json.dumps(request))
    results_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_project_root(), os.environ.get("PYTHONPATH")])),
        "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"),
    }
    if name == "vllm-specgraft-reader":
        env[DATASTORE_ENV] = os.pathsep.join(settings.datastores)
    with log_file.open("w") as log:
        proc = subprocess.run(
            [settings.python, "-m", "specgraft.integrations.vllm_worker", str(request_file), str(results_file)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    if proc.returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise RuntimeError(f"vLLM peer {name} failed (exit {proc.returncode}); {log_file}:\n{tail}")
    config = {
        "method": name, "peer": VLLM_PEERS[name], "speculative_config": spec, "vllm_python": settings.python,
        "engine": settings.engine, "kv_cache_gib": settings.kv_cache_gib,
        **({"datastores": list(settings.datastores)} if name == "vllm-specgraft-reader" else {}),
    }
    runs: dict[str, MethodRun] = {}
    for line in results_file.read_text().splitlines():
        r = json.loads(line)
        runs[r["key"]] = MethodRun(tokens=r["tokens"], time_s=r["time_s"], stats=None, config={**config, "spec_decode": {
            k: r[k] for k in ("drafts", "draft_tokens", "accepted_tokens")}, "vllm_version": r.get("vllm_version")})
    missing = [k for k, _ in inputs if k not in runs]
    assert not missing, f"vLLM peer {name} returned no result for {missing[:3]}"
    return runs

