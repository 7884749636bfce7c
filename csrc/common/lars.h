#pragma once
// LARS's equations (docs/design.md), once for every backend: layer norms ||p||, ||g||
// (reduce), then per tensor a local lr and one update pass (apply). The momentum carries
// the lr (PaddlePaddle's merged lars_momentum, the paper's) or not (torch's SGD: the lr
// scales the param update, so lr 0 moves nothing), per lr_in_momentum.
#include "common/math.h"

namespace inductor_lamb::lars {

// weight_decay and layer_adaptation are per tensor (one value for all or one
// per param): the glue resolves them per index (Options).
struct Hyper {
  const float* momentum;  // scheduled: 0-d float32 tensor on the op's device
  double lars_coeff, eps, rescale_grad;
  bool lr_in_momentum;       // v carries lr (v = mu v + lr r g'; p -= v), or not (v = mu v + r g'; p -= lr v)
  bool stochastic_rounding;  // bf16/fp16 params without master copies (common/rounding.h)
  int64_t seed;              // of the rounding's random bits (LARS counts no steps: step 0)
};

struct Options {
  double weight_decay;
  bool layer_adaptation;
};

// The hyper-parameters of a call, read by name from its arguments (A: OpArgs,
// common/op_args.h; a template keeps this header free of torch for nvcc).
template <typename A>
Hyper hyper_of(const A& a) {
  return {a.scalar("momentum"), a.real("lars_coeff"), a.real("eps"), a.real("rescale_grad"),
          a.flag("lr_in_momentum"), a.flag("stochastic_rounding"), a.integer("seed")};
}

// The options of param i: weight_decay has one value for all or one per param;
// layer_adaptation none (all adapted), one for all or one per param.
template <typename A, typename I>
Options options_of(const A& a, I i) {
  const auto& wd = a.reals("weight_decay");
  const auto& adapt = a.flags("layer_adaptation");
  return {wd.empty() ? 0.0 : wd[wd.size() == 1 ? 0 : i], adapt.empty() ? true : bool(adapt[adapt.size() == 1 ? 0 : i])};
}

constexpr int kReductions = 2;  // per tensor: ||p||^2, ||g||^2 (sums over shards)

// The gradient multiplier rescale_grad / grad_scale.
INDUCTOR_LAMB_HD float grad_mul(const Hyper& h, float inv_grad_scale) { return float(h.rescale_grad * inv_grad_scale); }

// The velocity's factor: lr * lars_coeff * ||p|| / (||g|| + wd ||p|| + eps) with layer
// adaptation, weight decay and both norms nonzero, lr otherwise (lr taken as 1 when the
// momentum does not carry it: step_size applies it).
INDUCTOR_LAMB_HD float local_lr(const Hyper& h, const Options& o, double lr, double p_sq, double g_sq) {
  if (!h.lr_in_momentum) lr = 1.0;
  const double p_norm = sqrt(p_sq), g_norm = sqrt(g_sq), wd = o.weight_decay;
  if (o.layer_adaptation && wd > 0 && p_norm > 0 && g_norm > 0)
    return float(lr * h.lars_coeff * p_norm / (g_norm + wd * p_norm + h.eps));
  return float(lr);
}

// The param update's factor of v: 1 when the momentum carries the lr, else lr.
INDUCTOR_LAMB_HD float step_size(const Hyper& h, double lr) { return h.lr_in_momentum ? 1.f : float(lr); }

// Per element: v = mu v + local_lr (grad_mul g + wd p); p -= step_size v.
template <typename V>
struct Elem {
  V momentum, local_lr, wd, grad_mul, step_size;
  INDUCTOR_LAMB_HD Elem(float momentum_, float local_lr_, float wd_, float grad_mul_, float step_size_)
      : momentum(momentum_), local_lr(local_lr_), wd(wd_), grad_mul(grad_mul_), step_size(step_size_) {}
  // Returns the new p; v is updated in place. (One expression with g's scaling:
  // the CPU kernels' FMA contraction, hence their bits, depends on its shape. p - 1 * v,
  // contracted or not, is p - v exactly.)
  INDUCTOR_LAMB_HD V step(const V& g, const V& p, V& v) const {
    v = v * momentum + local_lr * (g * grad_mul + wd * p);
    return p - step_size * v;
  }
};

}  // namespace inductor_lamb::lars
