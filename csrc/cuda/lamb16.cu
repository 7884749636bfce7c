// LAMB16 on CUDA (LAMB with float8 moments), on the shared math of
// common/lamb16.h. reduce: pass 1 reduces ||p||^2, ||u||^2, amax |m|, amax v per
// chunk (reading p, g, m8, v8 and the old scales), then one thread per tensor
// totals them into the reductions and increments the step. apply: one thread
// per tensor computes the trust ratio and the new scales from the reductions,
// folds the old scales into coefficients and only then overwrites them; pass 2
// recomputes m, v, u, writes p and stores m, v in float8 (26 bytes/param),
// rounded stochastically by default.
#include "common/rounding.h"
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

using Elem = lamb16::Elem<float>;
enum { kBeta1Scale = 0, kBeta2Scale = 1, kStepSize = 2, kInvMScale = 3, kInvVScale = 4 };

// float8 codes of the state lists: decode exactly; encode rounding to nearest
// even (the values are saturated first, as on CPU, and by default already on the
// float8 grid: common/rounding.h; __NV_SATFINITE keeps NaN).
__device__ __forceinline__ float m8(const TensorMeta& t, int64_t i) {
  return float(static_cast<const __nv_fp8_e4m3*>(t.state[0])[i]);
}
__device__ __forceinline__ float v8(const TensorMeta& t, int64_t i) {
  return float(static_cast<const __nv_fp8_e5m2*>(t.state[1])[i]);
}
// The stored byte of state list k (hashed by the stochastic rounding).
__device__ __forceinline__ uint32_t code_of(const TensorMeta& t, int k, int64_t i) {
  return static_cast<const uint8_t*>(t.state[k])[i];
}
__device__ __forceinline__ void store_codes(const TensorMeta& t, int64_t i, float m_code, float v_code) {
  static_cast<__nv_fp8_e4m3*>(t.state[0])[i].__x = __nv_cvt_float_to_fp8(m_code, __NV_SATFINITE, __NV_E4M3);
  static_cast<__nv_fp8_e5m2*>(t.state[1])[i].__x = __nv_cvt_float_to_fp8(v_code, __NV_SATFINITE, __NV_E5M2);
}

__global__ void pass1(Launch l, lamb16::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const Elem e(lamb16::consts(h), lamb16::beta_scale(h.beta1, *t.scalar[0]), lamb16::beta_scale(h.beta2, *t.scalar[1]));
  const float mul = grad_multiplier(l, false);
  float p_sq = 0.f, u_sq = 0.f, m_max = 0.f, v_max = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i);
    float m = m8(t, i), v = v8(t, i);
    e.moments(load_grad(t, i, mul), m, v);
    const float u = e.update(p, m, v);
    p_sq += p * p;
    u_sq += u * u;
    m_max = nan_max(m_max, fabsf(m));
    v_max = nan_max(v_max, v);
  }
  write_sums(l, p_sq, u_sq);
  write_partial<MaxOp>(l, 2, m_max);
  write_partial<MaxOp>(l, 3, v_max);
}

__global__ void coeffs(Launch l, lamb16::Hyper h) {
  const int32_t i = live_tensor(l);
  if (i < 0) return;
  const TensorMeta& t = l.tensors[i];
  const float* r = l.reductions + lamb16::kReductions * i;  // ||p||^2, ||u||^2, amax |m|, amax v
  float* k = l.coeffs + i * kCoeffs;
  k[kBeta1Scale] = lamb16::beta_scale(h.beta1, *t.scalar[0]);
  k[kBeta2Scale] = lamb16::beta_scale(h.beta2, *t.scalar[1]);
  k[kStepSize] = lamb16::step_size(h, *l.lr, r[0], r[1]);
  const float m_scale = lamb16::new_scale(r[2], lamb16::kE4M3Max);
  const float v_scale = lamb16::new_scale(r[3], lamb16::kE5M2Max);
  k[kInvMScale] = 1.f / m_scale;
  k[kInvVScale] = 1.f / v_scale;
  *t.scalar[0] = m_scale;  // pass 2 reads the old ones from k
  *t.scalar[1] = v_scale;
}

__global__ void pass2(Launch l, lamb16::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float* k = l.coeffs + c.tensor * kCoeffs;
  const Elem e(lamb16::consts(h), k[kBeta1Scale], k[kBeta2Scale], k[kInvMScale], k[kInvVScale]);
  const float mul = grad_multiplier(l, false), step_size = k[kStepSize];
  const uint32_t key = h.stochastic_rounding ? rounding::tensor_key(h.seed, *t.step) : 0u;  // steps: incremented
  const bool round = h.stochastic_rounding && !t.master && t.dtype != Dtype::Float;  // (the params' rounding)
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i), g = load_grad(t, i, mul);
    const uint32_t m_old = code_of(t, 0, i), v_old = code_of(t, 1, i);  // before store_codes overwrites them
    float m = m8(t, i), v = v8(t, i);
    e.moments(g, m, v);
    float m_code = e.m_code(m), v_code = e.v_code(v);
    uint32_t hash = 0u;
    if (h.stochastic_rounding) {
      using namespace rounding;
      hash = element_hash(key, ScalarLanes::as_bits(g), m_old, v_old);
      m_code = stochastic_round<E4M3, ScalarLanes>(m_code, dither<E4M3>(hash));
      v_code = stochastic_round<E5M2, ScalarLanes>(v_code, dither<E5M2>(hash));
    }
    // (a rounded param hashes its moments' element hash, as on CPU)
    store_param_hashed(t, i, p - step_size * e.update(p, m, v), round, rounding::param_hash_of_element(hash));
    store_codes(t, i, m_code, v_code);
  }
}

}  // namespace

extern "C" int inductor_lamb_cuda_lamb16_reduce(const Launch* l, const lamb16::Hyper* h) {
  return reduce_phase(pass1, *l, lamb16::kReductions, lamb16::kMaxColumns, *h);
}

extern "C" int inductor_lamb_cuda_lamb16_apply(const Launch* l, const lamb16::Hyper* h) {
  return apply_phase(coeffs, pass2, *l, *h);
}

}  // namespace inductor_lamb::cuda
