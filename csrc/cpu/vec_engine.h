#pragma once
// The multi-tensor engine, kernel side: included only by *_kernel.cpp files, which
// setup.py compiles once per ISA with CPU_CAPABILITY set (DEFAULT / AVX2 / AVX512).
//
// Work arrives as a list of equal-sized chunks cut across all tensors of a list
// (engine.cpp), so one huge tensor and a thousand tiny ones both spread over all
// threads. Reductions write one partial per chunk; the glue combines them per
// tensor in chunk order, so results do not depend on the number of threads.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>

#include "common/rounding.h"
#include "cpu/types.h"
#if defined(CPU_CAPABILITY_AVX2)
#include "cpu/fp8_avx2.h"
#endif

// The loads, stores and rounding an element loop is made of are inlined into it: left to its
// size heuristics, GCC kept some as calls in LAMB16's loops, their vectors passing through
// memory (its one-call step took 1.4x its two phases' time).
#define INDUCTOR_LAMB_LOOP_INLINE inline __attribute__((always_inline))
#define INDUCTOR_LAMB_LOOP_BODY __attribute__((always_inline))

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {

using fVec = at::vec::Vectorized<float>;

// Elements handled per loop step: two float vectors, i.e. one 16-bit vector.
constexpr int64_t kWidth = 2 * fVec::size();

// Loads / stores kWidth (or, at a tail, n < kWidth) elements as two float vectors.
// Lanes past n load as zero, which adds nothing to any sum of squares.
template <typename T>
struct VecIO {  // bfloat16 / half
  using bVec = at::vec::Vectorized<T>;
  static_assert(bVec::size() == kWidth, "16-bit vector must hold two float vectors");
  static INDUCTOR_LAMB_LOOP_INLINE void load(const T* p, int64_t n, fVec& a, fVec& b) {
    bVec v = n == kWidth ? bVec::loadu(p) : bVec::loadu(p, n);
    std::tie(a, b) = at::vec::convert_to_float<T>(v);
  }
  static INDUCTOR_LAMB_LOOP_INLINE void store(T* p, int64_t n, const fVec& a, const fVec& b) {
    bVec v = at::vec::convert_from_float<T>(a, b);
    if (n == kWidth) v.store(p); else v.store(p, n);
  }
};

template <>
struct VecIO<float> {
  static constexpr int64_t W = fVec::size();
  static INDUCTOR_LAMB_LOOP_INLINE void load(const float* p, int64_t n, fVec& a, fVec& b) {
    if (n == kWidth) {
      a = fVec::loadu(p);
      b = fVec::loadu(p + W);
    } else {
      a = fVec::loadu(p, std::min<int64_t>(n, W));
      b = n > W ? fVec::loadu(p + W, n - W) : fVec(0.f);
    }
  }
  static INDUCTOR_LAMB_LOOP_INLINE void store(float* p, int64_t n, const fVec& a, const fVec& b) {
    if (n == kWidth) {
      a.store(p);
      b.store(p + W);
    } else {
      a.store(p, std::min<int64_t>(n, W));
      if (n > W) b.store(p + W, n - W);
    }
  }
};

// float8 (LAMB16's moments), one byte per element. The AVX2 and AVX512 builds
// convert kWidth elements at a time with vector code; the generic build one at a
// time with c10's scalar functions. All of them give the same bits (round to nearest
// even, e4m3 saturating: from_float): tests/test_fp8_avx2.py checks the AVX2 codec on every float32,
// tests/test_lamb16_op.py every ISA through the op.
template <typename T>
struct Fp8Codec {
  static constexpr bool kE4M3 = std::is_same_v<T, c10::Float8_e4m3fn>;
  static_assert(kE4M3 || std::is_same_v<T, c10::Float8_e5m2>);
  // A code's value is its "unit" decoding (load2_unit) times kUnitScale: for e4m3, the value of
  // the float16 the vector builds convert through, which skips a multiply a vector where the
  // caller folds the power of two into a factor it multiplies by anyway (exactly: x * 2^-8 is
  // exact for every e4m3 value, and (x 2^-8) (c 2^8) is x c rounded once, while c 2^8 is finite:
  // LAMB16's c, beta1 times a scale of at most FLT_MAX / 448, is).
  static constexpr float kUnitScale = kE4M3 ? 256.f : 1.f;

  // One element (the generic build, and the tails): decoded through a table of all
  // 256 codes (built once from c10's decoder, so the same bits), a load instead of
  // c10's per-element branches; encoded by c10.
  template <bool Unit = false>
  static float to_float(uint8_t x) { return Unit ? table.unit[x] : table.value[x]; }
  // e4m3 saturates: a finite value past 448 or an infinity is +-448, NaN stays NaN. c10's
  // encoders do so from torch 2.13 on; torch 2.11 and 2.12 gave NaN, so the value is clamped
  // first (comparisons pass NaN through), and every release gives the same codes.
  static constexpr float kE4M3Max = 448.f;
  static uint8_t from_float(float x) {
    if constexpr (kE4M3) {
      x = x > kE4M3Max ? kE4M3Max : (x < -kE4M3Max ? -kE4M3Max : x);
      return c10::detail::fp8e4m3fn_from_fp32_value(x);
    }
    return c10::detail::fp8e5m2_from_fp32_value(x);
  }
#if defined(CPU_CAPABILITY_AVX512)
  template <bool Unit>
  static void to_float(const __m128i& x, __m512& o) {
    if constexpr (kE4M3) {
      // Exact and branch-free (at::vec's decoder special-cases subnormals with masks
      // and branches): S EEEE MMM placed as float16 S 0EEEE MMM0000000 is the same
      // value times 2^-8, subnormals included; 0x7F / 0xFF (NaN) are patched back.
      // Sign-extended to 16 bits and shifted left by 7, the code has S in bits 15 and 14
      // and EEEEMMM below: one mask clears bit 14 (three operations deep, where
      // separating the sign from the magnitude took five).
      const __m256i h = _mm256_cvtepi8_epi16(x);
      __m512 f = _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(int16_t(0xBF80))));
      if constexpr (!Unit) f = _mm512_mul_ps(f, _mm512_set1_ps(kUnitScale));
      // (NaN: the low 7 bits all ones, in h's 0x007F or 0xFFFF)
      const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_or_si256(h, _mm256_set1_epi16(int16_t(0xFF80))),
                                                    _mm256_set1_epi16(-1));
      o = _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    } else {
      at::vec::cvtfp8e5m2_fp32(x, o);
    }
  }
  static __m128i from_float(const __m512& x) {
    if constexpr (kE4M3) {  // (the clamp of the scalar form: maxps and minps return a NaN x, their second operand)
      const __m512 hi = _mm512_set1_ps(kE4M3Max);
      return at::vec::cvtfp32_fp8e4m3(_mm512_min_ps(hi, _mm512_max_ps(_mm512_set1_ps(-kE4M3Max), x)));
    }
    return at::vec::cvtfp32_fp8e5m2(x);
  }
