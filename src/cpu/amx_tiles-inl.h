#pragma once

// The AMX tiles of the bfloat16 flash kernel (Note [AMX tiles]): the tile
// configuration, a TileScope per task, one block of tile products, and the
// software model of the tile instructions for test builds. Included by
// flash_bf16-inl.h after its Pair and register tiles, only in the AMX_BF16
// kernel files.

#include <c10/util/Exception.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if defined(CPU_CAPABILITY_AMX_BF16)
namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// Note [AMX tiles]
// TDPBF16PS multiplies tiles: C (16 rows × 16 floats) += A (16 rows × 16
// pairs) · B (16 rows of pairs × 16 columns), B's rows being pairs along the
// reduction, as the register tiles' B already is (flash_bf16-inl.h). Each
// thread loads one configuration for the whole of a task (TileScope): every
// tile 16 rows of 64 bytes, tiles 0-3 for C (32 rows × 32 columns: one
// register tile's width), 4-5 for A and 6-7 for B. What falls outside whole
// tiles (rows past a multiple of 16, pairs past a multiple of 16) runs in
// the register tiles, which the same file has.
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

#if defined(D2L_AMX_SOFTWARE_TILES)
// A model of the five tile instructions used here, in plain C++, for
// builds that test the AMX kernel's blocking on CPUs without AMX
// (D2L_AMX_SOFTWARE_TILES, set by the sanitizer presets: every tile load
// and store is then an ordinary access that AddressSanitizer checks). It
// follows Intel's definitions: a tile is `rows` rows of `bytes_per_row`
// bytes as configured (loading an unconfigured tile is an error, as it
// faults on the hardware); TDPBF16PS adds to C[m][n] the products of A's
// pair k of row m with B's pair n of row k, bfloat16 denormals read as
// zero. Not a library feature: a build with it runs no tile instruction.
struct SoftwareTiles {
  bool configured = false;
  TileConfig config;
  alignas(64) unsigned char data[8][1024];
};
inline thread_local SoftwareTiles software_tiles;

inline void tile_configure(const TileConfig* c) {
  software_tiles.config = *c;
  software_tiles.configured = true;
  std::memset(software_tiles.data, 0, sizeof software_tiles.data);
}
inline void tile_release() { software_tiles.configured = false; }
inline void tile_check(int t) {
  TORCH_INTERNAL_ASSERT(software_tiles.configured, "tile instruction outside a TileScope");
  TORCH_INTERNAL_ASSERT(software_tiles.config.rows[t] == 16 &&
                        software_tiles.config.bytes_per_row[t] == 64);
}
inline void tile_load(int t, const void* base, int64_t stride) {
  tile_check(t);
  for (int r = 0; r < 16; ++r) {
    std::memcpy(software_tiles.data[t] + r * 64, static_cast<const char*>(base) + r * stride, 64);
  }
}
inline void tile_store(int t, void* base, int64_t stride) {
  tile_check(t);
  for (int r = 0; r < 16; ++r) {
    std::memcpy(static_cast<char*>(base) + r * stride, software_tiles.data[t] + r * 64, 64);
  }
}
inline void tile_zero(int t) {
  tile_check(t);
  std::memset(software_tiles.data[t], 0, 1024);
}
inline float bf16_daz(uint16_t x) {
  if ((x & 0x7f80) == 0) x &= 0x8000;  // denormal (or zero): zero of its sign
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void tile_dpbf16ps(int c, int a, int b) {
  tile_check(c);
  tile_check(a);
  tile_check(b);
  float C[16][16];
  Pair A[16][16], B[16][16];
  std::memcpy(C, software_tiles.data[c], 1024);
  std::memcpy(A, software_tiles.data[a], 1024);
  std::memcpy(B, software_tiles.data[b], 1024);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float sum = C[m][n];
      for (int k = 0; k < 16; ++k) {
        sum += bf16_daz(A[m][k] & 0xffff) * bf16_daz(B[k][n] & 0xffff);
        sum += bf16_daz(A[m][k] >> 16) * bf16_daz(B[k][n] >> 16);
      }
      C[m][n] = sum;
    }
  }
  std::memcpy(software_tiles.data[c], C, 1024);
}
#define D2L_TILE_LOADD(t, base, stride) tile_load(t, base, stride)
#define D2L_TILE_STORED(t, base, stride) tile_store(t, base, stride)
#define D2L_TILE_ZERO(t) tile_zero(t)
#define D2L_TILE_DPBF16PS(c, a, b) tile_dpbf16ps(c, a, b)
#else
inline void tile_configure(const TileConfig* c) {
  // GCC 12 does not count LDTILECFG as a read of the 64 bytes at `c`: with
  // the configuration made on the stack it sank the stores of `rows` and
  // `bytes_per_row` past the instruction, the tiles stayed unconfigured and
  // the first tile load was an illegal instruction. The asm reads them.
  asm volatile("" : : "r"(c), "m"(*c) : "memory");
  _tile_loadconfig(c);
}
inline void tile_release() { _tile_release(); }
#define D2L_TILE_LOADD(t, base, stride) _tile_loadd(t, base, stride)
#define D2L_TILE_STORED(t, base, stride) _tile_stored(t, base, stride)
#define D2L_TILE_ZERO(t) _tile_zero(t)
#define D2L_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

