// lamb::lars_step_ and its two phases on CPU (PaddlePaddle merged lars_momentum
// semantics): layer norms from the engine (reduce), per-tensor local learning
// rates from common/lars.h and one update pass (apply). The one-call op is
// exactly reduce then apply.
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/lars.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LarsKernels, lars_kernels)

namespace {

class LarsStep {
 public:
  LarsStep(const char* op, LARS_LISTS, LARS_HYPERS)
      : c_(op, check_lars(op, at::kCPU, LARS_ARGS), params, grads, 1, master_params.has_value(), lr, grad_scale,
           found_inf),
        weight_decay_(weight_decay),
        layer_adaptation_(layer_adaptation),
        grad_mul_(lars::grad_mul(c_.hyper, c_.inv_grad_scale())) {}

  // Layer norms (two reads, 8 bytes/param; nothing written): [n, 2] float32.
  at::Tensor reduce() {
    if (c_.skip) return c_.reductions_out({}, lars::kReductions);
    std::vector<const void*> p_ptrs(c_.n), g_ptrs(c_.n);
    std::vector<Dtype> p_dtypes = c_.rows.dtypes();
    for (size_t i = 0; i < c_.n; ++i) {
      const TensorPtrs& t = c_.tensors[i];
      p_ptrs[i] = t.master ? static_cast<const void*>(t.master) : t.param;
      if (t.master) p_dtypes[i] = Dtype::Float;
      g_ptrs[i] = t.grad;
    }
    const auto p_sq = per_tensor_sumsq(p_ptrs, p_dtypes, c_.rows.numels(), 1.f);
    const auto g_sq = per_tensor_sumsq(g_ptrs, c_.rows.dtypes(), c_.rows.numels(), grad_mul_);
    std::vector<double> out(lars::kReductions * c_.n);
    for (size_t i = 0; i < c_.n; ++i) out[2 * i] = p_sq[i], out[2 * i + 1] = g_sq[i];
    return c_.reductions_out(out, lars::kReductions);
  }

  // Local learning rates from the reductions, then one update pass.
  void apply(const at::Tensor& reductions) {
    const auto sq = c_.reductions_in(reductions, lars::kReductions);
    if (c_.skip) return;
    const double lr = c_.lr();
    std::vector<LarsCoeffs> coeffs(c_.n);
    for (size_t i = 0; i < c_.n; ++i) {
      const lars::Options o = lars_options(weight_decay_, layer_adaptation_, i);
      coeffs[i] = {lars::local_lr(c_.hyper, o, lr, sq[2 * i], sq[2 * i + 1]), float(o.weight_decay)};
    }
    const LarsArgs args{c_.tensors.data(), coeffs.data(), c_.chunk_span(), *c_.hyper.momentum, grad_mul_};
    INDUCTOR_LAMB_KERNELS(lars_kernels).update(args);
    c_.commit();
  }

 private:
  CpuCall<lars::Hyper> c_;
  c10::ArrayRef<double> weight_decay_;
  c10::List<bool> layer_adaptation_;
  float grad_mul_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(LarsStep, lars_cpu, LARS, "lars_step_", "lars_reduce", "lars_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
