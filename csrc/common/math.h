#pragma once
// What the CPU and the CUDA code share, with no torch or CUDA header: the
// host/device qualifier of the shared math, the storage dtype codes, the chunk
// size, and the few per-value-type primitives the element math needs beyond
// + - *. The per-optimizer headers (lamb.h, lamb16.h, lars.h, adagrad.h) hold
// each optimizer's equations once: the CPU kernels instantiate them for at::vec
// vectors (cpu/vec_engine.h specializes ValueOps), the CUDA kernels for float.
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define INDUCTOR_LAMB_HD __host__ __device__ __forceinline__
#else
// Always inlined into the CPU kernels' loops, so the compiler sees (and contracts
// into FMAs) each expression whole, as if it were written in the loop.
#define INDUCTOR_LAMB_HD inline __attribute__((always_inline))
#endif

namespace inductor_lamb {

// Storage dtype of a param / grad. All math is float32.
enum class Dtype : int32_t { Float = 0, BFloat16 = 1, Half = 2 };

// Elements per chunk: the unit of work of both engines (a CPU task, a CUDA block).
constexpr int64_t kChunkElems = 16384;

// std::min / std::max semantics (the first argument wins unless the second is
// strictly better, so a NaN first argument propagates), on host and device.
INDUCTOR_LAMB_HD double min_of(double a, double b) { return b < a ? b : a; }
INDUCTOR_LAMB_HD float max_of(float a, float b) { return a < b ? b : a; }

// The param's factor before a step's update under decoupled weight decay, p *= 1 - s wd with
// s = lr, or lr^2 / max_lr where max_lr > 0 (timm's corrected_weight_decay, max_lr the peak lr);
// 1 without decoupled decay or weight decay (not 1 - s 0, which is NaN where lr is infinite).
INDUCTOR_LAMB_HD float decay_keep(bool decoupled, double weight_decay, double max_lr, double lr) {
  return decoupled && weight_decay != 0 ? float(1.0 - (max_lr > 0 ? lr * lr / max_lr : lr) * weight_decay) : 1.f;
}

// The primitives of a value type V the element math uses beyond + - *.
// float (CUDA kernels, host code) is exact; cpu/vec_engine.h gives the vector ones.
template <typename V>
struct ValueOps;

template <>
struct ValueOps<float> {
  // 1 / (sqrt(x) + eps): the denominator of Adam-style updates. Finite: the caller knows x
  // finite and eps in (0, 1e38) (the vector forms then skip their check for special lanes).
  template <bool Finite = false>
  static INDUCTOR_LAMB_HD float inv_sqrt_plus_eps(float x, float eps) { return 1.f / (sqrtf(x) + eps); }
  // a * b + c rounded once: pins where an expression's FMA goes, which a compiler otherwise picks
  // from the statements' order (and so may pick differently when the code around it changes).
  static INDUCTOR_LAMB_HD float fmadd(float a, float b, float c) { return fmaf(a, b, c); }
  // clamp saturating a value before a float8 encode: NaN in x propagates; the bounds lo, hi are
  // never NaN (the vector form may rely on it).
  static INDUCTOR_LAMB_HD float clamp(float x, float lo, float hi) { return x != x ? x : x < lo ? lo : x > hi ? hi : x; }
};

// The gradient clip divisor max(1, ||g|| / max_norm) (1 when max_norm <= 0):
// gradients are divided by grad_scale and by it.
INDUCTOR_LAMB_HD double clip_divisor(double grad_norm, double max_norm) {
  return max_norm > 0 && grad_norm > max_norm ? grad_norm / max_norm : 1.0;
}

}  // namespace inductor_lamb
