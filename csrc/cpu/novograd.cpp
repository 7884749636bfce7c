// lamb::novograd_step_ and its two phases on CPU (common/novograd.h): layer grad norms from the
// engine (reduce), per-tensor second moments and grad multipliers from common/novograd.h and one
// update pass (apply). The one-call op runs both a block of tensors at a time (TwoPhaseStep,
// engine.h).
#include <torch/library.h>

#include "cpu/engine.h"
#include "cpu/novograd.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(NovogradKernels, novograd_kernels)

namespace {

class NovogradStep : public TwoPhaseStep<NovogradStep, novograd::Hyper> {
 public:
  explicit NovogradStep(const OpArgs& a)
      : TwoPhaseStep({a, 1, &novograd::hyper_of<OpArgs>}, novograd::kReductions, 4),
        steps_(a.list("steps")),
        v_(a.list("exp_avg_sqs")),
        v_max_(a.list("max_exp_avg_sqs")),
        coeffs_(c_.n),
        g_ptrs_(c_.n) {
    for (size_t i = 0; i < c_.n; ++i) g_ptrs_[i] = c_.tensors[i].grad;
  }

  void begin(bool reduce, bool apply) {
    if (reduce) increment_steps(steps_);  // (as the CUDA engine's reduce does)
    inv_scale_ = c_.inv_grad_scale();  // (read here: the blocks may run on worker threads)
    if (apply) {
      lr_ = c_.lr();
      c_.param_keys(&steps_);
    }
  }

  // Layer grad norms (one read, 4 bytes/param; nothing written): per tensor ||g / grad_scale||^2.
  void reduce_block(const Block& b, double* out, const BlockPass&) {
    std::vector<double> partials(b.c1 - b.c0);
    const SumSqArgs args{g_ptrs_.data(), c_.rows.dtypes().data(), c_.chunk_span(b), inv_scale_,
                         partials.data()};
    INDUCTOR_LAMB_KERNELS(engine_kernels).sumsq(args);
    reduce_per_tensor(c_.chunks, b, partials.data(), 1, out);
  }

  // The second moments from the reductions (written: each is read once, here), then one update pass.
  void apply_block(const Block& b, const double* g_sq, const BlockPass& pass) {
    const float inv_scale = inv_scale_;
    for (int64_t i = b.t0; i < b.t1; ++i) {
      float* v = v_[i].data_ptr<float>();
      float* v_max = v_max_[i].data_ptr<float>();
      const novograd::Moments m = novograd::moments(c_.hyper, *v, *v_max, g_sq[i - b.t0]);
      *v = m.v;
      *v_max = m.v_max;
      coeffs_[i] = {novograd::grad_mul(c_.hyper, m, inv_scale)};
    }
    const NovogradArgs args{c_.tensors.data(), coeffs_.data(), c_.chunk_span(b, pass.backward), &c_.hyper, float(lr_),
                            novograd::keep(c_.hyper, lr_)};
    INDUCTOR_LAMB_KERNELS(novograd_kernels).update(args);
  }

  void end(bool, bool apply) {
    if (apply) c_.commit(true, 0b1u);
  }

 private:
  at::TensorList steps_, v_, v_max_;
  std::vector<NovogradCoeffs> coeffs_;
  std::vector<const void*> g_ptrs_;
  double lr_ = 0.0;
  float inv_scale_ = 1.f;  // 1 / grad_scale, read in begin
};

INDUCTOR_LAMB_CPU_OPS(NovogradStep, "novograd_step_")

}  // namespace

}  // namespace inductor_lamb::cpu
