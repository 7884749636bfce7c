// lamb::lamb16_step_ and its two phases on CPU: per-tensor scales and trust
// ratios from common/lamb16.h around the element loops of lamb16_kernel.cpp.
// The one-call op runs both a block of tensors at a time (TwoPhaseStep, engine.h), pass 1
// stashing the updates and the new float32 moments that pass 2 applies and encodes (no float8
// decoding, moments, square root or division in pass 2), with the same bits as the two-phase form.
#include <torch/library.h>

#include "cpu/engine.h"
#include "common/rounding.h"
#include "cpu/lamb16.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(Lamb16Kernels, lamb16_kernels)

namespace {

class Lamb16Step : public TwoPhaseStep<Lamb16Step, lamb16::Hyper> {
 public:
  explicit Lamb16Step(const OpArgs& a)
      : TwoPhaseStep({a, 2, &lamb16::hyper_of<OpArgs>}, lamb16::kReductions, 10, /*stash_planes=*/3,
                     /*per_thread_blocks=*/true),
        steps_(a.list("steps")),
        m_scales_(a.list("exp_avg_scales")),
        v_scales_(a.list("exp_avg_sq_scales")),
        coeffs_(c_.n),
        new_m_scales_(c_.n),
        new_v_scales_(c_.n),
        args_{c_.tensors.data(), coeffs_.data(), c_.chunk_span(), lamb16::consts(c_.hyper), c_.inv_grad_scale(),
              c_.hyper.stochastic_rounding, nullptr, nullptr, {}} {
    for (size_t i = 0; i < c_.n; ++i) {  // the scales of the start of the step (apply overwrites them last)
      coeffs_[i].beta1_scale = lamb16::beta_scale(c_.hyper.beta1, m_scales_[i].item<float>());
      coeffs_[i].beta2_scale = lamb16::beta_scale(c_.hyper.beta2, v_scales_[i].item<float>());
    }
  }

  void begin(bool reduce, bool apply) {
    if (reduce) increment_steps(steps_);  // no bias correction in LAMB16; steps count like torch.optim's
    if (apply) {
      lr_ = c_.lr();
      c_.param_keys(&steps_);
      if (c_.hyper.stochastic_rounding)  // this step's count (reduce incremented it)
        for (size_t i = 0; i < c_.n; ++i)
          coeffs_[i].round_key = rounding::tensor_key(c_.hyper.seed, steps_[i].item<float>());
    }
  }

  // Pass 1 (writes nothing but the steps): per tensor ||p||^2, ||u||^2, max |m|, max v.
  void reduce_block(const Block& b, double* out, const BlockPass& pass) {
    const int64_t nc = b.c1 - b.c0, nt = b.t1 - b.t0;
    std::vector<double> sums(2 * nc), maxes(2 * nc), sq(2 * nt), amax(2 * nt);
    Lamb16Args args = args_;  // (a copy: threads may run blocks at once)
    args.sums = sums.data();
    args.maxes = maxes.data();
    args.chunks = c_.chunk_span(b, pass.backward);
    args.stash = pass.stash;
    kernels().pass1(args);
    reduce_per_tensor(c_.chunks, b, sums.data(), 2, sq.data());
    max_per_tensor(c_.chunks, b, maxes.data(), 2, amax.data());
    for (int64_t i = 0; i < nt; ++i)
      out[4 * i] = sq[2 * i], out[4 * i + 1] = sq[2 * i + 1], out[4 * i + 2] = amax[2 * i],
      out[4 * i + 3] = amax[2 * i + 1];
  }

  // Pass 2: trust ratios and new scales from the reductions; p, m8, v8 written.
  void apply_block(const Block& b, const double* r, const BlockPass& pass) {
    for (int64_t i = b.t0; i < b.t1; ++i) {
      const double* x = r + lamb16::kReductions * (i - b.t0);
      new_m_scales_[i] = lamb16::new_scale(x[2], lamb16::kE4M3Max);
      new_v_scales_[i] = lamb16::new_scale(x[3], lamb16::kE5M2Max);
      coeffs_[i].inv_m_scale = 1.f / new_m_scales_[i];
      coeffs_[i].inv_v_scale = 1.f / new_v_scales_[i];
      coeffs_[i].step_size = lamb16::step_size(c_.hyper, lr_, x[0], x[1]);
      coeffs_[i].finite = std::isfinite(x[3]) && lamb16::eps_allows_finite(args_.consts);
    }
    Lamb16Args args = args_;
    args.chunks = c_.chunk_span(b, pass.backward);
    args.stash = pass.stash;
    kernels().pass2(args);
  }

  // apply: p, m8, v8, then the scales (read by the constructor until here).
  void end(bool, bool apply) {
    if (!apply) return;
    c_.commit(true, 0b11u);
    for (size_t i = 0; i < c_.n; ++i) {
      m_scales_[i].fill_(new_m_scales_[i]);
      v_scales_[i].fill_(new_v_scales_[i]);
    }
  }

 private:
  static const Lamb16Kernels& kernels() { return INDUCTOR_LAMB_KERNELS(lamb16_kernels); }

  at::TensorList steps_, m_scales_, v_scales_;
  std::vector<Lamb16Coeffs> coeffs_;
  std::vector<float> new_m_scales_, new_v_scales_;
  Lamb16Args args_;
  double lr_ = 0.0;
};

INDUCTOR_LAMB_CPU_OPS(Lamb16Step, "lamb16_step_")

}  // namespace

}  // namespace inductor_lamb::cpu
