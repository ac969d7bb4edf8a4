"""CMake flags that build llama.cpp (inside ``pip install llama-cpp-python``) for this CPU and run.

llama.cpp's default build (``GGML_NATIVE=ON``: ``-march=native``) turned on AMX tiles on an Intel
Xeon VM whose hypervisor does not let a process use them: the library built, then died with
*Illegal instruction* at the first forward. So the flags name each instruction-set extension
the CPU advertises (``/proc/cpuinfo``) with ``GGML_NATIVE=OFF`` and leave AMX off everywhere:
AVX, AVX2, FMA, F16C and BMI2 on any x86-64 CPU of the last decade; AVX-512 and its VBMI, VNNI
and BF16 extensions where present (Zen 4/5, Intel server parts); AVX-VNNI where present. On
anything else (ARM, no ``/proc/cpuinfo``) the flags are empty and llama.cpp's default applies.

Print them, and install::

    CMAKE_ARGS="$(python -m specgraft.models.llamacpp_build)" pip install -e ".[llamacpp]"

>>> cmake_args({"avx", "avx2", "fma", "f16c", "bmi2"})
'-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF'
"""

from __future__ import annotations

import platform

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

#: Always: no AMX (see the module docstring), and only the library (llama-cpp-python needs no
#: tests, examples, tools or the multimodal library: the build takes ~3.5 minutes on 2 cores).
FIXED = (
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAVA_BUILD=OFF",
)


def cmake_args(flags: set[str] | frozenset[str] | None = None) -> str:
    """``CMAKE_ARGS`` for a CPU with ``/proc/cpuinfo`` ``flags`` (default: this one's); empty off
    x86-64 Linux, where llama.cpp's own default is right."""
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
    return " ".join(["-DGGML_NATIVE=OFF", *enabled, *FIXED])


if __name__ == "__main__":
    print(cmake_args())
