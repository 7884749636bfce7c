// lamb::lamb16_step_ on CPU: checks, per-tensor scales and trust ratios; the
// element loops are in lamb16_kernel.cpp, the shared machinery in engine.cpp.
#include <torch/library.h>

#include <cfloat>
#include <cmath>

#include "cpu/engine.h"
#include "cpu/lamb16.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(Lamb16Kernels, lamb16_kernels)

namespace {

// amax / fp8_max: the largest |value| maps to the largest finite float8, so a
// stored value never saturates and the bulk of a heavy-tailed tensor stays in the
// normal range (FLT_MIN floor: an all-zero tensor gets a finite, nonzero scale).
float new_scale(double amax, float fp8_max) { return std::max(float(amax) / fp8_max, FLT_MIN); }

void lamb16_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                     at::TensorList exp_avg_sqs, at::TensorList exp_avg_scales, at::TensorList exp_avg_sq_scales,
                     at::TensorList steps, const at::Tensor& lr, const at::Tensor& beta1_t,
                     const at::Tensor& beta2_t, double eps,
                     double weight_decay, double trust_scale, const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf, std::optional<at::TensorList> master_params) {
  const size_t n = params.size();
  const bool has_master = master_params.has_value();
  const auto states = check_lamb16_step(params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps,
                                        lr, beta1_t, beta2_t, eps, weight_decay, trust_scale, grad_scale, found_inf,
                                        master_params, at::kCPU);
  if (found_inf_set(found_inf)) return;
  const double beta1 = cpu_value(beta1_t), beta2 = cpu_value(beta2_t);

  TensorRows rows(params, grads, states);
  std::vector<Lamb16Tensor> tensors(n);
  std::vector<Lamb16Coeffs> coeffs(n);
  for (size_t i = 0; i < n; ++i) {
    tensors[i] = {rows.param(i), rows.grad(i), rows.state(i, 0), rows.state(i, 1),
                  has_master ? rows.floats(i, 2) : nullptr, rows.dtypes()[i]};
    coeffs[i].beta1_scale = float(beta1) * exp_avg_scales[i].item<float>();
    coeffs[i].beta2_scale = float(beta2) * exp_avg_sq_scales[i].item<float>();
  }
  increment_steps(steps);  // no bias correction in LAMB16; steps count like torch.optim's

  const auto chunks = make_chunks(rows.numels());
  std::vector<double> sums(2 * chunks.size()), maxes(2 * chunks.size());
  Lamb16Args args{tensors.data(),
                  coeffs.data(),
                  {chunks.data(), static_cast<int64_t>(chunks.size())},
                  float(1.0 - beta1),
                  float(1.0 - beta2),
                  float(eps),
                  float(weight_decay),
                  inv_grad_scale(grad_scale),
                  sums.data(),
                  maxes.data()};
  const Lamb16Kernels& kernels = INDUCTOR_LAMB_KERNELS(lamb16_kernels);
  kernels.pass1(args);

  const auto sq = reduce_per_tensor(chunks, sums, 2, n);
  const auto amax = max_per_tensor(chunks, maxes, 2, n);
  const double lr_value = lr.item<float>();
  std::vector<float> m_scales(n), v_scales(n);
  for (size_t i = 0; i < n; ++i) {
    m_scales[i] = new_scale(amax[2 * i], kE4M3Max);
    v_scales[i] = new_scale(amax[2 * i + 1], kE5M2Max);
    coeffs[i].inv_m_scale = 1.f / m_scales[i];
    coeffs[i].inv_v_scale = 1.f / v_scales[i];
    // r = clamp((||p|| / ||u|| * 1e-3 / lr) ^ trust_scale, 0, 2); 1 when a norm is 0.
    const double p_norm = std::sqrt(sq[2 * i]), u_norm = std::sqrt(sq[2 * i + 1]);
    double ratio = 1.0;
    if (p_norm > 0 && u_norm > 0) ratio = std::min(std::pow(p_norm / u_norm * 1e-3 / lr_value, trust_scale), 2.0);
    coeffs[i].step_size = float(lr_value * ratio);
  }
  kernels.pass2(args);
  rows.commit();
  for (size_t i = 0; i < n; ++i) {
    exp_avg_scales[i].fill_(m_scales[i]);
    exp_avg_sq_scales[i].fill_(v_scales[i]);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("lamb16_step_", &lamb16_step_cpu); }
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("lamb16_step_", &lamb16_step_cpu); }

}  // namespace inductor_lamb::cpu
