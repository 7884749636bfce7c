#pragma once
// Stochastic rounding, once for every backend: LAMB16's moments to float8, and bfloat16 /
// float16 params without master copies to their storage type (docs/design.md,
// CONTRIBUTING.md). The CUDA kernels and the host use it on float / uint32_t, the
// CPU kernels on vectors (cpu/vec_engine.h gives the lane type, which must have
// the uint32 operators used below; shifts are logical, products wrap mod 2^32).
// The Inductor lowering, the decomposition and the reference write the same
// integer steps in torch (inductor_lamb/rounding.py); tests hold them to the same
// bits.
//
// Random bits: one 32-bit hash per element of (seed, step, the float32 bits of
// the gradient divided by grad_scale, i.e. float32 g * (1.f / grad_scale), the
// element's stored m and v codes before the step), so the rounding of an element
// depends only on its own inputs: not on its position, the list it sits in, the
// shard it lives on, the thread count or the backend. Its high 16 bits dither m,
// its low 16 bits v. A param's hash (param_hash) is built the same way from its own
// inputs.
//
// Rounding: a float32 |x| on the grid's normal range keeps the top
// 23 - kDrop mantissa bits of |x| + dither (dither uniform below the dropped
// bits): the larger neighbour comes with probability (|x| - lower) / spacing.
// Below the smallest normal (subnormals, spacing 2^(Emin - mantissa bits),
// the spacing at 2^Emin too) the same is done to |x| + 2^Emin, then 2^Emin is
// taken off again. The result is on the grid, so the encoder's round to nearest
// even keeps it. Non-finite values pass through.
#include <stdint.h>

#include "common/math.h"

