"""The CMake flags that build llama.cpp, the GCC fix an AMX build carries, and what
:func:`patch_source` adds to llama.cpp's source: the small-batch AMX kernels, and huge pages asked
for when ggml allocates a buffer."""

import os
import shutil
import subprocess
import sys

import pytest

from specgraft import machine
from specgraft.models.llamacpp_build import AMX_HEADER, AMX_ROWS, GGML_C, HUGE_PAGES, LLAMA_CPP_PYTHON, MMQ, cmake_args, patch_source

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


# the parts of ggml's ggml-cpu/amx/mmq.cpp the patch anchors on, as in llama-cpp-python 0.3.36
MMQ_TEXT = """#if defined(__AMX_INT8__) && defined(__AVX512VNNI__)
inline int64_t ggml_batch_offset(const ggml_tensor * t, int64_t batch_idx, int64_t ne2) { return 0; }

void ggml_backend_amx_mul_mat(const ggml_compute_params * params, struct ggml_tensor * dst) {
    // quantize the rows of A into wdata
    ggml_barrier(params->threadpool);

    if (M == 1) {
        // one row
    }
    // AMX tiles
}
#endif
"""


# the part of ggml's ggml.c the patch anchors on, as in llama-cpp-python 0.3.36
GGML_C_TEXT = """void * ggml_aligned_malloc(size_t size) {
    void * aligned_memory = NULL;
#if defined(_MSC_VER)
    return _aligned_malloc(size, alignment);
#else
    int result = posix_memalign(&aligned_memory, alignment, size);
    if (result != 0) {
        return NULL;
    }
    return aligned_memory;
#endif
}

void ggml_aligned_free(void * ptr, size_t size) {
}
"""


def write_tree(root, mmq_text=MMQ_TEXT, ggml_c_text=GGML_C_TEXT):
    for path, text in ((MMQ, mmq_text), (GGML_C, ggml_c_text)):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root / MMQ, root / GGML_C


def test_patch_source_adds_the_kernels_and_the_huge_pages_once(tmp_path):
    mmq, ggml_c = write_tree(tmp_path)
    assert patch_source(tmp_path) is True
    for file, include in ((mmq, AMX_ROWS), (ggml_c, HUGE_PAGES)):
        assert (file.parent / include.name).read_text() == include.read_text()
    text, ggml_text = mmq.read_text(), ggml_c.read_text()
    include, entry = text.index(f'#include "{AMX_ROWS.name}"'), text.index("void ggml_backend_amx_mul_mat(")
    call, barrier, one_row = text.index("specgraft_rows::mul_mat(params, src0, dst, wdata)"), text.index("ggml_barrier"), text.index("if (M == 1)")
    assert text.index("ggml_batch_offset") < include < entry < barrier < call < one_row, "the kernels see ggml's helpers; the call runs once every row is quantized"
    include, entry = ggml_text.index(f'#include "{HUGE_PAGES.name}"'), ggml_text.index("void * ggml_aligned_malloc(")
    failure, call, ret = ggml_text.index("return NULL;"), ggml_text.index("specgraft_advise_huge_pages(aligned_memory, size);"), ggml_text.index("return aligned_memory;")
    assert include < entry < failure < call < ret < ggml_text.index("void ggml_aligned_free("), "only a buffer that was allocated is advised"
    (mmq.parent / AMX_ROWS.name).write_text("// an older specgraft's kernels")
    assert patch_source(tmp_path) is False and mmq.read_text() == text and ggml_c.read_text() == ggml_text, "a second patch leaves the files as they were"
    assert (mmq.parent / AMX_ROWS.name).read_text() == AMX_ROWS.read_text(), "and brings the kernels up to date"


def test_a_tree_patched_before_the_huge_pages_gets_them(tmp_path):
    mmq, ggml_c = write_tree(tmp_path)
    patch_source(tmp_path)
    ggml_c.write_text(GGML_C_TEXT)  # as an older specgraft left it
    mmq_text = mmq.read_text()
    assert patch_source(tmp_path) is True
    assert "specgraft_advise_huge_pages(aligned_memory, size)" in ggml_c.read_text() and mmq.read_text() == mmq_text


