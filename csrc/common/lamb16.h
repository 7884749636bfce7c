#pragma once
// LAMB16's equations (LAMB with float8 moments, docs/design.md), once for every
// backend. m is stored as float8_e4m3fn (m / m_scale), v as float8_e5m2
// (v / v_scale), with per-tensor scales. Pass 1 reduces ||p||^2, ||u||^2,
// amax |m|, amax v (the new scales need the whole tensor); pass 2 recomputes
// m, v, u, steps p and stores m, v with the new scales.
#include "common/math.h"

namespace inductor_lamb::lamb16 {

struct Hyper {
  const float* beta1;  // scheduled: 0-d float32 tensors on the op's device
  const float* beta2;
  double eps, weight_decay, trust_scale;
  bool stochastic_rounding;  // encode m, v with common/rounding.h (else round to nearest even)
  int64_t seed;              // of the rounding's random bits
};

// The hyper-parameters of a call, read by name from its arguments (A: OpArgs,
// common/op_args.h; a template keeps this header free of torch for nvcc).
template <typename A>
Hyper hyper_of(const A& a) {
  return {a.scalar("beta1"), a.scalar("beta2"), a.real("eps"), a.real("weight_decay"), a.real("trust_scale"),
          a.flag("stochastic_rounding"), a.integer("seed")};
}

// Per tensor: ||p||^2, ||u||^2 (sums over shards), amax |m|, amax v (maxima over shards).
constexpr int kReductions = 4;
constexpr unsigned kMaxColumns = 0b1100u;  // which reductions are maxima

// Largest finite float8 values: stored moments saturate to them (never inf/NaN).
constexpr float kE4M3Max = 448.f;
constexpr float kE5M2Max = 57344.f;
constexpr float kMinScale = 1.17549435e-38f;  // FLT_MIN: an all-zero tensor keeps a finite, nonzero scale

// amax / fp8_max: the largest |value| maps to the largest finite float8, so a
// stored value never saturates and the bulk of a heavy-tailed tensor stays normal.
INDUCTOR_LAMB_HD float new_scale(double amax, float fp8_max) { return max_of(float(amax) / fp8_max, kMinScale); }

// lr * r, r = clamp((||p|| / ||u|| * 1e-3 / lr) ^ trust_scale, 0, 2); 1 when a norm is 0.
INDUCTOR_LAMB_HD float step_size(const Hyper& h, double lr, double p_sq, double u_sq) {
  const double p_norm = sqrt(p_sq), u_norm = sqrt(u_sq);
  double ratio = 1.0;
  if (p_norm > 0 && u_norm > 0) ratio = min_of(pow(p_norm / u_norm * 1e-3 / lr, h.trust_scale), 2.0);
  return float(lr * ratio);
}

// beta * the old scale: multiplies a stored (decoded) float8 value into the EMA.
INDUCTOR_LAMB_HD float beta_scale(const float* beta, float old_scale) { return *beta * old_scale; }

struct Consts {
  float one_minus_beta1, one_minus_beta2, eps, wd;
};
// Whether eps lets Elem::update<true> run where every v is finite.
INDUCTOR_LAMB_HD bool eps_allows_finite(const Consts& c) { return c.eps > 0.f && c.eps < 1e38f; }
INDUCTOR_LAMB_HD Consts consts(const Hyper& h) {
  return {float(1.0 - double(*h.beta1)), float(1.0 - double(*h.beta2)), float(h.eps), float(h.weight_decay)};
}

// Per element, from the decoded float8 codes m8, v8 (g already divided by grad_scale):
//   m = beta1 m_scale m8 + (1 - beta1) g;  v = beta2 v_scale v8 + (1 - beta2) g^2
//   u = m / (sqrt(v) + eps) + wd p
// and the values to encode with the new scales, saturated on both sides first (float8
// conversions turn overflow into NaN/inf; v is never negative with betas in range, but an apply
// op given a smaller amax than its data, with beta2 > 1, would see a negative v overflow).
template <typename V>
struct Elem {
  using Ops = ValueOps<V>;
  V beta1_scale, beta2_scale, one_minus_beta1, one_minus_beta2, eps, wd;
  V inv_m_scale, inv_v_scale, m_lo, m_hi, v_lo, v_hi;
  INDUCTOR_LAMB_HD Elem(const Consts& c, float beta1_scale_, float beta2_scale_, float inv_m_scale_ = 1.f,
                        float inv_v_scale_ = 1.f)
      : beta1_scale(beta1_scale_), beta2_scale(beta2_scale_), one_minus_beta1(c.one_minus_beta1),
        one_minus_beta2(c.one_minus_beta2), eps(c.eps), wd(c.wd), inv_m_scale(inv_m_scale_),
        inv_v_scale(inv_v_scale_), m_lo(-kE4M3Max), m_hi(kE4M3Max), v_lo(-kE5M2Max), v_hi(kE5M2Max) {}
  // m, v: the decoded codes on entry, the new float32 moments on return.
  INDUCTOR_LAMB_HD void moments(const V& g, V& m, V& v) const {
    m = m * beta1_scale + g * one_minus_beta1;
    v = v * beta2_scale + g * g * one_minus_beta2;
  }
  // Finite: every v is known finite and eps_allows_finite, so sqrt(v) + eps has no
  // special value (ValueOps::inv_sqrt_plus_eps); see eps_allows_finite.
  template <bool Finite = false>
  INDUCTOR_LAMB_HD V update(const V& p, const V& m, const V& v) const {
    return Ops::fmadd(wd, p, m * Ops::template inv_sqrt_plus_eps<Finite>(v, eps));
  }
  INDUCTOR_LAMB_HD V m_code(const V& m) const { return Ops::clamp(m * inv_m_scale, m_lo, m_hi); }
  INDUCTOR_LAMB_HD V v_code(const V& v) const { return Ops::clamp(v * inv_v_scale, v_lo, v_hi); }
};

}  // namespace inductor_lamb::lamb16
