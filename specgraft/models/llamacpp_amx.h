/* Force-included into llama.cpp's C++ sources when it is built with AMX by GCC
 * (`python -m specgraft.models.llamacpp_build` adds `-include` with this file's path).
 *
 * GCC's <amxtileintrin.h> writes `_tile_loadconfig(p)` as an asm whose memory operand is
 * `*(const void **)p`: eight bytes. The compiler then treats the other 56 bytes of the tile
 * configuration as never read, and in ggml's `ggml_tile_config_init` it drops the stores of the
 * tile shapes (the stack slot is reused right after). `ldtilecfg` loads palette 1 with every
 * tile 0 rows x 0 bytes, and the first `tilezero` raises #UD: the process dies with
 * "Illegal instruction" at the first forward of two or more rows.
 *
 * The macro below names the whole 64-byte configuration as the operand. Clang implements the
 * intrinsic as a builtin that reads all 64 bytes and needs nothing.
 */
#if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && defined(__AMX_TILE__)
#include <immintrin.h>
#undef _tile_loadconfig
#define _tile_loadconfig(config) \
    __asm__ volatile("ldtilecfg\t%0" ::"m"(*(const unsigned char(*)[64])(config)))
#endif
