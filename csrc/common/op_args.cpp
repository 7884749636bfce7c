#include "common/op_args.h"

#include <cmath>

namespace inductor_lamb {

void ArgChecker::same_length(const char* name, at::TensorList list, const char* ref_name, size_t n) const {
  TORCH_CHECK(list.size() == n, op_, ": ", name, " has ", list.size(), " tensors but ", ref_name, " has ", n);
}

void ArgChecker::dense_on(const at::Tensor& t, const char* name, size_t i, const at::Device& device) const {
  TORCH_CHECK(t.defined(), op_, ": ", name, "[", i, "] is undefined");
  TORCH_CHECK(t.layout() == at::kStrided, op_, ": ", name, "[", i, "] has layout ", t.layout(),
              "; only dense (strided) tensors are supported (sparse gradients are not)");
  TORCH_CHECK(t.device() == device, op_, ": ", name, "[", i, "] is on ", t.device(), " but expected ", device);
}

void ArgChecker::same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                            size_t i) const {
  TORCH_CHECK(t.sizes() == ref.sizes(), op_, ": ", name, "[", i, "] has shape ", t.sizes(), " but ", ref_name, "[",
              i, "] has shape ", ref.sizes());
}

void ArgChecker::dtype_is(const at::Tensor& t, const char* name, size_t i, at::ScalarType expected) const {
  TORCH_CHECK(t.scalar_type() == expected, op_, ": ", name, "[", i, "] has dtype ", t.scalar_type(), ", expected ",
              expected);
}

void ArgChecker::param_dtype(const at::Tensor& t, const char* name, size_t i) const {
  auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, op_, ": ", name, "[", i, "] has dtype ", s,
              "; supported: float32, bfloat16, float16");
}

void ArgChecker::scalar_tensor(const at::Tensor& t, const char* name, int64_t i, const at::Device& device) const {
  std::string where = i < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(i) + "]";
  TORCH_CHECK(t.defined(), op_, ": ", where, " is undefined");
  TORCH_CHECK(t.dim() == 0, op_, ": ", where, " must be a 0-d tensor, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, op_, ": ", where, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, op_, ": ", where, " is on ", t.device(), " but expected ", device);
}

void ArgChecker::optional_scalar(const std::optional<at::Tensor>& t, const char* name,
                                 const at::Device& device) const {
  if (!t.has_value() || !t->defined()) return;
  TORCH_CHECK(t->numel() == 1, op_, ": ", name, " must have one element, got shape ", t->sizes());
  TORCH_CHECK(t->scalar_type() == at::kFloat, op_, ": ", name, " must be float32, got ", t->scalar_type());
  TORCH_CHECK(t->device() == device, op_, ": ", name, " is on ", t->device(), " but expected ", device);
}

void ArgChecker::in_range(double v, const char* name, double lo, double hi, bool hi_open) const {
  bool ok = v >= lo && (hi_open ? v < hi : v <= hi);
  TORCH_CHECK(ok, op_, ": invalid ", name, " ", v, ", expected a value in [", lo, ", ", hi, hi_open ? ")" : "]");
}

void check_reductions(const char* op, const at::Tensor& reductions, int64_t n, int64_t k, const at::Device& device) {
  TORCH_CHECK(reductions.defined(), op, ": reductions is undefined");
  TORCH_CHECK(reductions.layout() == at::kStrided && reductions.dim() == 2 && reductions.size(0) == n &&
                  reductions.size(1) == k,
              op, ": reductions must have shape [", n, ", ", k, "] (params x partial reductions), got ",
              reductions.sizes());
  TORCH_CHECK(reductions.scalar_type() == at::kFloat, op, ": reductions must be float32, got ",
              reductions.scalar_type());
  TORCH_CHECK(reductions.device() == device, op, ": reductions is on ", reductions.device(), " but expected ", device);
}

lars::Options lars_options(c10::ArrayRef<double> weight_decay, const c10::List<bool>& layer_adaptation, size_t i) {
  const double wd = weight_decay.size() == 0 ? 0.0 : weight_decay[weight_decay.size() == 1 ? 0 : i];
  const bool adapt = layer_adaptation.size() == 0 ? true : bool(layer_adaptation[layer_adaptation.size() == 1 ? 0 : i]);
  return {wd, adapt};
}

namespace {

constexpr double kInf = INFINITY;
using OptTensor = std::optional<at::Tensor>;
using OptList = std::optional<at::TensorList>;

// Lengths and per-index rows of params (float32/bf16/f16 on `device`), grads (like
// their param) and the state lists + master params (like their param, in their dtype).
std::vector<StateList> check_rows(const ArgChecker& chk, at::TensorList params, at::TensorList grads,
                                  std::vector<StateList> lists, const OptList& master_params,
                                  const at::Device& device) {
  if (master_params.has_value()) lists.push_back({"master_params", *master_params});
  const size_t n = params.size();
  chk.same_length("grads", grads, "params", n);
  for (const auto& l : lists) chk.same_length(l.name, l.tensors, "params", n);
  for (size_t i = 0; i < n; ++i) {
    chk.dense_on(params[i], "params", i, device);
    chk.param_dtype(params[i], "params", i);
    chk.dense_on(grads[i], "grads", i, params[i].device());
    chk.same_shape(grads[i], "grads", params[i], "params", i);
    chk.dtype_is(grads[i], "grads", i, params[i].scalar_type());
    for (const auto& l : lists) {
      chk.dense_on(l.tensors[i], l.name, i, params[i].device());
      chk.same_shape(l.tensors[i], l.name, params[i], "params", i);
      chk.dtype_is(l.tensors[i], l.name, i, l.dtype);
    }
  }
  return lists;
}

// A per-param list of 0-d float32 tensors (steps, LAMB16's scales).
void check_scalars(const ArgChecker& chk, const char* name, at::TensorList list, size_t n, const at::Device& device) {
  chk.same_length(name, list, "params", n);
  for (size_t i = 0; i < n; ++i) chk.scalar_tensor(list[i], name, i, device);
}

// The scheduled 0-d tensors (lr first), then grad_scale / found_inf.
void check_tensors(const ArgChecker& chk, std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors,
                   const OptTensor& grad_scale, const OptTensor& found_inf, const at::Device& device) {
  for (const auto& [name, t] : tensors) chk.scalar_tensor(*t, name, -1, device);
  chk.optional_scalar(grad_scale, "grad_scale", device);
  chk.optional_scalar(found_inf, "found_inf", device);
}

void nonnegative(const ArgChecker& chk, std::initializer_list<std::pair<const char*, double>> values) {
  for (const auto& [name, v] : values) chk.in_range(v, name, 0.0, kInf, false);
}

}  // namespace

Checked<lamb::Hyper> check_lamb(const char* op, const at::Device& device, LAMB_LISTS, LAMB_HYPERS) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}}, master_params,
                          device);
  check_scalars(chk, "steps", steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}, {"beta1", &beta1_t}, {"beta2", &beta2_t}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"eps", eps}, {"weight_decay", weight_decay}, {"max_grad_norm", max_grad_norm}});
  return {std::move(lists),
          {beta1_t.data_ptr<float>(), beta2_t.data_ptr<float>(), eps, weight_decay, max_grad_norm, bias_correction,
           grad_averaging, always_adapt, trust_clip}};
}