#elif defined(CPU_CAPABILITY_AVX2)
  using Grid = std::conditional_t<kE4M3, fp8_avx2::E4M3, fp8_avx2::E5M2>;
  template <bool Unit>
  static void to_float(const __m128i& x, __m256& a, __m256& b) { fp8_avx2::decode16<Grid, Unit>(x, a, b); }
  static __m128i from_float(const __m256& a, const __m256& b) { return fp8_avx2::encode16<Grid>(a, b); }
#endif

 private:
  struct Table {
    float value[256], unit[256];
    Table() {
      for (int c = 0; c < 256; ++c) {
        value[c] = kE4M3 ? c10::detail::fp8e4m3fn_to_fp32_value(uint8_t(c))
                         : c10::detail::fp8e5m2_to_fp32_value(uint8_t(c));
        unit[c] = kE4M3 ? value[c] / kUnitScale : value[c];  // (e5m2's unit is its value, NaNs as c10's)
      }
    }
  };
  static inline const Table table;
};

template <typename T>
struct Fp8IO {
  using Codec = Fp8Codec<T>;
  static constexpr int64_t W = fVec::size();
  // Unit: the codes' unit decoding (Fp8Codec::kUnitScale).
  template <bool Unit = false>
  static INDUCTOR_LAMB_LOOP_INLINE void load(const T* p, int64_t n, fVec& a, fVec& b) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    uint8_t tail[kWidth];
    if (n < kWidth) {  // lanes past n decode from zero bytes
      std::memset(tail, 0, sizeof(tail));
      std::memcpy(tail, src, n);
      src = tail;
    }
#endif
#if defined(CPU_CAPABILITY_AVX512)
    static_assert(kWidth == 32, "two 16-lane float vectors");
    __m512 fa, fb;
    Codec::template to_float<Unit>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)), fa);
    Codec::template to_float<Unit>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16)), fb);
    a = fa;
    b = fb;
#elif defined(CPU_CAPABILITY_AVX2)
    static_assert(kWidth == 16, "two 8-lane float vectors");
    __m256 fa, fb;
    Codec::template to_float<Unit>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)), fa, fb);
    a = fa;
    b = fb;
#else
    float buf[kWidth];
    for (int64_t k = 0; k < kWidth; ++k) buf[k] = k < n ? Codec::template to_float<Unit>(src[k]) : 0.f;
    a = fVec::loadu(buf);
    b = fVec::loadu(buf + W);
#endif
  }
  static INDUCTOR_LAMB_LOOP_INLINE void store(T* p, int64_t n, const fVec& a, const fVec& b) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(p);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    // kWidth codes: two 16-byte vectors (AVX512) or one (AVX2)
#if defined(CPU_CAPABILITY_AVX512)
    const __m128i codes[2] = {Codec::from_float(a), Codec::from_float(b)};
#else
    const __m128i codes[1] = {Codec::from_float(a, b)};
#endif
    static_assert(sizeof(codes) == kWidth, "one code per element");
    if (n == kWidth) std::memcpy(dst, codes, kWidth);  // a constant size: vector stores
    else std::memcpy(dst, codes, n);
