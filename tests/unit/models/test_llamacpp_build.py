"""The CMake flags that build llama.cpp, and the GCC fix an AMX build carries."""

import shutil
import subprocess

import pytest

from specgraft import machine
from specgraft.models.llamacpp_build import AMX_HEADER, cmake_args

AVX512 = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_vnni", "avx512_bf16"}


def test_amx_is_built_where_the_cpu_has_it():
    amx = cmake_args(AVX512 | {"amx_tile", "amx_int8", "amx_bf16"})
    assert "-DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON" in amx
    assert f"-DCMAKE_CXX_FLAGS=-include{AMX_HEADER}" in amx and AMX_HEADER.is_file()
    assert " " not in str(AMX_HEADER), "CMAKE_ARGS is split at spaces"
    for args in (cmake_args(AVX512), cmake_args(AVX512 | {"amx_tile", "amx_int8"}, amx=False), cmake_args({"avx2", "amx_tile", "amx_int8"})):
        assert "-DGGML_AMX_INT8=OFF" in args and "-include" not in args
    assert cmake_args(set()) == ""


# ggml's tile set-up, reduced: the configuration is a local the compiler may drop stores to
# when it believes ldtilecfg reads 8 bytes of it; sttilecfg reads back what the CPU loaded.
PROGRAM = r"""
#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <sys/syscall.h>
struct tile_config_t { unsigned char palette_id, start_row, reserved[14]; unsigned short colsb[16]; unsigned char rows[16]; };
__attribute__((noinline)) void init() {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    for (int i = 0; i < 8; ++i) { tc.rows[i] = 8 + i; tc.colsb[i] = 64; }
    _tile_loadconfig(&tc);
}
__attribute__((noinline)) void clobber() { alignas(64) volatile unsigned char junk[256]; std::memset((void *)junk, 0, sizeof junk); }
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 2;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    init();
    clobber();
    alignas(64) tile_config_t back = {};
    _tile_storeconfig(&back);
    for (int i = 0; i < 8; ++i) std::printf("%d ", back.rows[i]);
    _tile_release();
    return 0;
}
"""


@pytest.mark.skipif(not {"amx_tile", "amx_int8"} <= machine.cpu_flags() or shutil.which("g++") is None, reason="needs an AMX CPU and g++")
def test_the_amx_header_loads_the_whole_tile_configuration(tmp_path):
    """Compiled as llama.cpp's AMX sources are (GCC, -O2, AMX on, the header force-included),
    the tile shapes reach the CPU: every tile has the rows it was configured with. (Without the
    header, GCC 12 prints eight zeros here: the stores were dropped.)"""
    source, binary = tmp_path / "tiles.cpp", tmp_path / "tiles"
    source.write_text(PROGRAM)
    subprocess.run(["g++", "-O2", "-mamx-tile", "-mamx-int8", f"-include{AMX_HEADER}", str(source), "-o", str(binary)], check=True)
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    if run.returncode == 2:
        pytest.skip("the kernel does not grant AMX tile data")
    assert run.returncode == 0 and run.stdout.split() == [str(8 + i) for i in range(8)]
