// lamb::lars_step_ on CPU (PaddlePaddle merged lars_momentum semantics): layer norms
// from the engine, per-tensor local learning rates, then one update pass.
#include <torch/library.h>

#include <cmath>

#include "cpu/engine.h"
#include "cpu/lars.h"
#include "cpu/op_checks.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LarsKernels, lars_kernels)

namespace {


void lars_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                   const at::Tensor& lr, const at::Tensor& momentum_t, double lars_coeff, double eps, double rescale_grad,
                   c10::ArrayRef<double> weight_decay, const c10::List<bool>& layer_adaptation,
                   const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                   std::optional<at::TensorList> master_params) {
  const size_t n = params.size();
  const bool has_master = master_params.has_value();
  const auto floats = check_lars_step(params, grads, momentum_buffers, lr, momentum_t, lars_coeff, eps, rescale_grad,
                                      weight_decay, layer_adaptation, grad_scale, found_inf, master_params, at::kCPU);
  if (found_inf_set(found_inf)) return;
  const double momentum = cpu_value(momentum_t);

  TensorRows rows(params, grads, floats);
  const double grad_mul = rescale_grad * inv_grad_scale(grad_scale);
  std::vector<const void*> p_ptrs(n), g_ptrs(n);
  std::vector<Dtype> p_dtypes = rows.dtypes();
  for (size_t i = 0; i < n; ++i) {
    p_ptrs[i] = has_master ? rows.floats(i, 1) : rows.param(i);
    if (has_master) p_dtypes[i] = Dtype::Float;
    g_ptrs[i] = rows.grad(i);
  }
  // Layer norms (two reads, 8 bytes/param), then one update pass.
  const auto p_sq = per_tensor_sumsq(p_ptrs, p_dtypes, rows.numels(), 1.f);
  const auto g_sq = per_tensor_sumsq(g_ptrs, rows.dtypes(), rows.numels(), float(grad_mul));

  const double lr_value = lr.item<float>();
  std::vector<LarsTensor> tensors(n);
  std::vector<LarsCoeffs> coeffs(n);
  for (size_t i = 0; i < n; ++i) {
    const double wd = per_param(weight_decay, i, 0.0);
    const bool adapt = per_param(layer_adaptation, i, true);
    const double p_norm = std::sqrt(p_sq[i]), g_norm = std::sqrt(g_sq[i]);
    double local_lr = lr_value;
    if (adapt && wd > 0 && p_norm > 0 && g_norm > 0)
      local_lr = lr_value * lars_coeff * p_norm / (g_norm + wd * p_norm + eps);
    coeffs[i] = {float(local_lr), float(wd)};
    tensors[i] = {rows.param(i), rows.grad(i), rows.floats(i, 0), has_master ? rows.floats(i, 1) : nullptr,
                  rows.dtypes()[i]};
  }
  const auto chunks = make_chunks(rows.numels());
  const LarsArgs args{tensors.data(), coeffs.data(), {chunks.data(), static_cast<int64_t>(chunks.size())},
                      float(momentum), float(grad_mul)};
  INDUCTOR_LAMB_KERNELS(lars_kernels).update(args);
  rows.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("lars_step_", &lars_step_cpu); }
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("lars_step_", &lars_step_cpu); }

}  // namespace inductor_lamb::cpu