Checked<lamb16::Hyper> check_lamb16(const char* op, const at::Device& device, LAMB16_LISTS, LAMB16_HYPERS) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads,
                          {{"exp_avgs", exp_avgs, at::kFloat8_e4m3fn}, {"exp_avg_sqs", exp_avg_sqs, at::kFloat8_e5m2}},
                          master_params, device);
  check_scalars(chk, "exp_avg_scales", exp_avg_scales, params.size(), device);
  check_scalars(chk, "exp_avg_sq_scales", exp_avg_sq_scales, params.size(), device);
  check_scalars(chk, "steps", steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}, {"beta1", &beta1_t}, {"beta2", &beta2_t}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"eps", eps}, {"weight_decay", weight_decay}, {"trust_scale", trust_scale}});
  return {std::move(lists),
          {beta1_t.data_ptr<float>(), beta2_t.data_ptr<float>(), eps, weight_decay, trust_scale, stochastic_rounding,
           seed}};
}

Checked<lars::Hyper> check_lars(const char* op, const at::Device& device, LARS_LISTS, LARS_HYPERS) {
  const ArgChecker chk(op);
  const size_t n = params.size();
  auto lists = check_rows(chk, params, grads, {{"momentum_buffers", momentum_buffers}}, master_params, device);
  check_tensors(chk, {{"lr", &lr}, {"momentum", &momentum_t}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"lars_coeff", lars_coeff}, {"eps", eps}});
  chk.in_range(rescale_grad, "rescale_grad", -kInf, kInf, false);
  TORCH_CHECK(weight_decay.size() == 1 || weight_decay.size() == n, op, ": weight_decay has ",
              weight_decay.size(), " values; expected 1 or one per param (", n, ")");
  for (size_t i = 0; i < weight_decay.size(); ++i)
    chk.in_range(weight_decay[i], ("weight_decay[" + std::to_string(i) + "]").c_str(), 0.0, kInf, false);
  TORCH_CHECK(layer_adaptation.size() <= 1 || layer_adaptation.size() == n, op, ": layer_adaptation has ",
              layer_adaptation.size(), " values; expected 0, 1 or one per param (", n, ")");
  return {std::move(lists), {momentum_t.data_ptr<float>(), lars_coeff, eps, rescale_grad}};
}

Checked<adagrad::Hyper> check_adagrad(const char* op, const at::Device& device, ADAGRAD_LISTS, ADAGRAD_HYPERS) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads, {{"state_sums", state_sums}}, master_params, device);
  check_scalars(chk, "steps", steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"lr_decay", lr_decay}, {"weight_decay", weight_decay}, {"eps", eps}});
  return {std::move(lists), {lr_decay, weight_decay, eps, maximize}};
}

}  // namespace inductor_lamb
