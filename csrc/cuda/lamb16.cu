// LAMB16 on CUDA (LAMB with float8 moments). reduce: pass 1 reduces ||p||^2,
// ||u||^2, amax |m|, amax v per chunk (reading p, g, m8, v8 and the old scales),
// then one thread per tensor totals them into the reductions and increments the
// step. apply: one thread per tensor computes the trust ratio and the new scales
// from the reductions, folds the old scales into coefficients and only then
// overwrites them; pass 2 recomputes m, v, u, writes p and stores m, v in
// float8 (26 bytes/param).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

constexpr float kE4M3Max = 448.f, kE5M2Max = 57344.f;  // largest finite values
enum { kBeta1Scale = 0, kBeta2Scale = 1, kStepSize = 2, kInvMScale = 3, kInvVScale = 4 };

__device__ __forceinline__ float from_e4m3(const void* p, int64_t i) {
  return float(static_cast<const __nv_fp8_e4m3*>(p)[i]);
}
__device__ __forceinline__ float from_e5m2(const void* p, int64_t i) {
  return float(static_cast<const __nv_fp8_e5m2*>(p)[i]);
}
// Round to nearest even; __NV_SATFINITE saturates to the largest finite value
// and keeps NaN (the CPU kernel's clamp-then-round gives the same codes).
__device__ __forceinline__ void to_e4m3(void* p, int64_t i, float x) {
  static_cast<__nv_fp8_e4m3*>(p)[i].__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ void to_e5m2(void* p, int64_t i, float x) {
  static_cast<__nv_fp8_e5m2*>(p)[i].__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

struct Lamb16Math {
  float beta1_scale, beta2_scale, one_minus_beta1, one_minus_beta2, eps, wd;
  __device__ float update(float p, float m, float v) const { return m / (sqrtf(v) + eps) + wd * p; }
  // New m, v of element i from the stored float8 values and the grad.
  __device__ void moments(const TensorMeta& t, int64_t i, float g, float& m, float& v) const {
    m = from_e4m3(t.state[0], i) * beta1_scale + g * one_minus_beta1;
    v = from_e5m2(t.state[1], i) * beta2_scale + g * g * one_minus_beta2;
  }
};

__device__ __forceinline__ Lamb16Math make_math(const Lamb16Hyper& h, float beta1_scale, float beta2_scale) {
  return {beta1_scale, beta2_scale, float(1.0 - double(*h.beta1)), float(1.0 - double(*h.beta2)), float(h.eps), float(h.weight_decay)};
}

__global__ void pass1(Launch l, Lamb16Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const Lamb16Math math = make_math(h, *h.beta1 * *t.scalar[0], *h.beta2 * *t.scalar[1]);
  const float mul = grad_multiplier(l, false);
  float p_sq = 0.f, u_sq = 0.f, m_max = 0.f, v_max = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float g = load(t.grad, t.dtype, i) * mul, p = load_param(t, i);
    float m, v;
    math.moments(t, i, g, m, v);
    const float u = math.update(p, m, v);
    p_sq += p * p;
    u_sq += u * u;
    m_max = nan_max(m_max, fabsf(m));
    v_max = nan_max(v_max, v);
  }
  write_partial(l, 0, p_sq);
  write_partial(l, 1, u_sq);
  write_partial<MaxOp>(l, 2, m_max);
  write_partial<MaxOp>(l, 3, v_max);
}

__device__ __forceinline__ float new_scale(float amax, float fp8_max) { return fmaxf(amax / fp8_max, 1.17549435e-38f); }

__global__ void coeffs(Launch l, Lamb16Hyper h) {
  const int32_t i = tensor_index();
  if (i >= l.num_tensors || skip_step(l)) return;
  const TensorMeta& t = l.tensors[i];
  const float* r = l.reductions + 4 * i;  // ||p||^2, ||u||^2, amax |m|, amax v
  float* k = l.coeffs + i * kCoeffs;
  k[kBeta1Scale] = *h.beta1 * *t.scalar[0];
  k[kBeta2Scale] = *h.beta2 * *t.scalar[1];
  const double p_norm = sqrt(double(r[0])), u_norm = sqrt(double(r[1]));
  const double lr = *l.lr;
  double ratio = 1.0;
  if (p_norm > 0 && u_norm > 0) ratio = fmin(pow(p_norm / u_norm * 1e-3 / lr, h.trust_scale), 2.0);
  k[kStepSize] = float(lr * ratio);
  const float m_scale = new_scale(r[2], kE4M3Max);
  const float v_scale = new_scale(r[3], kE5M2Max);
  k[kInvMScale] = 1.f / m_scale;
  k[kInvVScale] = 1.f / v_scale;
  *t.scalar[0] = m_scale;  // pass 2 reads the old ones from k
  *t.scalar[1] = v_scale;
}

__global__ void pass2(Launch l, Lamb16Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float* k = l.coeffs + c.tensor * kCoeffs;
  const Lamb16Math math = make_math(h, k[kBeta1Scale], k[kBeta2Scale]);
  const float mul = grad_multiplier(l, false), step_size = k[kStepSize];
  const float inv_m_scale = k[kInvMScale], inv_v_scale = k[kInvVScale];
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float g = load(t.grad, t.dtype, i) * mul, p = load_param(t, i);
    float m, v;
    math.moments(t, i, g, m, v);
    store_param(t, i, p - step_size * math.update(p, m, v));
    to_e4m3(t.state[0], i, m * inv_m_scale);
    to_e5m2(t.state[1], i, v * inv_v_scale);
  }
}

}  // namespace
}  // namespace inductor_lamb::cuda

extern "C" int inductor_lamb_cuda_lamb16_reduce(const inductor_lamb::cuda::Launch* l,
                                                const inductor_lamb::cuda::Lamb16Hyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_chunks > 0) pass1<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  return launch_finish_reductions(*l, 4, 0b1100u);  // sums of squares, then maxima
}

extern "C" int inductor_lamb_cuda_lamb16_apply(const inductor_lamb::cuda::Launch* l,
                                               const inductor_lamb::cuda::Lamb16Hyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_tensors > 0) coeffs<<<tensor_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  if (l->num_chunks > 0) pass2<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  return cudaGetLastError();
}
