// The shared math headers (csrc/common/<opt>.h) instantiated with V = float, as
// the CUDA kernels instantiate them, built by tests/test_shared_math.py with a
// plain host compiler (no torch, no CUDA: the headers must stay device-neutral)
// and called through ctypes. Each function is one optimizer step of one float32
// tensor, element by element: the scalar twin of the CPU vector kernels.
#include <stdint.h>

#include "common/adagrad.h"
#include "common/lamb.h"
#include "common/lamb16.h"
#include "common/lars.h"
#include "common/novograd.h"
#include "common/rounding.h"

using namespace inductor_lamb;

namespace {
// The kernels' reductions reach the per-tensor scalars as float32 (the reductions tensor).
double as_f32(double x) { return float(x); }
}  // namespace

extern "C" {

// LAMB, one tensor: step is the incremented step count t; grad_mul = 1 / (grad_scale * clip).
void lamb_step(int64_t n, float* p, const float* g, float* m, float* v, double step, double lr, float beta1,
               float beta2, double eps, double weight_decay, int bias_correction, int grad_averaging,
               int always_adapt, int trust_clip, int decoupled_decay, double max_lr, float grad_mul) {
  const lamb::Hyper h{&beta1, &beta2, eps, weight_decay, 0.0, bool(bias_correction), bool(grad_averaging),
                      bool(always_adapt), bool(trust_clip), bool(decoupled_decay), max_lr, false, 0};
  const lamb::Elem<float> e(lamb::consts(h), lamb::inv_bias_correction(beta1, step, h.bias_correction),
                            lamb::inv_bias_correction(beta2, step, h.bias_correction));
  double p_sq = 0, u_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    e.moments(g[i] * grad_mul, m[i], v[i]);
    const float u = e.update(p[i], m[i], v[i]);
    p_sq += double(p[i]) * p[i];
    u_sq += double(u) * u;
  }
  const float step_size = lamb::step_size(h, lr, as_f32(p_sq), as_f32(u_sq)), keep = lamb::keep(h, lr);
  for (int64_t i = 0; i < n; ++i) {
    const float pk = keep != 1.f ? p[i] * keep : p[i];
    p[i] = pk - step_size * e.update(p[i], m[i], v[i]);
  }
}

// LAMB16, one tensor: m8 / v8 hold the decoded float8 codes on entry and the
// saturated values to store on return (on the float8 grid when stochastic, as
// the CUDA kernel rounds them; m_codes / v_codes: the stored bytes before the
// step); scales[0..1] the old m / v scales on entry, the new ones on return;
// step the incremented step count.
void lamb16_step(int64_t n, float* p, const float* g, float* m8, float* v8, const uint8_t* m_codes,
                 const uint8_t* v_codes, float* scales, double lr, float beta1, float beta2, double eps,
                 double weight_decay, double trust_scale, float grad_mul, int stochastic, int64_t seed, float step) {
  const lamb16::Hyper h{&beta1, &beta2, eps, weight_decay, trust_scale, bool(stochastic), seed};
  const lamb16::Consts k = lamb16::consts(h);
  const float beta1_scale = lamb16::beta_scale(&beta1, scales[0]), beta2_scale = lamb16::beta_scale(&beta2, scales[1]);
  const lamb16::Elem<float> e1(k, beta1_scale, beta2_scale);
  double p_sq = 0, u_sq = 0;
  float m_max = 0, v_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    float m = m8[i], v = v8[i];
    e1.moments(g[i] * grad_mul, m, v);
    const float u = e1.update(p[i], m, v);
    p_sq += double(p[i]) * p[i];
    u_sq += double(u) * u;
    m_max = max_of(m_max, m < 0 ? -m : m);
    v_max = max_of(v_max, v);
  }
  scales[0] = lamb16::new_scale(m_max, lamb16::kE4M3Max);
  scales[1] = lamb16::new_scale(v_max, lamb16::kE5M2Max);
  const float step_size = lamb16::step_size(h, lr, as_f32(p_sq), as_f32(u_sq));
  const lamb16::Elem<float> e2(k, beta1_scale, beta2_scale, 1.f / scales[0], 1.f / scales[1]);
  for (int64_t i = 0; i < n; ++i) {
    float m = m8[i], v = v8[i];
    const float gs = g[i] * grad_mul;
    e2.moments(gs, m, v);
    p[i] = p[i] - step_size * e2.update(p[i], m, v);
    m8[i] = e2.m_code(m);
    v8[i] = e2.v_code(v);
    if (h.stochastic_rounding) {
      using namespace rounding;
      const uint32_t hash = element_hash(tensor_key(seed, step), ScalarLanes::as_bits(gs), uint32_t(m_codes[i]),
                                         uint32_t(v_codes[i]));
      m8[i] = stochastic_round<E4M3, ScalarLanes>(m8[i], dither<E4M3>(hash));
      v8[i] = stochastic_round<E5M2, ScalarLanes>(v8[i], dither<E5M2>(hash));
    }
  }
}

