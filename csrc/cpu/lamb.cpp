// lamb::lamb_step_ on CPU: checks, per-tensor scalars and trust ratios; the
// element loops are in lamb_kernel.cpp, the shared machinery in engine.cpp.
#include <torch/library.h>

#include <cmath>

#include "cpu/engine.h"
#include "cpu/lamb.h"

namespace inductor_lamb::cpu {

INDUCTOR_LAMB_DECLARE_KERNELS(LambKernels, lamb_kernels)

namespace {

void lamb_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                   at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr, double beta1,
                   double beta2, double eps, double weight_decay, bool bias_correction, bool grad_averaging,
                   bool always_adapt, bool trust_clip, double max_grad_norm,
                   const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                   std::optional<at::TensorList> master_params) {
  const ArgChecker chk("lamb_step_");
  const size_t n = params.size();
  const bool has_master = master_params.has_value();
  chk.same_length("grads", grads, "params", n);
  chk.same_length("exp_avgs", exp_avgs, "params", n);
  chk.same_length("exp_avg_sqs", exp_avg_sqs, "params", n);
  chk.same_length("steps", steps, "params", n);
  if (has_master) chk.same_length("master_params", *master_params, "params", n);
  const at::Device cpu(at::kCPU);
  chk.scalar_tensor(lr, "lr", -1, cpu);
  chk.optional_scalar(grad_scale, "grad_scale", cpu);
  chk.optional_scalar(found_inf, "found_inf", cpu);
  chk.in_range(beta1, "beta1", 0.0, 1.0, true);
  chk.in_range(beta2, "beta2", 0.0, 1.0, true);
  chk.in_range(eps, "eps", 0.0, INFINITY, false);
  chk.in_range(weight_decay, "weight_decay", 0.0, INFINITY, false);
  chk.in_range(max_grad_norm, "max_grad_norm", 0.0, INFINITY, false);
  for (size_t i = 0; i < n; ++i) {
    chk.dense_on(params[i], "params", i, cpu);
    chk.param_dtype(params[i], "params", i);
    chk.grad_like(grads[i], "grads", i, params[i]);
    chk.float_like(exp_avgs[i], "exp_avgs", i, params[i]);
    chk.float_like(exp_avg_sqs[i], "exp_avg_sqs", i, params[i]);
    chk.scalar_tensor(steps[i], "steps", i, cpu);
    if (has_master) chk.float_like((*master_params)[i], "master_params", i, params[i]);
  }
  // Like torch's fused Adam under GradScaler: an overflow skips the whole step.
  if (found_inf_set(found_inf)) return;

  std::vector<LayoutRow> rows;
  std::vector<LambTensor> tensors(n);
  std::vector<int64_t> numels(n);
  std::vector<const void*> grad_ptrs(n);
  std::vector<Dtype> dtypes(n);
  rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> row{params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]};
    std::vector<bool> mutated{true, false, true, true};
    if (has_master) {
      row.push_back((*master_params)[i]);
      mutated.push_back(true);
    }
    rows.emplace_back(std::move(row), std::move(mutated));
    const LayoutRow& r = rows.back();
    dtypes[i] = to_dtype(params[i].scalar_type());
    tensors[i] = {r.ptr(0), r.ptr(1), static_cast<float*>(r.ptr(2)), static_cast<float*>(r.ptr(3)),
                  has_master ? static_cast<float*>(r.ptr(4)) : nullptr, dtypes[i]};
    numels[i] = params[i].numel();
    grad_ptrs[i] = tensors[i].grad;
  }

  // g = grad / grad_scale / clip, clip = max(1, ||g / grad_scale|| / max_grad_norm).
  const float inv_scale = inv_grad_scale(grad_scale);
  double grad_mul = inv_scale;
  if (max_grad_norm > 0) {
    const double norm = std::sqrt(global_sumsq(grad_ptrs, dtypes, numels, inv_scale));
    if (norm > max_grad_norm) grad_mul = inv_scale / (norm / max_grad_norm);
  }

  std::vector<LambCoeffs> coeffs(n);
  for (size_t i = 0; i < n; ++i) {
    float* step = steps[i].data_ptr<float>();
    *step += 1.f;
    const double t = *step;
    coeffs[i].inv_bc1 = bias_correction ? float(1.0 / (1.0 - std::pow(beta1, t))) : 1.f;
    coeffs[i].inv_bc2 = bias_correction ? float(1.0 / (1.0 - std::pow(beta2, t))) : 1.f;
  }

  const auto chunks = make_chunks(numels);
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
  for (auto& r : rows) r.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CPU, m) { m.impl("lamb_step_", &lamb_step_cpu); }
// A sparse grad routes the call here: the checks then name it ("grads[i] has layout Sparse").
TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { m.impl("lamb_step_", &lamb_step_cpu); }

}  // namespace inductor_lamb::cpu
