#pragma once
// Adagrad's equations (exactly torch.optim.Adagrad), once for every backend.
#include "common/math.h"

namespace inductor_lamb::adagrad {

struct Hyper {
  double lr_decay, weight_decay, eps;
  bool maximize;
  bool stochastic_rounding;  // bf16/fp16 params without master copies (common/rounding.h)
  int64_t seed;              // of the rounding's random bits
};

// The hyper-parameters of a call, read by name from its arguments (A: OpArgs,
// common/op_args.h; a template keeps this header free of torch for nvcc).
template <typename A>
Hyper hyper_of(const A& a) {
  return {a.real("lr_decay"), a.real("weight_decay"), a.real("eps"), a.flag("maximize"),
          a.flag("stochastic_rounding"), a.integer("seed")};
}

// The step's learning rate lr / (1 + (t - 1) lr_decay), t the incremented step.
INDUCTOR_LAMB_HD float clr(double lr, double t, double lr_decay) { return float(lr / (1.0 + (t - 1.0) * lr_decay)); }

// The gradient multiplier +-1 / grad_scale (negative with maximize).
INDUCTOR_LAMB_HD float grad_mul(const Hyper& h, float inv_grad_scale) { return (h.maximize ? -1.f : 1.f) * inv_grad_scale; }

// Per element: g = grad_mul g + wd p; s += g^2; p -= clr g / (sqrt(s) + eps).
template <typename V>
struct Elem {
  using Ops = ValueOps<V>;
  V clr, wd, eps, grad_mul;
  INDUCTOR_LAMB_HD Elem(float clr_, const Hyper& h, float grad_mul_)
      : clr(clr_), wd(float(h.weight_decay)), eps(float(h.eps)), grad_mul(grad_mul_) {}
  // Returns the new p; s is updated in place. (One expression with g's scaling:
  // the CPU kernels' FMA contraction, hence their bits, depends on its shape.)
  INDUCTOR_LAMB_HD V step(const V& g, const V& p, V& s) const {
    const V gw = g * grad_mul + wd * p;
    s = s + gw * gw;
    return p - clr * gw * Ops::inv_sqrt_plus_eps(s, eps);
  }
};

}  // namespace inductor_lamb::adagrad