#else
    float buf[kWidth];
    a.store(buf);
    b.store(buf + W);
    for (int64_t k = 0; k < n; ++k) dst[k] = Codec::from_float(buf[k]);
#endif
  }
};
template <>
struct VecIO<c10::Float8_e4m3fn> : Fp8IO<c10::Float8_e4m3fn> {};
template <>
struct VecIO<c10::Float8_e5m2> : Fp8IO<c10::Float8_e5m2> {};

// A pair of float vectors: the unit all kernels compute on.
struct F2 {
  fVec a, b;
};

template <typename T>
INDUCTOR_LAMB_LOOP_INLINE F2 load2(const T* p, int64_t n) {
  F2 r;
  VecIO<T>::load(p, n, r.a, r.b);
  return r;
}

// float8 codes in their unit decoding (Fp8Codec::kUnitScale).
template <typename T>
INDUCTOR_LAMB_LOOP_INLINE F2 load2_unit(const T* p, int64_t n) {
  F2 r;
  Fp8IO<T>::template load<true>(p, n, r.a, r.b);
  return r;
}

template <typename T>
INDUCTOR_LAMB_LOOP_INLINE void store2(T* p, int64_t n, const F2& x) {
  VecIO<T>::store(p, n, x.a, x.b);
}

// Where a tensor's updates lie in a one-call step's stash (UpdateStash, types.h), or null: no
// stash, or a tensor that recomputes (stash_for, engine.h).
inline float* stash_of(const UpdateStash& s, int64_t tensor) {
  return s.data && s.offset[tensor] >= 0 ? s.data + s.offset[tensor] : nullptr;
}

// Stores the updates u of elements [i, i + n) at `at` (stash_of): plain stores, or non-temporal
// ones for a block larger than the last-level cache, where the lines would be evicted unread
// anyway and a plain store would first read each line from memory (the stash's bytes are then
// those that recomputing u would read). Stash offsets and chunk starts keep full loop steps
// 64-byte aligned, as the streaming stores need; stream_fence() orders them before pass 2.
INDUCTOR_LAMB_LOOP_INLINE void stash_store(float* at, bool stream, int64_t i, int64_t n, const F2& u) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if (stream && n == kWidth) {
#if defined(CPU_CAPABILITY_AVX512)
    _mm512_stream_ps(at + i, u.a);
    _mm512_stream_ps(at + i + fVec::size(), u.b);
#else
    _mm256_stream_ps(at + i, u.a);
    _mm256_stream_ps(at + i + fVec::size(), u.b);
#endif
    return;
  }
#endif
  store2(at + i, n, u);
}
inline void stream_fence(bool stream) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if (stream) _mm_sfence();
#endif
}

// A parameter as float32: from its float32 master copy when there is one.
template <typename T>
INDUCTOR_LAMB_LOOP_INLINE F2 load_param(const T* param, const float* master, int64_t i, int64_t n) {
  return master ? load2(master + i, n) : load2(param + i, n);
}

// Writes an updated parameter: the master copy (if any) and the param, rounded to T.
template <typename T>
INDUCTOR_LAMB_LOOP_INLINE void store_param(T* param, float* master, int64_t i, int64_t n, const F2& p) {
  if (master) store2(master + i, n, p);
  store2(param + i, n, p);
}

// The storage grid of a param type that stochastic rounding rounds onto (void: none, float32).
template <typename T>
struct ParamGrid {
  using Grid = void;
};
template <>
struct ParamGrid<c10::BFloat16> {
  using Grid = rounding::BF16;
};
template <>
struct ParamGrid<c10::Half> {
  using Grid = rounding::F16;
};

// The per-element base of a param's hash (common/rounding.h param_base), one per lane.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
struct U32Vec;
using HashVec = U32Vec;
#else
struct HashVec {
  uint32_t v[fVec::size()];
};
#endif
HashVec param_hash(uint32_t key, const fVec& x, const fVec& p0);
HashVec param_hash_of_element(const HashVec& element_hash);
template <typename Grid>
fVec round_param(const fVec& x, const HashVec& hash);
// p rounded stochastically onto T's grid with the param bits of its two halves, stored.
template <typename T>
void store_rounded(T* param, int64_t n, const F2& p, const HashVec& hash_a, const HashVec& hash_b);

// Writes an updated param as store_param above; a bf16 / fp16 param without a master copy
// that rounds stochastically (TensorPtrs::round_param) is first rounded onto its grid with
// hash(half), the param bits of half 0 or 1 of the loop step (common/rounding.h).
template <typename T, typename Hash>
INDUCTOR_LAMB_LOOP_INLINE void store_param(const TensorPtrs& t, T* param, int64_t i, int64_t n, const F2& p, const Hash& hash) {
  if constexpr (!std::is_same_v<typename ParamGrid<T>::Grid, void>) {
    if (t.round_param) return store_rounded(param + i, n, p, hash(0), hash(1));  // (no master copy)
  }
  store_param(param, t.master, i, n, p);
}
// ... with the bits hashing (the tensor's key, hash_in: the op's per-element input, p0: the
// param as loaded before the step).
template <typename T>
INDUCTOR_LAMB_LOOP_INLINE void store_param(const TensorPtrs& t, T* param, int64_t i, int64_t n, const F2& p, const F2& p0,
                        const F2& hash_in) {
  // (a generic lambda: HashVec is complete only where the loops instantiate it)
  store_param(t, param, i, n, p, [&](auto half) {
    return half ? param_hash(t.param_key, hash_in.b, p0.b) : param_hash(t.param_key, hash_in.a, p0.a);
  });
}

