// lamb::lamb_step_ on CPU: checks, per-tensor scalars and trust ratios; the
// element loops are in lamb_kernel.cpp, the shared machinery in engine.cpp.
#include <torch/library.h>

#include <cmath>

#include "cpu/engine.h"
#include "cpu/lamb.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LambKernels, lamb_kernels)

namespace {

void lamb_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                   at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr,
                   const at::Tensor& beta1_t, const at::Tensor& beta2_t, double eps, double weight_decay, bool bias_correction, bool grad_averaging,
                   bool always_adapt, bool trust_clip, double max_grad_norm,
                   const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                   std::optional<at::TensorList> master_params) {
  const size_t n = params.size();
  const bool has_master = master_params.has_value();
  const auto floats = check_lamb_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1_t, beta2_t, eps,
                                      weight_decay, max_grad_norm, grad_scale, found_inf, master_params, at::kCPU);
  // Like torch's fused Adam under GradScaler: an overflow skips the whole step.
  if (found_inf_set(found_inf)) return;
  const double beta1 = cpu_value(beta1_t), beta2 = cpu_value(beta2_t);

  TensorRows rows(params, grads, floats);
  std::vector<LambTensor> tensors(n);
  for (size_t i = 0; i < n; ++i)
    tensors[i] = {rows.param(i), rows.grad(i), rows.floats(i, 0), rows.floats(i, 1),
                  has_master ? rows.floats(i, 2) : nullptr, rows.dtypes()[i]};
  // g = grad / grad_scale / clip
  const double grad_mul = grad_multiplier(rows, inv_grad_scale(grad_scale), max_grad_norm);

  std::vector<LambCoeffs> coeffs(n);
  const auto t = increment_steps(steps);
  for (size_t i = 0; i < n; ++i) {
    coeffs[i].inv_bc1 = bias_correction ? float(1.0 / (1.0 - std::pow(beta1, t[i]))) : 1.f;
    coeffs[i].inv_bc2 = bias_correction ? float(1.0 / (1.0 - std::pow(beta2, t[i]))) : 1.f;
  }

  const auto chunks = make_chunks(rows.numels());
  std::vector<double> partials(2 * chunks.size());
  LambArgs args{tensors.data(),
                coeffs.data(),
                {chunks.data(), static_cast<int64_t>(chunks.size())},
                float(beta1),
                float(beta2),
                grad_averaging ? float(1.0 - beta1) : 1.f,
                float(eps),
                float(weight_decay),
                float(grad_mul),
                partials.data()};
  const LambKernels& kernels = INDUCTOR_LAMB_KERNELS(lamb_kernels);
  kernels.pass1(args);

  // Trust ratio r = ||p|| / ||u|| per tensor (1 when either norm is 0 or adaptation is off).
  const auto sq = reduce_per_tensor(chunks, partials, 2, n);
  const float lr_value = lr.item<float>();
  const bool adapt = weight_decay != 0 || always_adapt;
  for (size_t i = 0; i < n; ++i) {
    const double p_norm = std::sqrt(sq[2 * i]), u_norm = std::sqrt(sq[2 * i + 1]);
    double ratio = adapt && p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
    if (trust_clip) ratio = std::min(ratio, 1.0);
    coeffs[i].step_size = float(lr_value * ratio);
  }
  kernels.pass2(args);
  rows.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("lamb_step_", &lamb_step_cpu); }
// A sparse grad routes the call here: the checks then name it ("grads[i] has layout Sparse").
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("lamb_step_", &lamb_step_cpu); }

}  // namespace inductor_lamb::cpu
