// lamb::lars_step_ and its two phases on CPU (PaddlePaddle merged lars_momentum
// semantics): layer norms from the engine (reduce), per-tensor local learning
// rates and one update pass (apply). The one-call op is exactly reduce then apply.
#include <torch/library.h>

#include <cmath>

#include "cpu/engine.h"
#include "cpu/lars.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LarsKernels, lars_kernels)

namespace {


constexpr int64_t kReductions = 2;  // per tensor: ||p||^2, ||g||^2 (sums over shards)

class LarsStep {
 public:
  LarsStep(const char* op, LARS_LISTS, LARS_HYPERS)
      : op_(op),
        lists_(check_lars_step(op, params, grads, momentum_buffers, lr, momentum_t, lars_coeff, eps, rescale_grad,
                               weight_decay, layer_adaptation, grad_scale, found_inf, master_params, at::kCPU)),
        skip_(found_inf_set(found_inf)),
        rows_(params, grads, lists_),
        n_(params.size()),
        has_master_(master_params.has_value()),
        lars_coeff_(lars_coeff),
        eps_(eps),
        weight_decay_(weight_decay),
        layer_adaptation_(layer_adaptation),
        lr_(lr),
        momentum_(cpu_value(momentum_t)),
        grad_mul_(rescale_grad * inv_grad_scale(grad_scale)) {}

  // Layer norms (two reads, 8 bytes/param; nothing written): [n, 2] float32.
  at::Tensor reduce() {
    if (skip_) return at::zeros({int64_t(n_), kReductions}, at::kFloat);
    std::vector<const void*> p_ptrs(n_), g_ptrs(n_);
    std::vector<Dtype> p_dtypes = rows_.dtypes();
    for (size_t i = 0; i < n_; ++i) {
      p_ptrs[i] = has_master_ ? rows_.floats(i, 1) : rows_.param(i);
      if (has_master_) p_dtypes[i] = Dtype::Float;
      g_ptrs[i] = rows_.grad(i);
    }
    const auto p_sq = per_tensor_sumsq(p_ptrs, p_dtypes, rows_.numels(), 1.f);
    const auto g_sq = per_tensor_sumsq(g_ptrs, rows_.dtypes(), rows_.numels(), float(grad_mul_));
    std::vector<double> out(kReductions * n_);
    for (size_t i = 0; i < n_; ++i) out[2 * i] = p_sq[i], out[2 * i + 1] = g_sq[i];
    return reductions_tensor(out, n_, kReductions, at::kCPU);
  }

  // Local learning rates from the reductions, then one update pass.
  void apply(const at::Tensor& reductions) {
    check_reductions(ArgChecker(op_), reductions, n_, kReductions, at::kCPU);
    if (skip_) return;
    const auto sq = read_reductions(reductions);
    const double lr = lr_.item<float>();
    std::vector<LarsTensor> tensors(n_);
    std::vector<LarsCoeffs> coeffs(n_);
    for (size_t i = 0; i < n_; ++i) {
      const double wd = per_param(weight_decay_, i, 0.0);
      const bool adapt = per_param(layer_adaptation_, i, true);
      const double p_norm = std::sqrt(sq[2 * i]), g_norm = std::sqrt(sq[2 * i + 1]);
      double local_lr = lr;
      if (adapt && wd > 0 && p_norm > 0 && g_norm > 0)
        local_lr = lr * lars_coeff_ * p_norm / (g_norm + wd * p_norm + eps_);
      coeffs[i] = {float(local_lr), float(wd)};
      tensors[i] = {rows_.param(i), rows_.grad(i), rows_.floats(i, 0), has_master_ ? rows_.floats(i, 1) : nullptr,
                    rows_.dtypes()[i]};
    }
    const auto chunks = make_chunks(rows_.numels());
    const LarsArgs args{tensors.data(), coeffs.data(), {chunks.data(), static_cast<int64_t>(chunks.size())},
                        float(momentum_), float(grad_mul_)};
    INDUCTOR_LAMB_KERNELS(lars_kernels).update(args);
    rows_.commit();
  }

 private:
  const char* op_;
  std::vector<StateList> lists_;
  bool skip_;
  TensorRows rows_;
  size_t n_;
  bool has_master_;
  double lars_coeff_, eps_;
  c10::ArrayRef<double> weight_decay_;
  c10::List<bool> layer_adaptation_;
  at::Tensor lr_;
  double momentum_, grad_mul_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(LarsStep, lars_cpu, LARS, "lars_step_", "lars_reduce", "lars_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
