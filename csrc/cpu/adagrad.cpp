// lamb::adagrad_step_ on CPU: exactly torch.optim.Adagrad (state `sum`), any strides.
#include <torch/library.h>

#include <cmath>

#include "cpu/adagrad.h"
#include "cpu/op_checks.h"
#include "cpu/engine.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(AdagradKernels, adagrad_kernels)

namespace {

void adagrad_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                      at::TensorList steps, const at::Tensor& lr, double lr_decay, double weight_decay,
                      double eps, bool maximize, const std::optional<at::Tensor>& grad_scale,
                      const std::optional<at::Tensor>& found_inf, std::optional<at::TensorList> master_params) {
  const size_t n = params.size();
  const bool has_master = master_params.has_value();
  const auto floats = check_adagrad_step("adagrad_step_", params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, grad_scale,
                                         found_inf, master_params, at::kCPU);
  if (found_inf_set(found_inf)) return;

  TensorRows rows(params, grads, floats);
  const double lr_value = lr.item<float>();
  const auto t = increment_steps(steps);
  std::vector<AdagradTensor> tensors(n);
  std::vector<float> clr(n);
  for (size_t i = 0; i < n; ++i) {
    clr[i] = float(lr_value / (1.0 + (t[i] - 1.0) * lr_decay));
    tensors[i] = {rows.param(i), rows.grad(i), rows.floats(i, 0), has_master ? rows.floats(i, 1) : nullptr,
                  rows.dtypes()[i]};
  }
  const auto chunks = make_chunks(rows.numels());
  const float grad_mul = (maximize ? -1.f : 1.f) * inv_grad_scale(grad_scale);
  const AdagradArgs args{tensors.data(), clr.data(), {chunks.data(), static_cast<int64_t>(chunks.size())},
                         float(weight_decay), float(eps), grad_mul};
  INDUCTOR_LAMB_KERNELS(adagrad_kernels).update(args);
  rows.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("adagrad_step_", &adagrad_step_cpu); }
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("adagrad_step_", &adagrad_step_cpu); }

}  // namespace inductor_lamb::cpu
