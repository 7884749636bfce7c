// lamb::lamb16_step_ and its two phases on CPU: checks, per-tensor scales and
// trust ratios; the element loops are in lamb16_kernel.cpp, the shared machinery
// in engine.cpp. The one-call op is exactly reduce then apply (see lamb.cpp).
#include <torch/library.h>

#include <cfloat>
#include <cmath>

#include "cpu/engine.h"
#include "cpu/lamb16.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(Lamb16Kernels, lamb16_kernels)

namespace {


// Per tensor: ||p||^2, ||u||^2 (sums over shards), amax |m|, amax v (maxima over shards).
constexpr int64_t kReductions = 4;

// amax / fp8_max: the largest |value| maps to the largest finite float8, so a
// stored value never saturates and the bulk of a heavy-tailed tensor stays in the
// normal range (FLT_MIN floor: an all-zero tensor gets a finite, nonzero scale).
float new_scale(double amax, float fp8_max) { return std::max(float(amax) / fp8_max, FLT_MIN); }

class Lamb16Step {
 public:
  Lamb16Step(const char* op, LAMB16_LISTS, LAMB16_HYPERS)
      : op_(op),
        steps_(steps),
        m_scales_(exp_avg_scales),
        v_scales_(exp_avg_sq_scales),
        lists_(check_lamb16_step(op, params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps,
                                 lr, beta1_t, beta2_t, eps, weight_decay, trust_scale, grad_scale, found_inf,
                                 master_params, at::kCPU)),
        skip_(found_inf_set(found_inf)),
        rows_(params, grads, lists_),
        n_(params.size()),
        has_master_(master_params.has_value()),
        trust_scale_(trust_scale),
        lr_(lr),
        tensors_(n_),
        coeffs_(n_),
        chunks_(make_chunks(rows_.numels())) {
    const double beta1 = cpu_value(beta1_t), beta2 = cpu_value(beta2_t);
    for (size_t i = 0; i < n_; ++i) {
      tensors_[i] = {rows_.param(i), rows_.grad(i), rows_.state(i, 0), rows_.state(i, 1),
                     has_master_ ? rows_.floats(i, 2) : nullptr, rows_.dtypes()[i]};
      // the scales of the start of the step (the apply phase overwrites them last)
      coeffs_[i].beta1_scale = float(beta1) * exp_avg_scales[i].item<float>();
      coeffs_[i].beta2_scale = float(beta2) * exp_avg_sq_scales[i].item<float>();
    }
    args_ = Lamb16Args{tensors_.data(),
                       coeffs_.data(),
                       {chunks_.data(), static_cast<int64_t>(chunks_.size())},
                       float(1.0 - beta1),
                       float(1.0 - beta2),
                       float(eps),
                       float(weight_decay),
                       inv_grad_scale(grad_scale),
                       nullptr,
                       nullptr};
  }

  // Pass 1 (writes nothing but the steps): [n, 4] float32 reductions.
  at::Tensor reduce() {
    if (skip_) return at::zeros({int64_t(n_), kReductions}, at::kFloat);
    increment_steps(steps_);  // no bias correction in LAMB16; steps count like torch.optim's
    std::vector<double> sums(2 * chunks_.size()), maxes(2 * chunks_.size());
    args_.sums = sums.data();
    args_.maxes = maxes.data();
    kernels().pass1(args_);
    const auto sq = reduce_per_tensor(chunks_, sums, 2, n_);
    const auto amax = max_per_tensor(chunks_, maxes, 2, n_);
    std::vector<double> out(kReductions * n_);
    for (size_t i = 0; i < n_; ++i) out[4 * i] = sq[2 * i], out[4 * i + 1] = sq[2 * i + 1],
                                    out[4 * i + 2] = amax[2 * i], out[4 * i + 3] = amax[2 * i + 1];
    return reductions_tensor(out, n_, kReductions, at::kCPU);
  }

  // Pass 2: trust ratios and new scales from the reductions; p, m8, v8, scales written.
  void apply(const at::Tensor& reductions) {
    check_reductions(ArgChecker(op_), reductions, n_, kReductions, at::kCPU);
    if (skip_) return;
    const auto r = read_reductions(reductions);
    const double lr = lr_.item<float>();
    std::vector<float> m_scales(n_), v_scales(n_);
    for (size_t i = 0; i < n_; ++i) {
      m_scales[i] = new_scale(r[4 * i + 2], kE4M3Max);
      v_scales[i] = new_scale(r[4 * i + 3], kE5M2Max);
      coeffs_[i].inv_m_scale = 1.f / m_scales[i];
      coeffs_[i].inv_v_scale = 1.f / v_scales[i];
      // r = clamp((||p|| / ||u|| * 1e-3 / lr) ^ trust_scale, 0, 2); 1 when a norm is 0.
      const double p_norm = std::sqrt(r[4 * i]), u_norm = std::sqrt(r[4 * i + 1]);
      double ratio = 1.0;
      if (p_norm > 0 && u_norm > 0) ratio = std::min(std::pow(p_norm / u_norm * 1e-3 / lr, trust_scale_), 2.0);
      coeffs_[i].step_size = float(lr * ratio);
    }
    kernels().pass2(args_);
    rows_.commit(true, {0, 1}, has_master_ ? 2 : -1);
    for (size_t i = 0; i < n_; ++i) {
      m_scales_[i].fill_(m_scales[i]);
      v_scales_[i].fill_(v_scales[i]);
    }
  }

 private:
  static const Lamb16Kernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb16_kernels); }

  const char* op_;
  at::TensorList steps_, m_scales_, v_scales_;
  std::vector<StateList> lists_;
  bool skip_;
  TensorRows rows_;
  size_t n_;
  bool has_master_;
  double trust_scale_;
  at::Tensor lr_;
  std::vector<Lamb16Tensor> tensors_;
  std::vector<Lamb16Coeffs> coeffs_;
  std::vector<Chunk> chunks_;
  Lamb16Args args_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(Lamb16Step, lamb16_cpu, LAMB16, "lamb16_step_", "lamb16_reduce_", "lamb16_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
