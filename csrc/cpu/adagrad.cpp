// lamb::adagrad_step_ on CPU: exactly torch.optim.Adagrad (state `sum`), any
// strides; per-tensor lr from common/adagrad.h around adagrad_kernel.cpp.
#include <torch/library.h>

#include "cpu/adagrad.h"
#include "cpu/engine.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(AdagradKernels, adagrad_kernels)

namespace {

struct AdagradStep {
  explicit AdagradStep(const OpArgs& a) : c(a, 1, &adagrad::hyper_of<OpArgs>), steps(a.list("steps")) {}

  void step() {
    if (c.skip) return;
    const double lr_value = c.lr();
    const auto t = increment_steps(steps);
    c.param_keys(&steps);
    std::vector<float> clr(c.n);
    for (size_t i = 0; i < c.n; ++i) clr[i] = adagrad::clr(lr_value, t[i], c.hyper.lr_decay);
    const AdagradArgs args{c.tensors.data(), clr.data(), c.chunk_span(), c.hyper,
                           adagrad::grad_mul(c.hyper, c.inv_grad_scale())};
    INDUCTOR_LAMB_KERNELS(adagrad_kernels).update(args);
    c.commit();
  }

  CpuCall<adagrad::Hyper> c;
  at::TensorList steps;
};

INDUCTOR_LAMB_CPU_OPS(AdagradStep, "adagrad_step_")

}  // namespace

}  // namespace inductor_lamb::cpu