// How far ahead of a loop each of its streams is prefetched, in bytes of that stream (its
// codes' bytes too: the same lead in pages whatever the element's size). A loop step's math keeps
// its loads' cache misses from overlapping enough on its own: one core streams from DRAM only as
// fast as it has misses in flight, and the hardware prefetchers stop at each 4 KB page; a lead of
// a page starts the next page's walk and misses a page early (docs/decisions.md, "Every CPU
// element loop prefetches a page ahead"). LAMB's loops take half of it (kLambPrefetchBytes).
constexpr int64_t kPrefetchBytes = 4096;

// Prefetches the bytes a loop step will read AheadBytes after element i of stream p (into
// every cache level; a prefetch never faults, past the end of a tensor included: the address
// goes only to the prefetch; formed as an integer instead, GCC emitted more prefetches and
// NovoGrad's step took 2-3% longer).
template <int64_t AheadBytes, typename T>
inline void prefetch_ahead(const T* p, int64_t i) {
  if (p == nullptr) return;  // (an absent stream: no master copy)
  const char* at = reinterpret_cast<const char*>(p + i) + AheadBytes;
  for (int64_t b = 0; b < int64_t(kWidth * sizeof(T)); b += 64) __builtin_prefetch(at + b, 0, 3);
}

// f(offset, n) over [begin, end) in steps of kWidth; only the last call has n < kWidth. The
// streams `ahead` (the loop's element arrays, any types) are prefetched AheadBytes ahead of
// each step.
template <int64_t AheadBytes = kPrefetchBytes, typename F, typename... S>
inline void vec_range(int64_t begin, int64_t end, const F& f, const S*... ahead) {
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    (prefetch_ahead<AheadBytes>(ahead, i), ...);
    f(i, kWidth);
  }
  if (i < end) f(i, end - i);
}

// body(i, chunks[i]) for i in [b, e). Never inlined: at::parallel_for calls its
// function from two places (the serial path, the threads), and two inlined copies
// of a loop may contract its float expressions into FMAs differently, which
// would make results depend on the thread count. One copy gives the same bits
// at any thread count.
template <typename F>
__attribute__((noinline)) void run_chunks(ChunkSpan chunks, int64_t b, int64_t e, const F& body) {
  if (chunks.backward) {
    for (int64_t i = e - 1; i >= b; --i) body(i, chunks.data[i]);
  } else {
    for (int64_t i = b; i < e; ++i) body(i, chunks.data[i]);
  }
}

// body(chunk_index, chunk) for every chunk, spread over at::parallel_for's threads.
template <typename F>
inline void for_each_chunk(ChunkSpan chunks, const F& body) {
  at::parallel_for(0, chunks.size, 1, [&](int64_t b, int64_t e) { run_chunks(chunks, b, e, body); });
}

// Calls f(T{}) with T the C++ type of `d`.
template <typename F>
inline void dispatch_dtype(Dtype d, const F& f) {
  switch (d) {
    case Dtype::Float: f(float{}); break;
    case Dtype::BFloat16: f(c10::BFloat16{}); break;
    case Dtype::Half: f(c10::Half{}); break;
  }
}

// body(T{}, ci, tensor, chunk) for every chunk (index ci), T the storage type of
// its tensor: the loop of every element-wise pass.
template <typename F>
inline void for_each_typed_chunk(ChunkSpan chunks, const TensorPtrs* tensors, const F& body) {
  for_each_chunk(chunks, [&](int64_t ci, const Chunk& c) {
    const TensorPtrs& t = tensors[c.tensor];
    dispatch_dtype(t.dtype, [&](auto tag) { body(tag, ci, t, c); });
  });
}

// A float32 state list of a tensor.
inline float* state_f32(const TensorPtrs& t, int k) { return static_cast<float*>(t.state[k]); }

// The loop of a one-pass update with one float32 state list (LARS, Adagrad):
// per element p = e.step(g, p, s), s updated in place, with e = make_elem(chunk)
// the optimizer's element math (common/<opt>.h) for the chunk's tensor.
template <typename MakeElem>
inline void one_state_update(ChunkSpan chunks, const TensorPtrs* tensors, const MakeElem& make_elem) {
  for_each_typed_chunk(chunks, tensors, [&](auto tag, int64_t, const TensorPtrs& t, const Chunk& c) {
    using T = decltype(tag);
    const auto e = make_elem(c);
    T* param = static_cast<T*>(t.param);
    float* state = state_f32(t, 0);
    vec_range(
        c.begin, c.end,
        [&](int64_t i, int64_t n) INDUCTOR_LAMB_LOOP_BODY {
          const F2 g = load2(static_cast<const T*>(t.grad) + i, n);
          const F2 p0 = load_param(param, t.master, i, n);
          F2 s = load2(state + i, n);
          const F2 p{e.step(g.a, p0.a, s.a), e.step(g.b, p0.b, s.b)};
          store2(state + i, n, s);
          store_param(t, param, i, n, p, p0, g);  // (a rounded param hashes the grad)
        },
        static_cast<const T*>(t.grad), static_cast<const T*>(param), t.master, state);
  });
}