// Every tile 16 rows of 64 bytes (Note [AMX tiles]).
constexpr TileConfig sixteen_by_sixty_four() {
  TileConfig config{};
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  return config;
}

/// The tile configuration of Note [AMX tiles], loaded for the lifetime of a
/// task in one thread and released after it (the tile state is the
/// thread's; another library's products may load another between tasks).
class TileScope {
  alignas(64) static constexpr TileConfig kConfig = sixteen_by_sixty_four();

 public:
  TileScope() { tile_configure(&kConfig); }
  ~TileScope() { tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The tile loads and stores are asm statements that do not tell the
// compiler which memory they read or write: a barrier before the loads and
// after the stores keeps every other access on its side.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// C[0:16 · kRowTiles, 0:32] (= or +=) A[0:16 · kRowTiles, 0:K] · B[0:K, 0:32],
// K a multiple of 16 pairs; strides in pairs and floats, as gemm_bf16's.
template <int kRowTiles>
inline void amx_tile_block(int64_t K, const Pair* A, int64_t lda, const Pair* B, int64_t ldb,
                           float* C, int64_t ldc, bool accumulate) {
  const int64_t a_stride = lda * 4, b_stride = ldb * 4, c_stride = ldc * 4;
  if (accumulate) {
    D2L_TILE_LOADD(0, C, c_stride);
    D2L_TILE_LOADD(1, C + 16, c_stride);
    if constexpr (kRowTiles == 2) {
      D2L_TILE_LOADD(2, C + 16 * ldc, c_stride);
      D2L_TILE_LOADD(3, C + 16 * ldc + 16, c_stride);
    }
  } else {
    D2L_TILE_ZERO(0);
    D2L_TILE_ZERO(1);
    if constexpr (kRowTiles == 2) {
      D2L_TILE_ZERO(2);
      D2L_TILE_ZERO(3);
    }
  }
  for (int64_t k = 0; k < K; k += 16) {
    D2L_TILE_LOADD(6, B + k * ldb, b_stride);
    D2L_TILE_LOADD(7, B + k * ldb + 16, b_stride);
    D2L_TILE_LOADD(4, A + k, a_stride);
    D2L_TILE_DPBF16PS(0, 4, 6);
    D2L_TILE_DPBF16PS(1, 4, 7);
    if constexpr (kRowTiles == 2) {
      D2L_TILE_LOADD(5, A + 16 * lda + k, a_stride);
      D2L_TILE_DPBF16PS(2, 5, 6);
      D2L_TILE_DPBF16PS(3, 5, 7);
    }
  }
  D2L_TILE_STORED(0, C, c_stride);
  D2L_TILE_STORED(1, C + 16, c_stride);
  if constexpr (kRowTiles == 2) {
    D2L_TILE_STORED(2, C + 16 * ldc, c_stride);
    D2L_TILE_STORED(3, C + 16 * ldc + 16, c_stride);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
#endif
