// lamb::adagrad_step_ on CPU: exactly torch.optim.Adagrad (state `sum`), any
// strides; per-tensor lr from common/adagrad.h around adagrad_kernel.cpp.
#include <torch/library.h>

#include "cpu/adagrad.h"
#include "cpu/engine.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(AdagradKernels, adagrad_kernels)

namespace {

void adagrad_step_cpu(ADAGRAD_LISTS, ADAGRAD_HYPERS) {
  CpuCall<adagrad::Hyper> c("adagrad_step_", check_adagrad("adagrad_step_", at::kCPU, ADAGRAD_ARGS), params, grads, 1,
                            master_params.has_value(), lr, grad_scale, found_inf);
  if (c.skip) return;
  const double lr_value = c.lr();
  const auto t = increment_steps(steps);
  std::vector<float> clr(c.n);
  for (size_t i = 0; i < c.n; ++i) clr[i] = adagrad::clr(lr_value, t[i], c.hyper.lr_decay);
  const AdagradArgs args{c.tensors.data(), clr.data(), c.chunk_span(), c.hyper,
                         adagrad::grad_mul(c.hyper, c.inv_grad_scale())};
  INDUCTOR_LAMB_KERNELS(adagrad_kernels).update(args);
  c.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("adagrad_step_", &adagrad_step_cpu); }
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("adagrad_step_", &adagrad_step_cpu); }

}  // namespace inductor_lamb::cpu
