// lamb::lamb_step_ and its two phases on CPU: per-tensor scalars from
// common/lamb.h around the element loops of lamb_kernel.cpp. The one-call op
// runs both phases a block of tensors at a time (TwoPhaseStep, engine.h), pass 1
// stashing the updates that pass 2 applies, with the same bits as the two-phase
// form.
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/lamb.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LambKernels, lamb_kernels)

namespace {

class LambStep : public TwoPhaseStep<LambStep, lamb::Hyper> {
 public:
  explicit LambStep(const OpArgs& a)
      : TwoPhaseStep({a, 2, &lamb::hyper_of<OpArgs>}, lamb::kReductions, 16, /*stash_planes=*/1,
                     /*per_thread_blocks=*/true),
        steps_(a.list("steps")),
        coeffs_(c_.n),
        args_{c_.tensors.data(), coeffs_.data(), c_.chunk_span(), lamb::consts(c_.hyper), 1.f, 1.f, nullptr} {}

  // reduce: steps += 1 and g = grad / grad_scale / clip; apply: the bias
  // corrections of the steps reduce incremented, and lr.
  void begin(bool reduce, bool apply) {
    if (reduce) {
      args_.grad_mul = float(grad_multiplier(c_.rows, c_.inv_grad_scale(), c_.hyper.max_grad_norm));
      increment_steps(steps_);
    }
    const lamb::Hyper& h = c_.hyper;
    for (size_t i = 0; i < c_.n; ++i) {
      const double t = steps_[i].item<float>();
      coeffs_[i].inv_bc1 = lamb::inv_bias_correction(*h.beta1, t, h.bias_correction);
      coeffs_[i].inv_bc2 = lamb::inv_bias_correction(*h.beta2, t, h.bias_correction);
    }
    if (apply) {
      lr_ = c_.lr();
      args_.keep = lamb::keep(c_.hyper, lr_);
      c_.param_keys(&steps_);
    }
  }

  // Pass 1: m and v updated; per tensor (||p||^2, ||u||^2).
  void reduce_block(const Block& b, double* out, const BlockPass& pass) {
    std::vector<double> partials(lamb::kReductions * (b.c1 - b.c0));
    LambArgs args = args_;  // (a copy: threads may run blocks at once)
    args.partials = partials.data();
    args.chunks = c_.chunk_span(b, pass.backward);
    args.stash = pass.stash;
    kernels().pass1(args);
    reduce_per_tensor(c_.chunks, b, partials.data(), lamb::kReductions, out);
  }

  // Pass 2: p = keep p - lr * r * u.
  void apply_block(const Block& b, const double* sq, const BlockPass& pass) {
    for (int64_t i = b.t0; i < b.t1; ++i) {
      const double* s = sq + lamb::kReductions * (i - b.t0);
      coeffs_[i].step_size = lamb::step_size(c_.hyper, lr_, s[0], s[1]);
    }
    LambArgs args = args_;
    args.chunks = c_.chunk_span(b, pass.backward);
    args.stash = pass.stash;
    kernels().pass2(args);
  }

  void end(bool reduce, bool apply) { c_.commit(apply, reduce ? 0b11u : 0u); }  // p; m, v

 private:
  static const LambKernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb_kernels); }

  at::TensorList steps_;
  std::vector<LambCoeffs> coeffs_;
  LambArgs args_;
  double lr_ = 0.0;
};

INDUCTOR_LAMB_CPU_OPS(LambStep, "lamb_step_")

}  // namespace

}  // namespace inductor_lamb::cpu