namespace inductor_lamb::rounding {

constexpr uint32_t kMix1 = 0x7feb352du, kMix2 = 0x846ca68bu;  // "lowbias32" (C. Wellons)
constexpr uint32_t kCodeMul = 0x9e3779b9u;                   // spreads a code over 32 bits

// The float8 grids of LAMB16's moments: kDrop float32 mantissa bits are dropped
// in the normal range; kMinNormalBits is 2^Emin's float32 bit pattern; the
// moment's 16 random bits sit at kHashShift in the element's hash.
// kMantissa / kBias: the format's mantissa bits and exponent bias (for its codes).
struct E4M3 {  // m
  static constexpr int kMantissa = 3, kBias = 7;
  static constexpr int kDrop = 23 - kMantissa;
  static constexpr uint32_t kMinNormalBits = 0x3c800000u;  // 2^-6
  static constexpr int kHashShift = 16;
};
struct E5M2 {  // v
  static constexpr int kMantissa = 2, kBias = 15;
  static constexpr int kDrop = 23 - kMantissa;
  static constexpr uint32_t kMinNormalBits = 0x38800000u;  // 2^-14
  static constexpr int kHashShift = 0;
};

// The grids of the params' 16-bit storage types: bfloat16 and float16 params without
// float32 master copies are written rounded stochastically onto them (the low 16 bits of
// a hash of their own, param_hash, dither them).
struct BF16 {
  static constexpr int kMantissa = 7;
  static constexpr int kDrop = 23 - kMantissa;
  static constexpr uint32_t kMinNormalBits = 0x00800000u;  // 2^-126, float32's own
  static constexpr int kHashShift = 0;
};
struct F16 {
  static constexpr int kMantissa = 10;
  static constexpr int kDrop = 23 - kMantissa;
  static constexpr uint32_t kMinNormalBits = 0x38800000u;  // 2^-14
  static constexpr int kHashShift = 0;
};

template <typename U>
INDUCTOR_LAMB_HD U mix(U x) {
  x = x ^ (x >> 16);
  x = x * kMix1;
  x = x ^ (x >> 15);
  x = x * kMix2;
  return x ^ (x >> 16);
}

// The per-tensor part of the hash: seed (any int64) and step (a float32 count
// below 2^24, as the steps lists hold).
INDUCTOR_LAMB_HD uint32_t tensor_key(int64_t seed, float step) {
  const uint64_t s = static_cast<uint64_t>(seed);
  return mix<uint32_t>(mix<uint32_t>(static_cast<uint32_t>(static_cast<int64_t>(step)) ^
                                     mix<uint32_t>(static_cast<uint32_t>(s >> 32))) ^
                       static_cast<uint32_t>(s));
}

// An element's 32 random bits: grad_bits the bits of g * (1.f / grad_scale) in
// float32, m_code / v_code its stored bytes before the step. The gradient enters
// truncated to bfloat16 (7 mantissa bits): two computations of one gradient that
// differ in the last float32 bits (an eager and a compiled backward) give
// different random bits for about 2^-16 of the elements per ulp, not for all of
// them. The codes keep elements with equal gradients (e.g. rows of zeros)
// from sharing bits unless their whole state is equal too.
constexpr uint32_t kGradMask = 0xffff0000u;

template <typename U>
INDUCTOR_LAMB_HD U element_hash(uint32_t key, const U& grad_bits, const U& m_code, const U& v_code) {
  return mix<U>((grad_bits & U(kGradMask)) ^ ((m_code | (v_code << 8)) * kCodeMul) ^ U(key));
}

// A param's random bits (the low 16 dither it): param_hash(param_base(key, x_bits), p_bits),
// x a float32 value of the element that changes every step (LAMB its new m; LARS and Adagrad
// its grad), truncated to bfloat16 as the gradient above, and p_bits the float32 bits of the
// param as stored before the step (exact, from bfloat16 or float16: its low 13 bits are zero,
// so shifted down they fill the bits x leaves). Half of mix (one multiply): its low 16 bits
// fold in all 32 input bits, and a param's rounding runs on every element of every step
// (bench_step.py --rounding).
template <typename U>
INDUCTOR_LAMB_HD U param_base(uint32_t key, const U& x_bits) {
  return (x_bits & U(kGradMask)) ^ U(key);
}

template <typename U>
INDUCTOR_LAMB_HD U param_hash(const U& base, const U& p_bits) {
  U h = base ^ (p_bits >> 13);
  h = h ^ (h >> 16);
  h = h * kMix1;
  return h ^ (h >> 15);
}

// LAMB16's params take their bits from its moments' element_hash (which holds the key, the
// gradient and the codes), in two operations of its instruction-bound loop: the xor of its
// halves, m's dither and v's, is uniform and independent of each of them (of two independent
// uniform values, their xor is independent of either), so the param rounds independently of
// each moment.
template <typename U>
INDUCTOR_LAMB_HD U param_hash_of_element(const U& element_hash) {
  return element_hash ^ (element_hash >> 16);
}

// The grid's 16 random bits of the hash as a dither below the kDrop dropped bits: for
// float8 (20, 21 dropped) centred (half a step added) so that 16 bits give an unbiased
// rounding to 2^-17; for bfloat16 (16 dropped) and float16 (13) the top kDrop of them,
// exactly uniform.
template <typename Grid, typename U>
INDUCTOR_LAMB_HD U dither(const U& hash) {
  if constexpr (Grid::kDrop > 16)
    return (((hash >> Grid::kHashShift) & U(0xffffu)) << (Grid::kDrop - 16)) + U(1u << (Grid::kDrop - 17));
  else
    return ((hash >> Grid::kHashShift) & U(0xffffu)) >> (16 - Grid::kDrop);
}

// x (finite values within the float8 format's range; anything else passes)
// rounded stochastically onto Grid with `dither` (from dither<Grid>). Lanes:
// F float values, U their uint32 bits; as_bits / as_float reinterpret, and
// select(mask, a, b) takes a where mask is all ones (masks from less_than, an
// unsigned compare of values below 2^31); min is the unsigned minimum.
template <typename Grid, typename L>
INDUCTOR_LAMB_HD typename L::F stochastic_round(const typename L::F& x, const typename L::U& dither) {
  using U = typename L::U;
  using F = typename L::F;
  const U bits = L::as_bits(x);
  const U mag = bits & U(0x7fffffffu);
  const U subnormal = L::less_than(mag, U(Grid::kMinNormalBits));
  const F offset = L::as_float(subnormal & U(Grid::kMinNormalBits));  // 2^Emin or +0
  const U kept = (L::as_bits(L::as_float(mag) + offset) + dither) & U(~((1u << Grid::kDrop) - 1u));
  const U rounded = L::as_bits(L::as_float(kept) - offset) | (bits & U(0x80000000u));
  return L::as_float(L::select(L::less_than(mag, U(0x7f800000u)), rounded, bits));
}

// A bfloat16 or float16 param's new value x (float32) rounded stochastically onto its
// storage grid (Grid BF16 or F16) with the param's bits `hash`, which the store's round to
// nearest then keeps.
template <typename Grid, typename L>
INDUCTOR_LAMB_HD typename L::F round_param(const typename L::F& x, const typename L::U& hash) {
  using U = typename L::U;
  const U d = dither<Grid>(hash);
  if constexpr (Grid::kMinNormalBits == 0x00800000u) {
    // float32's exponent range (bfloat16): the bits themselves, subnormals and both signs
    // included, are in magnitude order, so no offset is needed, and infinities and the
    // NaNs arithmetic makes (quiet: bit 22 set) stay what they are: two operations where
    // stochastic_round takes a dozen, on every param element of every step.
    return L::as_float((L::as_bits(x) + d) & U(~((1u << Grid::kDrop) - 1u)));
  } else {
    return stochastic_round<Grid, L>(x, d);
  }
}

// The same rounding of x (within the format's finite range, as the moments' clamps
// leave them, or NaN), returned as the float8 code of the rounded value: the byte
// c10's encoder gives for it, in the low 8 bits of each lane. The rounded float32
// bits already hold the code (exponent re-biased, top mantissa bits; in the
// subnormal range less the implicit bit of 2^Emin), so no encoder has to run: the
// CPU kernels store these (tests/test_shared_math.py checks them against
// stochastic_round + c10's encoder on the whole grid).
//
// The re-biasing (and the implicit bit) is taken off before the shift, where it folds into the
// dither's constant, and the subnormal offset is added where the lanes' mask says (add_where,
// sub_where: one masked instruction each with AVX512's mask registers).
template <typename Grid, typename L>
INDUCTOR_LAMB_HD typename L::U stochastic_code(const typename L::F& x, const typename L::U& dither) {
  using U = typename L::U;
  constexpr uint32_t kRebias = uint32_t(127 - Grid::kBias) << 23;  // float32's exponent bias to the grid's
  const U bits = L::as_bits(x);
  const U mag = bits & U(0x7fffffffu);
  const auto subnormal = L::below(mag, U(Grid::kMinNormalBits));
  // (|x| + 2^Emin below it) + dither is at least 2^Emin's bits, so the subtractions never wrap
  const U kept = L::as_bits(L::add_where(subnormal, L::as_float(mag), L::as_float(U(Grid::kMinNormalBits)))) +
                 (dither - U(kRebias));
  const U code = L::sub_where(subnormal, kept, U(1u << 23)) >> Grid::kDrop;
  // Finite codes are at most 0x7E; NaN's bits give more than 0x7F here (0x438 /
  // 0x23C and up), so an unsigned min gives its code without a compare and select.
  return L::min(code, U(0x7fu)) | ((bits >> 24) & U(0x80u));
}

// Scalar lanes: the CUDA kernels, the host and the generic CPU build.
struct ScalarLanes {
  using F = float;
  using U = uint32_t;
  // memcpy is the defined way to reinterpret bits; compilers (nvcc too) make it a register move.
  template <typename To, typename From>
  static INDUCTOR_LAMB_HD To bit_cast(const From& x) {
    To y;
    __builtin_memcpy(&y, &x, sizeof y);
    return y;
  }
  static INDUCTOR_LAMB_HD U as_bits(float x) { return bit_cast<U>(x); }
  static INDUCTOR_LAMB_HD float as_float(U u) { return bit_cast<float>(u); }
  static INDUCTOR_LAMB_HD U less_than(U a, U b) { return a < b ? 0xffffffffu : 0u; }
  static INDUCTOR_LAMB_HD U select(U mask, U a, U b) { return (mask & a) | (~mask & b); }
  // a < b as a condition, and a + b / a - b where it holds (stochastic_code)
  static INDUCTOR_LAMB_HD bool below(U a, U b) { return a < b; }
  static INDUCTOR_LAMB_HD float add_where(bool c, float a, float b) { return c ? a + b : a; }
  static INDUCTOR_LAMB_HD U sub_where(bool c, U a, U b) { return c ? a - b : a; }
  static INDUCTOR_LAMB_HD U min(U a, U b) { return a < b ? a : b; }
};

}  // namespace inductor_lamb::rounding
