// lamb::lamb_step_ and its two phases on CPU: checks, per-tensor scalars and
// trust ratios; the element loops are in lamb_kernel.cpp, the shared machinery
// in engine.cpp. The one-call op runs exactly the reduce phase, then the apply
// phase (through the float32 reductions tensor), so both forms give the same bits.
#include <torch/library.h>

#include <cmath>

#include "cpu/engine.h"
#include "cpu/lamb.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LambKernels, lamb_kernels)

namespace {


constexpr int64_t kReductions = 2;  // per tensor: ||p||^2, ||u||^2 (sums over shards)

// One checked call: layouts, tensor table and per-tensor coefficients.
class LambStep {
 public:
  LambStep(const char* op, LAMB_LISTS, LAMB_HYPERS)
      : op_(op),
        steps_(steps),
        lists_(check_lamb_step(op, params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1_t, beta2_t, eps,
                               weight_decay, max_grad_norm, grad_scale, found_inf, master_params, at::kCPU)),
        skip_(found_inf_set(found_inf)),  // like torch's fused Adam under GradScaler: skip the whole step
        rows_(params, grads, lists_),
        n_(params.size()),
        has_master_(master_params.has_value()),
        bias_correction_(bias_correction),
        trust_clip_(trust_clip),
        adapt_(weight_decay != 0 || always_adapt),
        max_grad_norm_(max_grad_norm),
        grad_scale_(grad_scale),
        lr_(lr),
        beta1_(cpu_value(beta1_t)),
        beta2_(cpu_value(beta2_t)),
        tensors_(n_),
        coeffs_(n_),
        chunks_(make_chunks(rows_.numels())) {
    for (size_t i = 0; i < n_; ++i)
      tensors_[i] = {rows_.param(i), rows_.grad(i), rows_.floats(i, 0), rows_.floats(i, 1),
                     has_master_ ? rows_.floats(i, 2) : nullptr, rows_.dtypes()[i]};
    args_ = LambArgs{tensors_.data(),
                     coeffs_.data(),
                     {chunks_.data(), static_cast<int64_t>(chunks_.size())},
                     float(beta1_),
                     float(beta2_),
                     grad_averaging ? float(1.0 - beta1_) : 1.f,
                     float(eps),
                     float(weight_decay),
                     1.f,
                     nullptr};
  }

  // Pass 1: steps += 1, m and v updated; returns [n, 2] float32 (||p||^2, ||u||^2).
  at::Tensor reduce() {
    if (skip_) return at::zeros({int64_t(n_), kReductions}, at::kFloat);
    // g = grad / grad_scale / clip
    args_.grad_mul = float(grad_multiplier(rows_, inv_grad_scale(grad_scale_), max_grad_norm_));
    increment_steps(steps_);
    bias_corrections();
    std::vector<double> partials(kReductions * chunks_.size());
    args_.partials = partials.data();
    kernels().pass1(args_);
    rows_.commit(false, {0, 1});
    return reductions_tensor(reduce_per_tensor(chunks_, partials, kReductions, n_), n_, kReductions, at::kCPU);
  }

  // Pass 2 from the (all-reduced) reductions: p -= lr * r * u, r = ||p|| / ||u||.
  void apply(const at::Tensor& reductions) {
    check_reductions(ArgChecker(op_), reductions, n_, kReductions, at::kCPU);
    if (skip_) return;
    bias_corrections();  // of the steps the reduce phase incremented
    const auto sq = read_reductions(reductions);
    const float lr = lr_.item<float>();
    for (size_t i = 0; i < n_; ++i) {
      const double p_norm = std::sqrt(sq[2 * i]), u_norm = std::sqrt(sq[2 * i + 1]);
      double ratio = adapt_ && p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
      if (trust_clip_) ratio = std::min(ratio, 1.0);
      coeffs_[i].step_size = float(lr * ratio);
    }
    kernels().pass2(args_);
    rows_.commit(true, {}, has_master_ ? 2 : -1);
  }

 private:
  static const LambKernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb_kernels); }

  void bias_corrections() {
    for (size_t i = 0; i < n_; ++i) {
      const double t = steps_[i].item<float>();
      coeffs_[i].inv_bc1 = bias_correction_ ? float(1.0 / (1.0 - std::pow(beta1_, t))) : 1.f;
      coeffs_[i].inv_bc2 = bias_correction_ ? float(1.0 / (1.0 - std::pow(beta2_, t))) : 1.f;
    }
  }

  const char* op_;
  at::TensorList steps_;
  std::vector<StateList> lists_;
  bool skip_;
  TensorRows rows_;
  size_t n_;
  bool has_master_, bias_correction_, trust_clip_, adapt_;
  double max_grad_norm_;
  std::optional<at::Tensor> grad_scale_;
  at::Tensor lr_;
  double beta1_, beta2_;
  std::vector<LambTensor> tensors_;
  std::vector<LambCoeffs> coeffs_;
  std::vector<Chunk> chunks_;
  LambArgs args_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(LambStep, lamb_cpu, LAMB, "lamb_step_", "lamb_reduce_", "lamb_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
