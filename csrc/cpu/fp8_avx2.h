#pragma once
// float8 <-> float32 on AVX2 + F16C, 16 values at a time, with c10's codes (its
// fp8*_from_fp32_value / fp8*_to_fp32_value, bit for bit). Plain intrinsics, no
// torch: vec_engine.h uses it in the AVX2 kernels, and tests/cpp/fp8_avx2_check.cpp
// checks it against c10 on every float32.
#include <immintrin.h>

#include <cstdint>
#include <limits>

namespace inductor_lamb::cpu::fp8_avx2 {

// A float8 format as float16 bits: a value times kHalfScale is a float16 whose
// kDrop lowest bits are zero (subnormals included); kOverflow is what c10 gives
// past the largest finite value.
struct E4M3 {  // e4m3fn: S EEEE MMM = the float16 S 0EEEE MMM0000000 times 2^8
  static constexpr float kHalfScale = 1.f / 256.f;
  static constexpr int kDrop = 7, kOverflow = 0x7E;  // saturates at 448
  static constexpr bool kNanPattern = true;          // 0x7F / 0xFF are NaN; no inf
};
struct E5M2 {  // e5m2: the high byte of a float16
  static constexpr float kHalfScale = 1.f;
  static constexpr int kDrop = 8, kOverflow = 0x7C;  // inf
  static constexpr bool kNanPattern = false;
};

// 16 codes -> two vectors of 8 floats. Exact: the codes placed as float16 bits. Unit: the
// float16 values themselves (the codes' values times F::kHalfScale), without the multiply back.
template <typename F, bool Unit = false>
inline void decode16(const __m128i& codes, __m256& a, __m256& b) {
  const __m256i c = _mm256_cvtepu8_epi16(codes);
  if (F::kNanPattern) {
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7F));
    const __m256i half = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8),
                                         _mm256_slli_epi16(mag, F::kDrop));
    const __m256i nan16 = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F));  // would be 1.875 * 2^8 = 480
    const __m256 scale = _mm256_set1_ps(1.f / F::kHalfScale);
    const __m256 qnan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
    const auto scaled = [&](__m256 x) { return Unit ? x : _mm256_mul_ps(x, scale); };
    a = _mm256_blendv_ps(scaled(_mm256_cvtph_ps(_mm256_castsi256_si128(half))), qnan,
                         _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan16))));
    b = _mm256_blendv_ps(scaled(_mm256_cvtph_ps(_mm256_extracti128_si256(half, 1))), qnan,
                         _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan16, 1))));
  } else {
    const __m256i half = _mm256_slli_epi16(c, F::kDrop);
    a = _mm256_cvtph_ps(_mm256_castsi256_si128(half));
    b = _mm256_cvtph_ps(_mm256_extracti128_si256(half, 1));
  }
}

// Two vectors of 8 floats -> 16 codes, rounded to nearest even as c10 does, in
// float16 steps. F16C converts x * F::kHalfScale to float16 rounding toward
// zero, and the lowest bit is set when that was inexact: round to odd, which a
// second rounding to nearest even turns into the correctly rounded result (the
// 10 mantissa bits of float16 exceed float8's 3 by 2 or more), here by adding
// half an ulp of float8 to the float16 bits. NaN gives 0x7F, overflow F::kOverflow.
template <typename F>
inline __m128i encode16(__m256 a, __m256 b) {
  const auto k16 = [](int v) { return _mm256_set1_epi16(static_cast<int16_t>(v)); };
  if (F::kHalfScale != 1.f) {  // exact: a power of two
    a = _mm256_mul_ps(a, _mm256_set1_ps(F::kHalfScale));
    b = _mm256_mul_ps(b, _mm256_set1_ps(F::kHalfScale));
  }
  const __m128i ha = _mm256_cvtps_ph(a, _MM_FROUND_TO_ZERO), hb = _mm256_cvtps_ph(b, _MM_FROUND_TO_ZERO);
  const __m256 inexact_a = _mm256_cmp_ps(_mm256_cvtph_ps(ha), a, _CMP_NEQ_UQ);
  const __m256 inexact_b = _mm256_cmp_ps(_mm256_cvtph_ps(hb), b, _CMP_NEQ_UQ);
  const __m256i inexact = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(_mm256_castps_si256(inexact_a), _mm256_castps_si256(inexact_b)), 0xD8);
  const __m256i h = _mm256_or_si256(_mm256_set_m128i(hb, ha), _mm256_and_si256(inexact, k16(1)));
  const __m256i mag = _mm256_and_si256(h, k16(0x7FFF));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(mag, F::kDrop), k16(1));
  __m256i r = _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(mag, k16((1 << (F::kDrop - 1)) - 1)), odd),
                                F::kDrop);
  r = _mm256_min_epu16(r, k16(F::kOverflow));
  r = _mm256_blendv_epi8(r, k16(0x7F), _mm256_cmpgt_epi16(mag, k16(0x7C00)));  // NaN
  r = _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi16(h, 8), k16(0x80)));  // sign
  return _mm_packus_epi16(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

}  // namespace inductor_lamb::cpu::fp8_avx2