// 1 / (sqrt(x) + eps) for x >= 0: the denominator of Adam-style updates.
// sqrt and division dominate the element loops once the data sits in cache
// (about 20 cycles per AVX512 vector each on Intel); on AVX512 they are replaced by the
// 14-bit estimates refined by one Newton step each (within 4 ulp of the exact
// value). Lanes where that could go wrong (x = inf, sqrt(x) + eps == 0, i.e. eps == 0, and
// NaN or negative x, which must give the reference's NaN) take the exact value, lane by lane,
// so a lane's result never depends on its neighbours. Finite: the caller knows x finite and eps in
// (0, 1e38), so sqrt(x) + eps lies in (0, 2e38) wherever it is not NaN: the check is then
// skipped, five instructions of a loop bound by its chains of vector work.
#if defined(CPU_CAPABILITY_AVX512)
constexpr bool kUncheckedInvSqrt = true;  // whether inv_sqrt_plus_eps<true> skips anything
#else
constexpr bool kUncheckedInvSqrt = false;
#endif
template <bool Finite = false>
inline fVec inv_sqrt_plus_eps(const fVec& x, const fVec& eps) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 vx = x, veps = eps;
  __m512 y = _mm512_rsqrt14_ps(vx);
  const __m512 half_x = _mm512_mul_ps(vx, _mm512_set1_ps(0.5f));
  y = _mm512_mul_ps(y, _mm512_fnmadd_ps(_mm512_mul_ps(half_x, y), y, _mm512_set1_ps(1.5f)));  // y (1.5 - x y^2 / 2)
  // x y is sqrt(x) except at x = 0 (0 * inf): zeroed there. NaN and negative x keep their
  // NaN, which propagates, as in the reference.
  const __mmask16 nonzero = _mm512_cmp_ps_mask(vx, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  const __m512 d = _mm512_add_ps(_mm512_maskz_mul_ps(nonzero, vx, y), veps);  // sqrt(x) + eps
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.f)));  // r (2 - d r)
  if constexpr (Finite) return fVec(r);
  const __mmask16 ok = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_GT_OQ) &
                       _mm512_cmp_ps_mask(d, _mm512_set1_ps(3.0e38f), _CMP_LT_OQ);
  if (ok == 0xFFFF) return fVec(r);
  const __m512 exact = fVec(1.f) / (x.sqrt() + eps);
  return fVec(_mm512_mask_blend_ps(ok, exact, r));
#else
  return fVec(1.f) / (x.sqrt() + eps);
#endif
}

}  // namespace CPU_CAPABILITY
}  // namespace inductor_lamb::cpu

// The vector type's primitives for the shared element math (common/<opt>.h),
// which the kernels instantiate with V = fVec.
template <>
struct inductor_lamb::ValueOps<inductor_lamb::cpu::CPU_CAPABILITY::fVec> {
  using V = inductor_lamb::cpu::CPU_CAPABILITY::fVec;
  template <bool Finite = false>
  static inline V inv_sqrt_plus_eps(const V& x, const V& eps) {
    return cpu::CPU_CAPABILITY::inv_sqrt_plus_eps<Finite>(x, eps);
  }
  // (x86's DEFAULT build has no FMA instruction: there at::vec::fmadd rounds twice, as a * b + c did)
  static inline V fmadd(const V& a, const V& b, const V& c) { return at::vec::fmadd(a, b, c); }
  // (at::vec::clamp is a maxps and a minps with the bounds first, which pass a NaN x through, its
  // sign too, as the scalar form does; at::vec::minimum and maximum take four instructions each)
  static inline V clamp(const V& x, const V& lo, const V& hi) { return at::vec::clamp(x, lo, hi); }
};

