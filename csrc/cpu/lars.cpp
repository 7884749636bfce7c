// lamb::lars_step_ and its two phases on CPU (common/lars.h): layer norms from the engine (reduce), per-tensor local learning
// rates from common/lars.h and one update pass (apply). The one-call op runs
// both a block of tensors at a time (TwoPhaseStep, engine.h).
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/lars.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LarsKernels, lars_kernels)

namespace {

class LarsStep : public TwoPhaseStep<LarsStep, lars::Hyper> {
 public:
  explicit LarsStep(const OpArgs& a)
      : TwoPhaseStep({a, 1, &lars::hyper_of<OpArgs>}, lars::kReductions, 8),
        a_(a),
        grad_mul_(lars::grad_mul(c_.hyper, c_.inv_grad_scale())),
        coeffs_(c_.n),
        p_ptrs_(c_.n),
        g_ptrs_(c_.n),
        p_dtypes_(c_.rows.dtypes()) {
    for (size_t i = 0; i < c_.n; ++i) {  // the norm of a param is that of its master copy, if any
      const TensorPtrs& t = c_.tensors[i];
      p_ptrs_[i] = t.master ? static_cast<const void*>(t.master) : t.param;
      if (t.master) p_dtypes_[i] = Dtype::Float;
      g_ptrs_[i] = t.grad;
    }
  }

  void begin(bool, bool apply) {
    if (apply) {
      lr_ = c_.lr();
      c_.param_keys(nullptr);
    }
  }

  // Layer norms (two reads, 8 bytes/param; nothing written): per tensor (||p||^2, ||g||^2).
  void reduce_block(const Block& b, double* out, const BlockPass&) {
    const auto p_sq = sumsq(b, p_ptrs_, p_dtypes_, 1.f);
    const auto g_sq = sumsq(b, g_ptrs_, c_.rows.dtypes(), grad_mul_);
    for (int64_t i = 0; i < b.t1 - b.t0; ++i) out[2 * i] = p_sq[i], out[2 * i + 1] = g_sq[i];
  }

  // Local learning rates from the reductions, then one update pass.
  void apply_block(const Block& b, const double* sq, const BlockPass& pass) {
    for (int64_t i = b.t0; i < b.t1; ++i) {
      const lars::Options o = lars::options_of(a_, i);
      const double* s = sq + lars::kReductions * (i - b.t0);
      coeffs_[i] = {lars::local_lr(c_.hyper, o, lr_, s[0], s[1]), float(o.weight_decay)};
    }
    const LarsArgs args{c_.tensors.data(), coeffs_.data(), c_.chunk_span(b, pass.backward), *c_.hyper.momentum, grad_mul_,
                        lars::step_size(c_.hyper, lr_)};
    INDUCTOR_LAMB_KERNELS(lars_kernels).update(args);
  }

  void end(bool, bool apply) {
    if (apply) c_.commit();
  }

 private:
  // Per tensor of block b, the sum of (scale * x)^2 over ptrs[tensor].
  std::vector<double> sumsq(const Block& b, const std::vector<const void*>& ptrs, const std::vector<Dtype>& dtypes,
                            float scale) const {
    std::vector<double> partials(b.c1 - b.c0), out(b.t1 - b.t0);
    const SumSqArgs args{ptrs.data(), dtypes.data(), c_.chunk_span(b), scale, partials.data()};
    INDUCTOR_LAMB_KERNELS(engine_kernels).sumsq(args);
    reduce_per_tensor(c_.chunks, b, partials.data(), 1, out.data());
    return out;
  }

  const OpArgs& a_;
  float grad_mul_;
  std::vector<LarsCoeffs> coeffs_;
  std::vector<const void*> p_ptrs_, g_ptrs_;
  std::vector<Dtype> p_dtypes_;
  double lr_ = 0.0;
};

INDUCTOR_LAMB_CPU_OPS(LarsStep, "lars_step_")

}  // namespace

}  // namespace inductor_lamb::cpu
