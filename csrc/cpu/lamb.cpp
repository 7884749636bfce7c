// lamb::lamb_step_ and its two phases on CPU: per-tensor scalars from
// common/lamb.h around the element loops of lamb_kernel.cpp. The one-call op
// runs exactly the reduce phase, then the apply phase (through the float32
// reductions tensor), so both forms give the same bits.
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/lamb.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LambKernels, lamb_kernels)

namespace {

class LambStep {
 public:
  LambStep(const char* op, LAMB_LISTS, LAMB_HYPERS)
      : c_(op, check_lamb(op, at::kCPU, LAMB_ARGS), params, grads, 2, master_params.has_value(), lr, grad_scale,
           found_inf),
        steps_(steps),
        coeffs_(c_.n),
        args_{c_.tensors.data(), coeffs_.data(), c_.chunk_span(), lamb::consts(c_.hyper), 1.f, nullptr} {}

  // Pass 1: steps += 1, m and v updated; returns [n, 2] float32 (||p||^2, ||u||^2).
  at::Tensor reduce() {
    if (c_.skip) return c_.reductions_out({}, lamb::kReductions);
    // g = grad / grad_scale / clip
    args_.grad_mul = float(grad_multiplier(c_.rows, c_.inv_grad_scale(), c_.hyper.max_grad_norm));
    increment_steps(steps_);
    bias_corrections();
    std::vector<double> partials(lamb::kReductions * c_.chunks.size());
    args_.partials = partials.data();
    kernels().pass1(args_);
    c_.commit(false, 0b11u);  // m, v
    return c_.reductions_out(reduce_per_tensor(c_.chunks, partials, lamb::kReductions, c_.n), lamb::kReductions);
  }

  // Pass 2 from the (all-reduced) reductions: p -= lr * r * u.
  void apply(const at::Tensor& reductions) {
    const auto sq = c_.reductions_in(reductions, lamb::kReductions);
    if (c_.skip) return;
    bias_corrections();  // of the steps the reduce phase incremented
    const double lr = c_.lr();
    for (size_t i = 0; i < c_.n; ++i) coeffs_[i].step_size = lamb::step_size(c_.hyper, lr, sq[2 * i], sq[2 * i + 1]);
    kernels().pass2(args_);
    c_.commit(true, 0u);
  }

 private:
  static const LambKernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb_kernels); }

  void bias_corrections() {
    const lamb::Hyper& h = c_.hyper;
    for (size_t i = 0; i < c_.n; ++i) {
      const double t = steps_[i].item<float>();
      coeffs_[i].inv_bc1 = lamb::inv_bias_correction(*h.beta1, t, h.bias_correction);
      coeffs_[i].inv_bc2 = lamb::inv_bias_correction(*h.beta2, t, h.bias_correction);
    }
  }

  CpuCall<lamb::Hyper> c_;
  at::TensorList steps_;
  std::vector<LambCoeffs> coeffs_;
  LambArgs args_;
};

INDUCTOR_LAMB_CPU_PHASE_OPS(LambStep, lamb_cpu, LAMB, "lamb_step_", "lamb_reduce_", "lamb_apply_")

}  // namespace

}  // namespace inductor_lamb::cpu
