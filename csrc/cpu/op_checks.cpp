#include "cpu/op_checks.h"

#include <cmath>

namespace inductor_lamb::cpu {

namespace {

constexpr double kInf = INFINITY;

// Lengths and per-index rows of params, grads, the state lists and the master params.
std::vector<StateList> check_rows(const ArgChecker& chk, at::TensorList params, at::TensorList grads,
                                  std::vector<StateList> lists, const OptList& master_params,
                                  const at::Device& device) {
  if (master_params.has_value()) lists.push_back({"master_params", *master_params});
  check_lists(chk, params, grads, lists, device);
  return lists;
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

std::vector<StateList> check_lamb_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                       at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr,
                                       const at::Tensor& beta1, const at::Tensor& beta2, double eps,
                                       double weight_decay, double max_grad_norm, const OptTensor& grad_scale,
                                       const OptTensor& found_inf, const OptList& master_params,
                                       const at::Device& device) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}}, master_params,
                          device);
  check_steps(chk, steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}, {"beta1", &beta1}, {"beta2", &beta2}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"eps", eps}, {"weight_decay", weight_decay}, {"max_grad_norm", max_grad_norm}});
  return lists;
}

std::vector<StateList> check_lamb16_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                         at::TensorList exp_avg_sqs, at::TensorList exp_avg_scales,
                                         at::TensorList exp_avg_sq_scales, at::TensorList steps, const at::Tensor& lr,
                                         const at::Tensor& beta1, const at::Tensor& beta2, double eps,
                                         double weight_decay, double trust_scale, const OptTensor& grad_scale,
                                         const OptTensor& found_inf, const OptList& master_params,
                                         const at::Device& device) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads,
                          {{"exp_avgs", exp_avgs, at::kFloat8_e4m3fn}, {"exp_avg_sqs", exp_avg_sqs, at::kFloat8_e5m2}},
                          master_params, device);
  check_scalars(chk, "exp_avg_scales", exp_avg_scales, params.size(), device);
  check_scalars(chk, "exp_avg_sq_scales", exp_avg_sq_scales, params.size(), device);
  check_steps(chk, steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}, {"beta1", &beta1}, {"beta2", &beta2}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"eps", eps}, {"weight_decay", weight_decay}, {"trust_scale", trust_scale}});
  return lists;
}

std::vector<StateList> check_lars_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                                       const at::Tensor& lr, const at::Tensor& momentum, double lars_coeff, double eps,
                                       double rescale_grad, c10::ArrayRef<double> weight_decay,
                                       const c10::List<bool>& layer_adaptation, const OptTensor& grad_scale,
                                       const OptTensor& found_inf, const OptList& master_params,
                                       const at::Device& device) {
  const ArgChecker chk(op);
  const size_t n = params.size();
  auto lists = check_rows(chk, params, grads, {{"momentum_buffers", momentum_buffers}}, master_params, device);
  check_tensors(chk, {{"lr", &lr}, {"momentum", &momentum}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"lars_coeff", lars_coeff}, {"eps", eps}});
  chk.in_range(rescale_grad, "rescale_grad", -kInf, kInf, false);
  TORCH_CHECK(weight_decay.size() == 1 || weight_decay.size() == n, op, ": weight_decay has ",
              weight_decay.size(), " values; expected 1 or one per param (", n, ")");
  for (size_t i = 0; i < weight_decay.size(); ++i)
    chk.in_range(weight_decay[i], ("weight_decay[" + std::to_string(i) + "]").c_str(), 0.0, kInf, false);
  TORCH_CHECK(layer_adaptation.size() <= 1 || layer_adaptation.size() == n, op, ": layer_adaptation has ",
              layer_adaptation.size(), " values; expected 0, 1 or one per param (", n, ")");
  return lists;
}

std::vector<StateList> check_adagrad_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                                          at::TensorList steps, const at::Tensor& lr, double lr_decay,
                                          double weight_decay, double eps, const OptTensor& grad_scale,
                                          const OptTensor& found_inf, const OptList& master_params,
                                          const at::Device& device) {
  const ArgChecker chk(op);
  auto lists = check_rows(chk, params, grads, {{"state_sums", state_sums}}, master_params, device);
  check_steps(chk, steps, params.size(), device);
  check_tensors(chk, {{"lr", &lr}}, grad_scale, found_inf, device);
  nonnegative(chk, {{"lr_decay", lr_decay}, {"weight_decay", weight_decay}, {"eps", eps}});
  return lists;
}

}  // namespace inductor_lamb::cpu