// LAMB16's stochastic rounding of values x with the element hashes `hash`, both
// ways: the rounded values (stochastic_round, then encoded by the caller) and the
// codes the CPU kernels store (stochastic_code), for m's grid and v's.
void rounding_both_ways(int64_t n, const float* x, const uint32_t* hash, float* m_rounded, uint8_t* m_codes,
                        float* v_rounded, uint8_t* v_codes) {
  using namespace rounding;
  for (int64_t i = 0; i < n; ++i) {
    m_rounded[i] = stochastic_round<E4M3, ScalarLanes>(x[i], dither<E4M3>(hash[i]));
    m_codes[i] = uint8_t(stochastic_code<E4M3, ScalarLanes>(x[i], dither<E4M3>(hash[i])));
    v_rounded[i] = stochastic_round<E5M2, ScalarLanes>(x[i], dither<E5M2>(hash[i]));
    v_codes[i] = uint8_t(stochastic_code<E5M2, ScalarLanes>(x[i], dither<E5M2>(hash[i])));
  }
}

// Stochastic rounding of bf16 (grid 0) or fp16 (grid 1) params: x the new values, hash_in
// and p0 param_hash's inputs (what the CUDA kernels round with before storing a param).
void round_params(int64_t n, int grid, uint32_t key, const float* x, const float* hash_in, const float* p0,
                  float* out) {
  using namespace rounding;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = param_hash(param_base(key, ScalarLanes::as_bits(hash_in[i])), ScalarLanes::as_bits(p0[i]));
    out[i] = grid == 0 ? round_param<BF16, ScalarLanes>(x[i], h) : round_param<F16, ScalarLanes>(x[i], h);
  }
}

// LARS, one tensor; inv_grad_scale = 1 / grad_scale.
void lars_step(int64_t n, float* p, const float* g, float* buf, double lr, float momentum, double lars_coeff,
               double eps, double rescale_grad, double weight_decay, int layer_adaptation, float inv_grad_scale,
               int lr_in_momentum) {
  const lars::Hyper h{&momentum, lars_coeff, eps, rescale_grad, bool(lr_in_momentum)};
  const float grad_mul = lars::grad_mul(h, inv_grad_scale);
  double p_sq = 0, g_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float gs = g[i] * grad_mul;
    p_sq += double(p[i]) * p[i];
    g_sq += double(gs) * gs;
  }
  const lars::Options o{weight_decay, bool(layer_adaptation)};
  const lars::Elem<float> e(momentum, lars::local_lr(h, o, lr, as_f32(p_sq), as_f32(g_sq)), float(weight_decay), grad_mul,
                            lars::step_size(h, lr));
  for (int64_t i = 0; i < n; ++i) p[i] = e.step(g[i], p[i], buf[i]);
}

// Adagrad, one tensor; step is the incremented step count t.
void adagrad_step(int64_t n, float* p, const float* g, float* sum, double step, double lr, double lr_decay,
                  double weight_decay, double eps, int maximize, float inv_grad_scale) {
  const adagrad::Hyper h{lr_decay, weight_decay, eps, bool(maximize)};
  const adagrad::Elem<float> e(adagrad::clr(lr, step, lr_decay), h, adagrad::grad_mul(h, inv_grad_scale));
  for (int64_t i = 0; i < n; ++i) p[i] = e.step(g[i], p[i], sum[i]);
}

// NovoGrad, one tensor: vs = {v, v_max} in and out (one number per tensor); inv_grad_scale = 1 / grad_scale.
void novograd_step(int64_t n, float* p, const float* g, float* m, float* vs, double lr, float beta1, float beta2,
                   double eps, double weight_decay, double max_lr, int grad_averaging, int amsgrad,
                   int decoupled_decay, float inv_grad_scale) {
  const novograd::Hyper h{&beta1, &beta2, eps, weight_decay, max_lr, bool(grad_averaging), bool(amsgrad),
                          bool(decoupled_decay), false, 0};
  double g_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float gs = g[i] * inv_grad_scale;
    g_sq += double(gs) * gs;
  }
  const novograd::Moments mo = novograd::moments(h, vs[0], vs[1], as_f32(g_sq));
  vs[0] = mo.v;
  vs[1] = mo.v_max;
  const novograd::Elem<float> e(h, novograd::grad_mul(h, mo, inv_grad_scale), float(lr), novograd::keep(h, lr));
  for (int64_t i = 0; i < n; ++i) p[i] = e.step(g[i], p[i], m[i]);
}

}  // extern "C"
