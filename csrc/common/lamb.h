#pragma once
// LAMB's equations (docs/design.md), once for every backend: the hyper-parameters,
// the per-tensor scalars and the element update. Pass 1 updates m, v and
// reduces ||p||^2, ||u||^2; pass 2 recomputes u from the new m, v and steps p.
#include "common/math.h"

namespace inductor_lamb::lamb {

// The op's hyper-parameters (lamb_step_'s schema after the lists and lr).
// Scheduled ones are 0-d float32 tensors on the op's device, read where the math runs.
struct Hyper {
  const float* beta1;
  const float* beta2;
  double eps, weight_decay, max_grad_norm;
  bool bias_correction, grad_averaging, always_adapt, trust_clip;
  bool decoupled_decay;  // p *= keep before the update, and wd leaves u (timm's decoupled_decay)
  double max_lr;         // > 0: that decay scaled lr^2 / max_lr (decay_keep)
  bool stochastic_rounding;  // bf16/fp16 params without master copies (common/rounding.h)
  int64_t seed;              // of the rounding's random bits
};

// The hyper-parameters of a call, read by name from its arguments (A: OpArgs,
// common/op_args.h; a template keeps this header free of torch for nvcc).
template <typename A>
Hyper hyper_of(const A& a) {
  return {a.scalar("beta1"),         a.scalar("beta2"),          a.real("eps"),
          a.real("weight_decay"),     a.real("max_grad_norm"),    a.flag("bias_correction"),
          a.flag("grad_averaging"),   a.flag("always_adapt"),     a.flag("trust_clip"),
          a.flag("decoupled_decay"),  a.real("max_lr"),           a.flag("stochastic_rounding"),
          a.integer("seed")};
}

constexpr int kReductions = 2;  // per tensor: ||p||^2, ||u||^2 (sums over shards)

// 1 / (1 - beta^t), or 1 without bias correction.
INDUCTOR_LAMB_HD float inv_bias_correction(double beta, double t, bool on) {
  return on ? float(1.0 / (1.0 - pow(beta, t))) : 1.f;
}

// The param's factor before the update: 1 - lr wd with decoupled decay (decay_keep), else 1.
INDUCTOR_LAMB_HD float keep(const Hyper& h, double lr) {
  return decay_keep(h.decoupled_decay, h.weight_decay, h.max_lr, lr);
}

// lr * trust ratio, r = ||p|| / ||u|| (1 when a norm is 0 or without adaptation; at most 1 with
// trust_clip); ||p|| that of the decayed param keep p under decoupled decay (timm's order).
INDUCTOR_LAMB_HD float step_size(const Hyper& h, double lr, double p_sq, double u_sq) {
  const double p_norm = sqrt(p_sq) * (h.decoupled_decay ? fabs(double(keep(h, lr))) : 1.0), u_norm = sqrt(u_sq);
  const bool adapt = h.weight_decay != 0 || h.always_adapt;
  double ratio = adapt && p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
  if (h.trust_clip) ratio = min_of(ratio, 1.0);
  return float(lr * ratio);
}

// The float32 constants of the element math (from the hyper-parameters).
struct Consts {
  float beta1, beta2, beta3, one_minus_beta2, eps, wd;
};
INDUCTOR_LAMB_HD Consts consts(const Hyper& h) {
  const double beta1 = *h.beta1;
  const float b2 = *h.beta2;
  return {float(beta1), b2, h.grad_averaging ? float(1.0 - beta1) : 1.f, 1.f - b2, float(h.eps),
          h.decoupled_decay ? 0.f : float(h.weight_decay)};
}

// Per element (g already divided by grad_scale and the clip divisor):
//   m = beta1 m + beta3 g;  v = beta2 v + (1 - beta2) g^2
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + wd p   (wd 0 under decoupled decay)
template <typename V>
struct Elem {
  using Ops = ValueOps<V>;
  V beta1, beta2, beta3, one_minus_beta2, inv_bc1, inv_bc2, eps, wd;
  INDUCTOR_LAMB_HD Elem(const Consts& c, float inv_bc1_, float inv_bc2_)
      : beta1(c.beta1), beta2(c.beta2), beta3(c.beta3), one_minus_beta2(c.one_minus_beta2), inv_bc1(inv_bc1_),
        inv_bc2(inv_bc2_), eps(c.eps), wd(c.wd) {}
  INDUCTOR_LAMB_HD void moments(const V& g, V& m, V& v) const {
    m = m * beta1 + g * beta3;
    v = v * beta2 + g * g * one_minus_beta2;
  }
  INDUCTOR_LAMB_HD V update(const V& p, const V& m, const V& v) const {
    return m * inv_bc1 * Ops::inv_sqrt_plus_eps(v * inv_bc2, eps) + wd * p;
  }
};

}  // namespace inductor_lamb::lamb
