"""Build llama.cpp (inside llama-cpp-python) for this CPU: its CMake flags, and on CPUs with AMX a
fix for GCC and small-batch kernels.

The flags name each instruction-set extension the CPU advertises (``/proc/cpuinfo``) with
``GGML_NATIVE=OFF``: AVX, AVX2, FMA, F16C and BMI2 on any x86-64 CPU of the last decade; AVX-512
and its VBMI, VNNI and BF16 extensions where present (Zen 4/5, Intel server parts); AVX-VNNI
where present; and **AMX** (``amx_tile`` + ``amx_int8`` with AVX-512 VNNI: Intel Xeon since
Sapphire Rapids). On anything else (ARM, no ``/proc/cpuinfo``) the flags are empty and
llama.cpp's default applies.

AMX matters twice on the CPUs that have it. llama.cpp's AMX kernels compute a row's quantized
dot products in integers whatever the batch, so a GGUF's matrix products for a row are
bit-identical in batches of 1 to 63 rows (without AMX, Q4_K weights take three kernels by batch
size and differ by up to ~0.4 in a logit; attention still treats one-row batches over 512+
cached cells apart, see ``specgraft.models.llamacpp``). And rows cost less: stock AMX kernels
make 8 or more rows cheaper (16 rows 3.1 one-row steps instead of 3.7 on two cores) but 2-4
rows 10-17% dearer, which the small-batch kernels below turn around. ``--no-amx`` leaves AMX off.

AMX builds need one fix with GCC: its ``_tile_loadconfig`` declares an 8-byte operand, so GCC
drops the stores of ggml's tile shapes and the first AMX forward dies with *Illegal
instruction* (``llamacpp_amx.h``, force-included into the C++ sources with ``-include``; the
path must not contain spaces). Clang needs nothing; the flag is harmless there.

AMX builds also get **small-batch kernels** (``llamacpp_amx_rows.inc``): stock ggml computes
2 or more rows of Q4_K/Q6_K weights on the AMX tiles, which unpack every weight block however few
rows there are, so a verify pass of a few rows costs ~1.6-1.8 one-row steps on two cores; the
kernels give 2-15 rows the one-row kernel's arithmetic over one read of the weights (over 512
cached tokens: 2 rows 1.03 steps, 4 rows 1.46, 8 rows 1.92), and 2-8 rows of Q4_0 (the type a
draft model is requantized to: ``gguf_requant.py``) the same, each row bit-identical to the row
alone. They are a source change, so pip cannot build them from PyPI's package: ``--install``
downloads llama-cpp-python's source, adds them (:func:`patch_source`) and builds it with these
flags; ``--patch DIR`` adds them to a llama.cpp checkout (to build llama.cpp's own programs the
same way). Plain one-row decoding is unchanged.

Every build also gets **huge pages asked for at allocation** (``llamacpp_huge_pages.inc``, Linux):
ggml allocates its weight and KV buffers without asking for transparent huge pages, and
:mod:`specgraft.models.hugepages` collapses them after loading, which copies every page (~2-4 s
for a 1.5B Q4_K_M on two cores). Asked for before the weights are read in, the reads' page
faults take huge pages at once and loading takes about as long as without them.

Print the flags, or build and install llama-cpp-python with them::

    python -m specgraft.models.llamacpp_build            # the CMAKE_ARGS for this CPU
    python -m specgraft.models.llamacpp_build --install  # ~3-4 minutes on two cores

>>> cmake_args({"avx", "avx2", "fma", "f16c", "bmi2"})
'-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF'
>>> amx = cmake_args({"avx", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"})
>>> "-DGGML_AMX_INT8=ON" in amx and "-DCMAKE_CXX_FLAGS=-include" in amx
True
>>> "-DGGML_AMX_INT8=OFF" in cmake_args({"avx", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"}, amx=False)
True
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specgraft import machine

#: ggml's CMake option for each ``/proc/cpuinfo`` flag, in the order they are printed.
FLAG_OPTIONS = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)

#: The ``/proc/cpuinfo`` flags AMX needs (ggml's AMX kernels also need AVX-512 VNNI).
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "avx512f", "avx512_vnni"})

#: AMX off, the switches where the CPU lacks it or ``amx=False``.
NO_AMX = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")

#: The GCC fix an AMX build force-includes (module docstring).
AMX_HEADER = Path(__file__).with_name("llamacpp_amx.h")

#: The small-batch kernels :func:`patch_source` adds to an AMX build (module docstring).
AMX_ROWS = Path(__file__).with_name("llamacpp_amx_rows.inc")

#: The llama-cpp-python release the backend is built and tested against, and ``--install``
#: builds: the one pyproject's ``llamacpp`` extra pins.
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"

#: Where ggml's AMX matrix products live in a llama.cpp source tree.
MMQ = Path("ggml/src/ggml-cpu/amx/mmq.cpp")

#: The huge-page advice :func:`patch_source` adds to every build (module docstring).
HUGE_PAGES = Path(__file__).with_name("llamacpp_huge_pages.inc")

#: Where ggml allocates its buffers in a llama.cpp source tree.
GGML_C = Path("ggml/src/ggml.c")


@dataclass(frozen=True)
class SourcePatch:
    """One file of llama.cpp's source that :func:`patch_source` changes: ``include`` is copied
    beside it, and each ``(anchor, replacement)`` of ``edits`` replaces text found exactly once.
    ``marker`` is text that only a patched file holds."""

    path: Path
    include: Path
    marker: str
    edits: tuple[tuple[str, str], ...]


_ENTRY = "void ggml_backend_amx_mul_mat(const ggml_compute_params * params, struct ggml_tensor * dst) {\n"
_BARRIER = "    ggml_barrier(params->threadpool);\n\n"
_ONE_ROW = "    if (M == 1) {\n"
_MALLOC = "void * ggml_aligned_malloc(size_t size) {\n"
_RETURN = "    return aligned_memory;\n#endif\n}\n"

#: The small-batch kernels (AMX builds only: they compile where ``GGML_AMX_INT8`` is on): before
#: ggml's entry point, and the call once every thread has quantized its rows of activations
#: (after the barrier). The huge-page advice (every build, Linux only): before ggml's allocator,
#: and the call before it returns a buffer.
PATCHES = (
    SourcePatch(
        MMQ,
        AMX_ROWS,
        "specgraft_rows::",
        (
            (_ENTRY, f'#include "{AMX_ROWS.name}"  // added by specgraft\n\n' + _ENTRY),
            (
                _BARRIER + _ONE_ROW,
                _BARRIER + "    if (specgraft_rows::mul_mat(params, src0, dst, wdata)) {  // added by specgraft\n        return;\n    }\n\n" + _ONE_ROW,
            ),
        ),
    ),
    SourcePatch(
        GGML_C,
        HUGE_PAGES,
        "specgraft_advise_huge_pages(",
        (
            (_MALLOC, f'#include "{HUGE_PAGES.name}"  // added by specgraft\n\n' + _MALLOC),
            (_RETURN, "    specgraft_advise_huge_pages(aligned_memory, size);  // added by specgraft\n" + _RETURN),
        ),
    ),
)

#: Always: only the library (llama-cpp-python needs no tests, examples, tools or the multimodal
#: library: the build takes ~3.5 minutes on 2 cores).
FIXED = ("-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAVA_BUILD=OFF")


def amx_args(flags: set[str] | frozenset[str], amx: bool = True) -> list[str]:
    """The AMX switches for a CPU with ``flags``: on (with the GCC fix) where it has AMX, else off.

    >>> amx_args({"avx2"})
    ['-DGGML_AMX_TILE=OFF', '-DGGML_AMX_INT8=OFF', '-DGGML_AMX_BF16=OFF']
    """
    if not (amx and AMX_FLAGS <= flags):
        return list(NO_AMX)
    bf16 = "ON" if "amx_bf16" in flags else "OFF"
    return ["-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON", f"-DGGML_AMX_BF16={bf16}", f"-DCMAKE_CXX_FLAGS=-include{AMX_HEADER}"]


def cmake_args(flags: set[str] | frozenset[str] | None = None, amx: bool = True) -> str:
    """``CMAKE_ARGS`` for a CPU with ``/proc/cpuinfo`` ``flags`` (default: this one's); empty off
    x86-64 Linux, where llama.cpp's own default is right. ``amx=False``: AMX off even where the
    CPU has it."""
    if flags is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return ""
        flags = machine.cpu_flags()
    if not flags:
        return ""
    enabled = [f"-D{option}=ON" for flag, option in FLAG_OPTIONS if flag in flags]
    # AVX-512 sub-extensions only mean something with AVX-512 Foundation
    if "avx512f" not in flags:
        enabled = [e for e in enabled if not e.startswith("-DGGML_AVX512")]
    return " ".join(["-DGGML_NATIVE=OFF", *enabled, *amx_args(flags, amx), *FIXED])


def patch_source(root: str | Path) -> bool:
    """Add specgraft's changes to the llama.cpp source tree at ``root`` (a checkout, or
    llama-cpp-python's ``vendor/llama.cpp``): for each of :data:`PATCHES`, its file copied beside
    the file it changes and its insertions there. True if it changed a file, False if every file
    already had its insertions (the included files are written again either way, so a tree
    patched by an older specgraft gets today's kernels, and one patched before the huge-page
    advice gets it). Raises ``ValueError`` where a file is missing or an anchor is not found
    exactly once (another llama.cpp version: nothing is changed then).

    The small-batch kernels only compile in builds with AMX (``GGML_AMX_INT8``); elsewhere the
    tree builds as before, with the huge-page advice.
    """
    texts: dict[Path, str] = {}
    for patch in PATCHES:
        file = Path(root) / patch.path
        if not file.is_file():
            raise ValueError(f"{file} not found: not a llama.cpp source tree")
        text = file.read_text()
        if patch.marker in text:
            continue
        for anchor, replacement in patch.edits:
            if text.count(anchor) != 1:
                found = text.count(anchor)
                raise ValueError(f"{file}: expected one {anchor.strip()!r}, found {found}; the patch was written for the llama.cpp of {LLAMA_CPP_PYTHON}")
            text = text.replace(anchor, replacement)
        texts[file] = text
    for patch in PATCHES:
        file = Path(root) / patch.path
        (file.parent / patch.include.name).write_text(patch.include.read_text())
        if file in texts:
            file.write_text(texts[file])
    return bool(texts)


def install(amx: bool = True, pip: tuple[str, ...] = (sys.executable, "-m", "pip")) -> None:
    """Download llama-cpp-python's source, add specgraft's changes (:func:`patch_source`), and build and install it
    with :func:`cmake_args` (pip's output shows the build; ~3-4 minutes on two cores)."""
    with tempfile.TemporaryDirectory(prefix="specgraft-llamacpp-") as tmp:
        print(f"downloading {LLAMA_CPP_PYTHON} (source)", flush=True)
        subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", tmp, LLAMA_CPP_PYTHON], check=True)
        (archive,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        (source,) = (p for p in Path(tmp).iterdir() if p.is_dir())
        patch_source(source / "vendor" / "llama.cpp")
        flags = cmake_args(amx=amx)
        print(f"building llama.cpp with CMAKE_ARGS={flags!r}", flush=True)
        # pip reinstalls a project from a directory whatever version is installed (and keeps the
        # installed dependencies, which --force-reinstall would not)
        subprocess.run([*pip, "install", "--no-cache-dir", str(source)], check=True, env={**os.environ, "CMAKE_ARGS": flags})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print the CMAKE_ARGS that build llama.cpp for this CPU, or build llama-cpp-python with them.")
    parser.add_argument("--no-amx", action="store_true", help="leave AMX off even where the CPU has it")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--install", action="store_true", help=f"download {LLAMA_CPP_PYTHON}, add the small-batch AMX kernels and the huge-page advice, build and install it")
    action.add_argument("--patch", metavar="DIR", help="add the small-batch AMX kernels and the huge-page advice to the llama.cpp source tree DIR and exit")
    args = parser.parse_args()
    if args.install:
        install(amx=not args.no_amx)
    elif args.patch:
        try:
            print("patched" if patch_source(args.patch) else "already patched", args.patch)
        except ValueError as e:
            parser.exit(2, f"error: {e}\n")
    else:
        print(cmake_args(amx=not args.no_amx))