namespace inductor_lamb::cpu {
inline namespace CPU_CAPABILITY {

// ---- LAMB16's stochastic rounding (common/rounding.h) on the vector lanes ----
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The 32-bit integer lane operations of one vector width (P: the intrinsics'
// prefix, SI: the suffix of the whole-register logic ops).
#define INDUCTOR_LAMB_INT_LANES(P, SI)                                                   \
  inline IReg i_set1(uint32_t c) { return P##_set1_epi32(static_cast<int>(c)); }       \
  inline IReg i_xor(IReg a, IReg b) { return P##_xor_##SI(a, b); }                     \
  inline IReg i_and(IReg a, IReg b) { return P##_and_##SI(a, b); }                     \
  inline IReg i_or(IReg a, IReg b) { return P##_or_##SI(a, b); }                       \
  inline IReg i_add(IReg a, IReg b) { return P##_add_epi32(a, b); }                    \
  inline IReg i_sub(IReg a, IReg b) { return P##_sub_epi32(a, b); }                    \
  inline IReg i_mul(IReg a, IReg b) { return P##_mullo_epi32(a, b); }                  \
  inline IReg i_srl(IReg a, int k) { return P##_srli_epi32(a, k); }                    \
  inline IReg i_sll(IReg a, int k) { return P##_slli_epi32(a, k); }
#if defined(CPU_CAPABILITY_AVX512)
using IReg = __m512i;
INDUCTOR_LAMB_INT_LANES(_mm512, si512)
#else
using IReg = __m256i;
INDUCTOR_LAMB_INT_LANES(_mm256, si256)
#endif
#undef INDUCTOR_LAMB_INT_LANES
// uint32 lanes with the operators the shared rounding math uses.
struct U32Vec {
  IReg v;
  U32Vec(IReg x) : v(x) {}
  explicit U32Vec(uint32_t c) : v(i_set1(c)) {}
  friend U32Vec operator^(U32Vec a, U32Vec b) { return i_xor(a.v, b.v); }
  friend U32Vec operator&(U32Vec a, U32Vec b) { return i_and(a.v, b.v); }
  friend U32Vec operator|(U32Vec a, U32Vec b) { return i_or(a.v, b.v); }
  friend U32Vec operator+(U32Vec a, U32Vec b) { return i_add(a.v, b.v); }
  friend U32Vec operator-(U32Vec a, U32Vec b) { return i_sub(a.v, b.v); }
  friend U32Vec operator*(U32Vec a, uint32_t c) { return i_mul(a.v, i_set1(c)); }
  friend U32Vec operator>>(U32Vec a, int k) { return i_srl(a.v, k); }
  friend U32Vec operator<<(U32Vec a, int k) { return i_sll(a.v, k); }
};
struct VecLanes {
  using F = fVec;
  using U = U32Vec;
#if defined(CPU_CAPABILITY_AVX512)
  static U as_bits(const F& x) { return _mm512_castps_si512(x); }
  static F as_float(const U& u) { return _mm512_castsi512_ps(u.v); }
  static U less_than(const U& a, const U& b) {  // signed compare: both below 2^31
    return _mm512_maskz_set1_epi32(_mm512_cmplt_epi32_mask(a.v, b.v), -1);
  }
  static U select(const U& mask, const U& a, const U& b) { return _mm512_ternarylogic_epi32(mask.v, a.v, b.v, 0xCA); }
  static U min(const U& a, const U& b) { return _mm512_min_epu32(a.v, b.v); }
  // conditions as mask registers: the masked add and subtract take them directly
  static __mmask16 below(const U& a, const U& b) { return _mm512_cmplt_epu32_mask(a.v, b.v); }
  static F add_where(__mmask16 c, const F& a, const F& b) { return _mm512_mask_add_ps(a, c, a, b); }
  static U sub_where(__mmask16 c, const U& a, const U& b) { return _mm512_mask_sub_epi32(a.v, c, a.v, b.v); }
  // the stored bytes of kWidth / 2 elements, widened to uint32 lanes; and back
  static U widen(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void narrow(const U& a, const U& b, uint8_t* out) {  // lanes < 256
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(a.v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtepi32_epi8(b.v));
  }
#else
  static U as_bits(const F& x) { return _mm256_castps_si256(x); }
  static F as_float(const U& u) { return _mm256_castsi256_ps(u.v); }
  static U less_than(const U& a, const U& b) { return _mm256_cmpgt_epi32(b.v, a.v); }  // both below 2^31
  static U select(const U& mask, const U& a, const U& b) { return _mm256_blendv_epi8(b.v, a.v, mask.v); }
  static U min(const U& a, const U& b) { return _mm256_min_epu32(a.v, b.v); }
  static U below(const U& a, const U& b) { return less_than(a, b); }
  static F add_where(const U& c, const F& a, const F& b) { return a + as_float(c & as_bits(b)); }
  static U sub_where(const U& c, const U& a, const U& b) { return a - (c & b); }
  static U widen(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static void narrow(const U& a, const U& b, uint8_t* out) {  // lanes < 256
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(a.v, b.v), 0xD8);  // 16 x uint16, in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
  }
#endif
};
#endif

// LAMB16's stochastic rounding, one float vector at a time: the float8 codes of
// m and v (clamped, scaled by the new scales) rounded onto their grids, with one
// hash per element of (key, the grads g divided by grad_scale, the bytes m8 / v8
// held before the step). The codes come from the rounded bits
// (rounding::stochastic_code), so no float8 encoder runs.
//
// The bytes of one loop step as they were before it writes: a tail (n < kWidth)
// reads zero-padded copies.
struct OldCodes {
  const uint8_t *m, *v;
  uint8_t pad[2][kWidth];
  OldCodes(const uint8_t* m8, const uint8_t* v8, int64_t n) : m(m8), v(v8) {
    if (n == kWidth) return;
    std::memset(pad, 0, sizeof(pad));
    std::memcpy(pad[0], m8, n);
    std::memcpy(pad[1], v8, n);
    m = pad[0], v = pad[1];
  }
  OldCodes(const OldCodes&) = delete;  // m, v may point into pad
};

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
struct MomentCodes {  // one float vector's codes, one per uint32 lane, and their element hashes
  U32Vec m{0u}, v{0u}, hash{0u};
};
// old_m / old_v: the vector's fVec::size() old bytes.
INDUCTOR_LAMB_LOOP_INLINE MomentCodes stochastic_codes(uint32_t key, const fVec& g, const fVec& m, const fVec& v, const uint8_t* old_m,
                                    const uint8_t* old_v) {
  using namespace rounding;
  const U32Vec h = element_hash(key, VecLanes::as_bits(g), VecLanes::widen(old_m), VecLanes::widen(old_v));
  return {stochastic_code<E4M3, VecLanes>(m, dither<E4M3>(h)), stochastic_code<E5M2, VecLanes>(v, dither<E5M2>(h)),
          h};
}
// Stores the n <= kWidth codes of a loop step's two vectors (every old byte was read).
INDUCTOR_LAMB_LOOP_INLINE void store_codes(const MomentCodes& a, const MomentCodes& b, uint8_t* m8, uint8_t* v8, int64_t n) {
  uint8_t out[2][kWidth];
  const bool full = n == kWidth;
  VecLanes::narrow(a.m, b.m, full ? m8 : out[0]);
  VecLanes::narrow(a.v, b.v, full ? v8 : out[1]);
  if (full) return;
  std::memcpy(m8, out[0], n);
  std::memcpy(v8, out[1], n);
}
#else
struct MomentCodes {
  uint8_t m[fVec::size()], v[fVec::size()];
  HashVec hash;  // the element hashes
};
INDUCTOR_LAMB_LOOP_INLINE MomentCodes stochastic_codes(uint32_t key, const fVec& g, const fVec& m, const fVec& v, const uint8_t* old_m,
                                    const uint8_t* old_v) {
  using namespace rounding;
  float gs[fVec::size()], ms[fVec::size()], vs[fVec::size()];
  g.store(gs), m.store(ms), v.store(vs);
  MomentCodes c;
  for (int64_t k = 0; k < fVec::size(); ++k) {
    const uint32_t h = element_hash(key, ScalarLanes::as_bits(gs[k]), uint32_t(old_m[k]), uint32_t(old_v[k]));
    c.m[k] = uint8_t(stochastic_code<E4M3, ScalarLanes>(ms[k], dither<E4M3>(h)));
    c.v[k] = uint8_t(stochastic_code<E5M2, ScalarLanes>(vs[k], dither<E5M2>(h)));
    c.hash.v[k] = h;
  }
  return c;
}
INDUCTOR_LAMB_LOOP_INLINE void store_codes(const MomentCodes& a, const MomentCodes& b, uint8_t* m8, uint8_t* v8, int64_t n) {
  constexpr int64_t W = fVec::size();
  std::memcpy(m8, a.m, std::min(n, W));
  std::memcpy(v8, a.v, std::min(n, W));
  if (n > W) std::memcpy(m8 + W, b.m, n - W), std::memcpy(v8 + W, b.v, n - W);
}
#endif

// A bf16 / fp16 param's new value rounded stochastically onto Grid (store_param).
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
inline HashVec param_hash(uint32_t key, const fVec& x, const fVec& p0) {
  return rounding::param_hash(rounding::param_base(key, VecLanes::as_bits(x)), VecLanes::as_bits(p0));
}
inline HashVec param_hash_of_element(const HashVec& element_hash) {
  return rounding::param_hash_of_element(element_hash);
}
template <typename Grid>
inline fVec round_param(const fVec& x, const HashVec& hash) {
  return rounding::round_param<Grid, VecLanes>(x, hash);
}
// bfloat16: the rounding's add and the conversion's shift in one, (bits + dither) >> 16, the
// bits at::vec's round to nearest would give the rounded value (0xffff where it is NaN), in
// 6 operations a vector (dither, add, shift, NaN test, blend) where rounding, then converting
// takes 10.
template <>
inline void store_rounded(c10::BFloat16* param, int64_t n, const F2& p, const HashVec& hash_a,
                          const HashVec& hash_b) {
  const auto half = [](const fVec& x, const HashVec& hash) {
    const U32Vec t = (VecLanes::as_bits(x) + rounding::dither<rounding::BF16>(hash)) >> 16;
    const U32Vec nan_bits(0xffffu);
#if defined(CPU_CAPABILITY_AVX512)
    return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask((t & U32Vec(0x7fffu)).v, U32Vec(0x7f80u).v), t.v,
                                   nan_bits.v);
#else
    return _mm256_blendv_epi8(t.v, nan_bits.v, _mm256_cmpgt_epi32((t & U32Vec(0x7fffu)).v, U32Vec(0x7f80u).v));
#endif
  };
#if defined(CPU_CAPABILITY_AVX512)
  const at::vec::Vectorized<c10::BFloat16> v(_mm512_permutexvar_epi64(
      _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), _mm512_packus_epi32(half(p.a, hash_a), half(p.b, hash_b))));
#else
  const at::vec::Vectorized<c10::BFloat16> v(
      _mm256_permute4x64_epi64(_mm256_packus_epi32(half(p.a, hash_a), half(p.b, hash_b)), 0xd8));
#endif
  if (n == kWidth) v.store(param); else v.store(param, n);
}
#else
inline HashVec param_hash(uint32_t key, const fVec& x, const fVec& p0) {
  using rounding::ScalarLanes;
  float xs[fVec::size()], ps[fVec::size()];
  x.store(xs), p0.store(ps);
  HashVec h;
  for (int64_t k = 0; k < fVec::size(); ++k)
    h.v[k] = rounding::param_hash(rounding::param_base(key, ScalarLanes::as_bits(xs[k])), ScalarLanes::as_bits(ps[k]));
  return h;
}
inline HashVec param_hash_of_element(const HashVec& element_hash) {
  HashVec h;
  for (int64_t k = 0; k < fVec::size(); ++k) h.v[k] = rounding::param_hash_of_element(element_hash.v[k]);
  return h;
}
template <typename Grid>
inline fVec round_param(const fVec& x, const HashVec& hash) {
  float xs[fVec::size()];
  x.store(xs);
  for (int64_t k = 0; k < fVec::size(); ++k)
    xs[k] = rounding::round_param<Grid, rounding::ScalarLanes>(xs[k], hash.v[k]);
  return fVec::loadu(xs);
}
#endif
template <typename T>
inline void store_rounded(T* param, int64_t n, const F2& p, const HashVec& hash_a, const HashVec& hash_b) {
  using G = typename ParamGrid<T>::Grid;
  store2(param, n, F2{round_param<G>(p.a, hash_a), round_param<G>(p.b, hash_b)});
}

// x with the lanes past n zeroed (a tail, n < kWidth: those lanes may hold
// anything, e.g. 0/0 when eps == 0, and must not reach a reduction).
INDUCTOR_LAMB_LOOP_INLINE F2 head(const F2& x, int64_t n) {
  if (n == kWidth) return x;
  float lanes[kWidth];  // (a tail only: through memory, where at::vec's set is a call)
  x.a.store(lanes);
  x.b.store(lanes + fVec::size());
  std::fill(lanes + n, lanes + kWidth, 0.f);
  return {fVec::loadu(lanes), fVec::loadu(lanes + fVec::size())};
}

// Float accumulator of a sum of squares, widened to double once per chunk.
struct SumSq {
  fVec a{0.f}, b{0.f};
  INDUCTOR_LAMB_LOOP_INLINE void add(const F2& x, int64_t n = kWidth) {
    const F2 h = head(x, n);
    a = at::vec::fmadd(h.a, h.a, a);
    b = at::vec::fmadd(h.b, h.b, b);
  }
  inline double value() const {
    float ta[fVec::size()], tb[fVec::size()];
    a.store(ta);
    b.store(tb);
    double s = 0.0;
    for (int64_t k = 0; k < fVec::size(); ++k) s += double(ta[k]) + double(tb[k]);
    return s;
  }
};

// Running max of |x| (NaN propagates), reduced to one double per chunk: amax scales.
struct AbsMax {
#if defined(CPU_CAPABILITY_AVX512)
  // vrangeps takes |x| and the maximum in one instruction, but drops NaN (it returns the other
  // operand): NaN lanes are remembered in a mask instead (at::vec::maximum's NaN-propagating
  // max, with the abs before it, is five instructions a vector; this is three).
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  __mmask16 nan = 0;
  INDUCTOR_LAMB_LOOP_INLINE void add(const F2& x, int64_t n = kWidth) {
    const F2 h = head(x, n);
    constexpr int kMaxAbsNoSign = 0b1011;  // imm8: the larger magnitude, sign bit cleared
    a = _mm512_range_ps(a, h.a, kMaxAbsNoSign);
    b = _mm512_range_ps(b, h.b, kMaxAbsNoSign);
    nan |= _mm512_cmp_ps_mask(h.a, h.b, _CMP_UNORD_Q);
  }
  inline double value() const {
    // (the all-ones NaN at::vec::maximum gave here, and gives on AVX2)
    if (nan) return double(_mm_cvtss_f32(_mm_castsi128_ps(_mm_set1_epi32(-1))));
    return double(_mm512_reduce_max_ps(_mm512_max_ps(a, b)));
  }
#else
  fVec a{0.f}, b{0.f};
  INDUCTOR_LAMB_LOOP_INLINE void add(const F2& x, int64_t n = kWidth) {
    const F2 h = head(x, n);
    a = at::vec::maximum(a, h.a.abs());
    b = at::vec::maximum(b, h.b.abs());
  }
  inline double value() const {
    float ta[fVec::size()], tb[fVec::size()];
    a.store(ta);
    b.store(tb);
    double m = 0.0;
    for (int64_t k = 0; k < fVec::size(); ++k)
      for (float x : {ta[k], tb[k]})
        if (std::isnan(x) || x > m) m = x;
    return m;
  }
#endif
};

}  // namespace CPU_CAPABILITY
}  // namespace inductor_lamb::cpu
