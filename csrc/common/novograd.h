#pragma once
// NovoGrad's equations (Ginsburg et al. 2019; timm's NvNovoGrad, docs/design.md), once for every
// backend: a layer's grad norm (reduce), then per tensor its second moment v, one number a layer,
// and one update pass with a first moment m like the param (apply).
#include "common/math.h"

namespace inductor_lamb::novograd {

struct Hyper {
  const float* beta1;  // scheduled: 0-d float32 tensors on the op's device
  const float* beta2;
  double eps, weight_decay;
  double max_lr;             // > 0: decoupled decay scaled lr^2 / max_lr (decay_keep)
  bool grad_averaging;       // u *= 1 - beta1
  bool amsgrad;              // the denominator takes the running max of v
  bool decoupled_decay;      // p *= 1 - lr wd, outside u (else wd p is part of u)
  bool stochastic_rounding;  // bf16/fp16 params without master copies (common/rounding.h)
  int64_t seed;              // of the rounding's random bits
};

// The hyper-parameters of a call, read by name from its arguments (A: OpArgs,
// common/op_args.h; a template keeps this header free of torch for nvcc).
template <typename A>
Hyper hyper_of(const A& a) {
  return {a.scalar("beta1"), a.scalar("beta2"), a.real("eps"), a.real("weight_decay"), a.real("max_lr"),
          a.flag("grad_averaging"),
          a.flag("amsgrad"), a.flag("decoupled_decay"), a.flag("stochastic_rounding"), a.integer("seed")};
}

constexpr int kReductions = 1;  // per tensor: ||g||^2 (a sum over shards)

// The layer's second moments after this step from g_sq = ||g / grad_scale||^2: v = g_sq unless
// v > 0 (the first step: timm's test of v == 0), else beta2 v + (1 - beta2) g_sq; v_max its
// running max (kept with or without amsgrad, which decides which one the denominator reads).
struct Moments {
  float v, v_max;
};
INDUCTOR_LAMB_HD Moments moments(const Hyper& h, float v, float v_max, double g_sq) {
  const double beta2 = *h.beta2;
  const float nv = v > 0.f ? float(beta2 * v + (1.0 - beta2) * g_sq) : float(g_sq);
  return {nv, max_of(v_max, nv)};
}

// The grads' multiplier in u: 1 / (grad_scale (sqrt(v) + eps)), v the running max with amsgrad.
INDUCTOR_LAMB_HD float grad_mul(const Hyper& h, const Moments& m, float inv_grad_scale) {
  const double d = sqrt(double(h.amsgrad ? m.v_max : m.v)) + h.eps;
  return float(double(inv_grad_scale) / d);
}

// The param's factor before the update: 1 - lr wd with decoupled decay (decay_keep), else 1.
INDUCTOR_LAMB_HD float keep(const Hyper& h, double lr) {
  return decay_keep(h.decoupled_decay, h.weight_decay, h.max_lr, lr);
}

// Per element: u = (grad_mul g + wd p) (1 - beta1 with grad averaging; wd 0 with decoupled
// decay); m = beta1 m + u; p = keep p - lr m.
template <typename V>
struct Elem {
  V beta1, grad_mul, wd, avg, lr, keep;
  INDUCTOR_LAMB_HD Elem(const Hyper& h, float grad_mul_, float lr_, float keep_)
      : beta1(*h.beta1),
        grad_mul(grad_mul_),
        wd(h.decoupled_decay ? 0.f : float(h.weight_decay)),
        avg(h.grad_averaging ? float(1.0 - double(*h.beta1)) : 1.f),
        lr(lr_),
        keep(keep_) {}
  // Returns the new p; m is updated in place. (keep * p is p exactly where keep is 1.)
  INDUCTOR_LAMB_HD V step(const V& g, const V& p, V& m) const {
    m = m * beta1 + (g * grad_mul + wd * p) * avg;
    return keep * p - lr * m;
  }
};

}  // namespace inductor_lamb::novograd
