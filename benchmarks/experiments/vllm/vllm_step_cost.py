"""The vLLM step-cost probe, kept under its old path for the commands in RESULTS.md: it is
``python -m specgraft.integrations.vllm_probe`` (same arguments), run in vLLM's venv."""

from specgraft.integrations.vllm_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
