// Checks csrc/cpu/fp8_avx2.h against c10's scalar float8 conversions: every code
// decodes to c10's float (and, in its unit, to it times kHalfScale), and every float32 bit pattern (or every `stride`-th
// one) encodes to c10's code, for e4m3fn and e5m2. Built by tests/test_fp8_avx2.py
// with -mavx2 -mf16c; prints the first mismatch and exits 1.
#include <torch/headeronly/util/Float8_e4m3fn.h>
#include <torch/headeronly/util/Float8_e5m2.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cpu/fp8_avx2.h"

namespace fp8 = inductor_lamb::cpu::fp8_avx2;

template <typename F, typename Decode, typename Encode>
bool check(const char* name, Decode c10_decode, Encode c10_encode, uint64_t stride) {
  alignas(32) uint8_t codes[16];
  for (int c0 = 0; c0 < 256; c0 += 16) {  // decode: every code
    for (int k = 0; k < 16; ++k) codes[k] = uint8_t(c0 + k);
    alignas(32) float out[16];
    __m256 a, b;
    fp8::decode16<F>(_mm_load_si128(reinterpret_cast<const __m128i*>(codes)), a, b);
    _mm256_store_ps(out, a);
    _mm256_store_ps(out + 8, b);
    // ... and in their unit (Unit: the float16's own value, c10's divided by 1 / kHalfScale)
    alignas(32) float unit[16];
    fp8::decode16<F, true>(_mm_load_si128(reinterpret_cast<const __m128i*>(codes)), a, b);
    _mm256_store_ps(unit, a);
    _mm256_store_ps(unit + 8, b);
    for (int k = 0; k < 16; ++k) {
      const float want = c10_decode(codes[k]), want_unit = want * F::kHalfScale;  // (exact: a power of two)
      if (!(std::memcmp(&want, &out[k], 4) == 0 || (std::isnan(want) && std::isnan(out[k])))) {
        std::printf("%s decode 0x%02x: got %g, c10 %g\n", name, codes[k], out[k], want);
        return false;
      }
      if (!(std::memcmp(&want_unit, &unit[k], 4) == 0 || (std::isnan(want) && std::isnan(unit[k])))) {
        std::printf("%s unit decode 0x%02x: got %g, c10 %g times %g\n", name, codes[k], unit[k], want,
                    double(F::kHalfScale));
        return false;
      }
    }
  }
  long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t hi = 0; hi < (int64_t(1) << 28); ++hi) {  // encode: 16 consecutive patterns per step
    const uint64_t base = uint64_t(hi) << 4;
    if (base % stride >= 16 && stride > 16) continue;
    alignas(32) float x[16];
    alignas(32) uint8_t got[16];
    for (int k = 0; k < 16; ++k) {
      const uint32_t bits = uint32_t(base + k);
      std::memcpy(&x[k], &bits, 4);
    }
    _mm_store_si128(reinterpret_cast<__m128i*>(got), fp8::encode16<F>(_mm256_load_ps(x), _mm256_load_ps(x + 8)));
    for (int k = 0; k < 16; ++k) {
      const uint8_t want = c10_encode(x[k]);
      if (got[k] != want) {
        if (bad == 0) {
          uint32_t bits;
          std::memcpy(&bits, &x[k], 4);
#pragma omp critical
          std::printf("%s encode 0x%08x (%g): got 0x%02x, c10 0x%02x\n", name, bits, x[k], got[k], want);
        }
        ++bad;
      }
    }
  }
  std::printf("%s: %s\n", name, bad ? "MISMATCH" : "ok");
  return bad == 0;
}

// e4m3 saturates: a finite value past 448 or an infinity encodes as +-448, NaN as NaN. c10's
// encoder does so from torch 2.13 on (2.11 and 2.12 gave NaN): the oracle clamps first, so it is
// the same on every release (csrc/cpu/vec_engine.h, Fp8Codec::from_float).
uint8_t e4m3_saturating(float x) {
  return c10::detail::fp8e4m3fn_from_fp32_value(x > 448.f ? 448.f : (x < -448.f ? -448.f : x));
}

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16;  // 16: every float32
  const bool ok = check<fp8::E4M3>("e4m3fn", c10::detail::fp8e4m3fn_to_fp32_value,
                                   e4m3_saturating, stride) &
                  check<fp8::E5M2>("e5m2", c10::detail::fp8e5m2_to_fp32_value,
                                   c10::detail::fp8e5m2_from_fp32_value, stride);
  return ok ? 0 : 1;
}