def test_patch_source_refuses_another_llamacpp(tmp_path):
    mmq, ggml_c = write_tree(tmp_path, mmq_text=MMQ_TEXT.replace("    if (M == 1) {", "    if (M < 2) {"))
    with pytest.raises(ValueError, match="expected one"):
        patch_source(tmp_path)
    assert "specgraft" not in mmq.read_text() and not (mmq.parent / AMX_ROWS.name).exists(), "nothing half-done"
    assert "specgraft" not in ggml_c.read_text() and not (ggml_c.parent / HUGE_PAGES.name).exists(), "not even in the other file"
    mmq, ggml_c = write_tree(tmp_path / "older", ggml_c_text=GGML_C_TEXT.replace("    return aligned_memory;\n", "    return p;\n"))
    with pytest.raises(ValueError, match="ggml.c: expected one"):
        patch_source(tmp_path / "older")
    assert "specgraft" not in mmq.read_text() and not (mmq.parent / AMX_ROWS.name).exists(), "nothing half-done"
    with pytest.raises(ValueError, match="not a llama.cpp source tree"):
        patch_source(tmp_path / "elsewhere")


# allocates as ggml does (posix_memalign), advises as the patched ggml.c does, and prints whether
# the kernel marked the buffer's mapping for huge pages ("hg" among the VmFlags of /proc/self/smaps)
ADVISE_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "llamacpp_huge_pages.inc"

static int huge_page_flag(void * p) {
    FILE * f = fopen("/proc/self/smaps", "r");
    char line[512];
    uintptr_t lo = 0, hi = 0, a = (uintptr_t) p;
    int inside = 0, flag = -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = lo <= a && a < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            flag = strstr(line, " hg") != NULL;
        }
    }
    fclose(f);
    return flag;
}

int main(int argc, char ** argv) {
    if (argc != 2) return 4;
    size_t size = (size_t) atol(argv[1]) << 20;
    void * p = NULL;
    if (posix_memalign(&p, 64, size) != 0) return 3;
    specgraft_advise_huge_pages(p, size);
    // a control: whether this kernel marks a mapping this process advises itself
    void * q = NULL;
    if (posix_memalign(&q, 64, 64 << 20) != 0) return 3;
    uintptr_t start = ((uintptr_t) q + 4095) & ~(uintptr_t) 4095;
    int control = madvise((void *) start, (32 << 20), MADV_HUGEPAGE) == 0 ? huge_page_flag((void *) start) : 0;
    printf("%d %d\n", huge_page_flag((char *) p + size / 2), control);
    return 0;
}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("gcc") is None, reason="needs Linux and gcc")
def test_the_huge_page_advice_marks_large_buffers_only(tmp_path):
    """Compiled as ggml.c is (C11, ggml's feature macros), the advice marks a 64 MiB buffer's pages for huge pages,
    and leaves a 1 MiB one (below the 32 MiB floor) and any buffer under ``SPECGRAFT_HUGE_PAGES=0``
    alone."""
    source, binary = tmp_path / "advise.c", tmp_path / "advise"
    source.write_text(ADVISE_PROGRAM)
    # ggml's C flags on Linux (its CMake), warnings as errors
    flags = ["-O2", "-std=c11", "-D_XOPEN_SOURCE=600", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"]
    subprocess.run(["gcc", *flags, f"-I{HUGE_PAGES.parent}", str(source), "-o", str(binary)], check=True)

    def flag(megabytes, **env):
        run = subprocess.run([str(binary), str(megabytes)], capture_output=True, text=True, env={**os.environ, "SPECGRAFT_HUGE_PAGES": "1", **env}, check=True)
        advised, control = (int(x) for x in run.stdout.split())
        if control != 1:
            pytest.skip("this kernel does not mark mappings for huge pages (no THP, or smaps without VmFlags)")
        return advised

    assert flag(64) == 1
    assert flag(1) == 0
    assert flag(64, SPECGRAFT_HUGE_PAGES="0") == 0


def test_install_builds_the_release_the_extra_pins():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["llamacpp"] == [LLAMA_CPP_PYTHON]
    assert AMX_ROWS.name in " ".join(pyproject["tool"]["setuptools"]["package-data"]["specgraft"]), "shipped in the wheel"
