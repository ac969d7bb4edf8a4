"""CMake flags that build llama.cpp (inside ``pip install llama-cpp-python``) for this CPU and run.

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
cached cells apart, see ``specgraft.models.llamacpp``). And 8 or more rows cost less (16 rows 3.1 one-row steps instead of 3.7 on two
cores; 2-4 rows cost 10-17% more). ``--no-amx`` prints the flags without it.

AMX builds need one fix with GCC: its ``_tile_loadconfig`` declares an 8-byte operand, so GCC
drops the stores of ggml's tile shapes and the first AMX forward dies with *Illegal
instruction* (``llamacpp_amx.h``, force-included into the C++ sources with ``-include``; the
path must not contain spaces). Clang needs nothing; the flag is harmless there.

Print them, and install::

    CMAKE_ARGS="$(python -m specgraft.models.llamacpp_build)" pip install -e ".[llamacpp]"

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
import platform
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print the CMAKE_ARGS that build llama.cpp for this CPU.")
    parser.add_argument("--no-amx", action="store_true", help="leave AMX off even where the CPU has it")
    print(cmake_args(amx=not parser.parse_args().no_amx))
