// lamb::lamb16_step_ and its two phases on CPU: per-tensor scales and trust
// ratios from common/lamb16.h around the element loops of lamb16_kernel.cpp.
// The one-call op is exactly reduce then apply (see lamb.cpp).
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/lamb16.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(Lamb16Kernels, lamb16_kernels)

namespace {

class Lamb16Step {
 public:
  Lamb16Step(const char* op, LAMB16_LISTS, LAMB16_HYPERS)
      : c_(op, check_lamb16(op, at::kCPU, LAMB16_ARGS), params, grads, 2, master_params.has_value(), lr,
           grad_scale, found_inf),
        steps_(steps),
        m_scales_(exp_avg_scales),
        v_scales_(exp_avg_sq_scales),
        coeffs_(c_.n),
        args_{c_.tensors.data(), coeffs_.data(), c_.chunk_span(), lamb16::consts(c_.hyper), c_.inv_grad_scale(),
              nullptr, nullptr} {
    for (size_t i = 0; i < c_.n; ++i) {  // the scales of the start of the step (apply overwrites them last)
      coeffs_[i].beta1_scale = lamb16::beta_scale(c_.hyper.beta1, m_scales_[i].item<float>());
      coeffs_[i].beta2_scale = lamb16::beta_scale(c_.hyper.beta2, v_scales_[i].item<float>());
    }
  }

  // Pass 1 (writes nothing but the steps): [n, 4] float32 reductions.
  at::Tensor reduce() {
    if (c_.skip) return c_.reductions_out({}, lamb16::kReductions);
    increment_steps(steps_);  // no bias correction in LAMB16; steps count like torch.optim's
    std::vector<double> sums(2 * c_.chunks.size()), maxes(2 * c_.chunks.size());
    args_.sums = sums.data();
    args_.maxes = maxes.data();
    kernels().pass1(args_);
    const auto sq = reduce_per_tensor(c_.chunks, sums, 2, c_.n);
    const auto amax = max_per_tensor(c_.chunks, maxes, 2, c_.n);
    std::vector<double> out(lamb16::kReductions * c_.n);
    for (size_t i = 0; i < c_.n; ++i) out[4 * i] = sq[2 * i], out[4 * i + 1] = sq[2 * i + 1],
                                      out[4 * i + 2] = amax[2 * i], out[4 * i + 3] = amax[2 * i + 1];
    return c_.reductions_out(out, lamb16::kReductions);
  }

  // Pass 2: trust ratios and new scales from the reductions; p, m8, v8, scales written.
  void apply(const at::Tensor& reductions) {
    const auto r = c_.reductions_in(reductions, lamb16::kReductions);
    if (c_.skip) return;
    const double lr = c_.lr();
    std::vector<float> m_scales(c_.n), v_scales(c_.n);
    for (size_t i = 0; i < c_.n; ++i) {
      m_scales[i] = lamb16::new_scale(r[4 * i + 2], lamb16::kE4M3Max);
      v_scales[i] = lamb16::new_scale(r[4 * i + 3], lamb16::kE5M2Max);
      coeffs_[i].inv_m_scale = 1.f / m_scales[i];
      coeffs_[i].inv_v_scale = 1.f / v_scales[i];
      coeffs_[i].step_size = lamb16::step_size(c_.hyper, lr, r[4 * i], r[4 * i + 1]);
    }
    kernels().pass2(args_);
    c_.commit(true, 0b11u);  // m8, v8
    for (size_t i = 0; i < c_.n; ++i) {
      m_scales_[i].fill_(m_scales[i]);
      v_scales_[i].fill_(v_scales[i]);
    }
  }

 private:
  static const Lamb16Kernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb16_kernels); }

  CpuCall<lamb16::Hyper> c_;
  at::TensorList steps_, m_scales_, v_scales_;
  std::vector<Lamb16Coeffs> coeffs_;
  Lamb16Args args_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(Lamb16Step, lamb16_cpu, LAMB16, "lamb16_step_", "lamb16_reduce_", "lamb16_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
