"""What importing specgraft costs: a process on the llama.cpp backend never loads transformers'
model classes (``transformers.modeling_utils`` and what it pulls in take ~2.5 s to import on two
cores, a sixth of a ``generate`` on llama.cpp from start to finish). The tokenizer classes it does
need are cheap. ``load_causal_lm`` imports the model classes when a Hugging Face model loads."""

import subprocess
import sys

#: What a llama.cpp process imports: the API, every method, the server, the bench and the CLI.
MODULES = (
    "specgraft.api",
    "specgraft.models.hf",
    "specgraft.methods",
    "specgraft.drafters.draft_model",
    "specgraft.models.llamacpp",
    "specgraft.serve.app",
    "specgraft.bench.session",
    "specgraft.cli.generate",
    "specgraft.cli.serve",
    "specgraft.cli.bench",
    "specgraft.cli.batch",
)


def test_the_llamacpp_path_does_not_import_model_classes():
    code = f"import sys, {', '.join(MODULES)}; print('transformers.modeling_utils' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"], f"importing {', '.join(MODULES)} loads transformers' model classes (transformers.modeling_utils)"


def test_loading_a_hugging_face_model_imports_them(tiny_model_dir):
    code = (
        "import sys; from specgraft.models.loading import load_causal_lm; "
        f"load_causal_lm({str(tiny_model_dir)!r}, 'float32', 'cpu', fast_kernels=False); "
        "print('transformers.modeling_utils' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == "True"
