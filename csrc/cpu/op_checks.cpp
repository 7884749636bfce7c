#include "cpu/op_checks.h"

#include <cmath>

namespace inductor_lamb::cpu {

namespace {

// params, grads and the per-element state lists (+ master params), then lr, grad_scale, found_inf.
std::vector<StateList> check_rows(const ArgChecker& chk, at::TensorList params, at::TensorList grads,
                                  std::vector<StateList> lists, const std::optional<at::TensorList>& master_params,
                                  const at::Tensor& lr, const std::optional<at::Tensor>& grad_scale,
                                  const std::optional<at::Tensor>& found_inf, const at::Device& device) {
  if (master_params.has_value()) lists.push_back({"master_params", *master_params});
  check_lists(chk, params, grads, lists, device);
  chk.step_scalars(lr, grad_scale, found_inf, device);
  return lists;
}

void check_betas_eps_decay(const ArgChecker& chk, double beta1, double beta2, double eps, double weight_decay) {
  chk.in_range(beta1, "beta1", 0.0, 1.0, true);
  chk.in_range(beta2, "beta2", 0.0, 1.0, true);
  chk.in_range(eps, "eps", 0.0, INFINITY, false);
  chk.in_range(weight_decay, "weight_decay", 0.0, INFINITY, false);
}

}  // namespace

std::vector<StateList> check_lamb_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                       at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr,
                                       double beta1, double beta2, double eps, double weight_decay,
                                       double max_grad_norm, const std::optional<at::Tensor>& grad_scale,
                                       const std::optional<at::Tensor>& found_inf,
                                       const std::optional<at::TensorList>& master_params, const at::Device& device) {
  const ArgChecker chk("lamb_step_");
  auto lists = check_rows(chk, params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}}, master_params,
                          lr, grad_scale, found_inf, device);
  check_steps(chk, steps, params.size(), device);
  check_betas_eps_decay(chk, beta1, beta2, eps, weight_decay);
  chk.in_range(max_grad_norm, "max_grad_norm", 0.0, INFINITY, false);
  return lists;
}

std::vector<StateList> check_lamb16_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                         at::TensorList exp_avg_sqs, at::TensorList exp_avg_scales,
                                         at::TensorList exp_avg_sq_scales, at::TensorList steps, const at::Tensor& lr,
                                         double beta1, double beta2, double eps, double weight_decay,
                                         double trust_scale, const std::optional<at::Tensor>& grad_scale,
                                         const std::optional<at::Tensor>& found_inf,
                                         const std::optional<at::TensorList>& master_params, const at::Device& device) {
  const ArgChecker chk("lamb16_step_");
  auto lists = check_rows(chk, params, grads,
                          {{"exp_avgs", exp_avgs, at::kFloat8_e4m3fn}, {"exp_avg_sqs", exp_avg_sqs, at::kFloat8_e5m2}},
                          master_params, lr, grad_scale, found_inf, device);
  check_scalars(chk, "exp_avg_scales", exp_avg_scales, params.size(), device);
  check_scalars(chk, "exp_avg_sq_scales", exp_avg_sq_scales, params.size(), device);
  check_steps(chk, steps, params.size(), device);
  check_betas_eps_decay(chk, beta1, beta2, eps, weight_decay);
  chk.in_range(trust_scale, "trust_scale", 0.0, INFINITY, false);
  return lists;
}

std::vector<StateList> check_lars_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                                       const at::Tensor& lr, double momentum, double lars_coeff, double eps,
                                       c10::ArrayRef<double> weight_decay, const c10::List<bool>& layer_adaptation,
                                       const std::optional<at::Tensor>& grad_scale,
                                       const std::optional<at::Tensor>& found_inf,
                                       const std::optional<at::TensorList>& master_params, const at::Device& device) {
  const ArgChecker chk("lars_step_");
  const size_t n = params.size();
  auto lists = check_rows(chk, params, grads, {{"momentum_buffers", momentum_buffers}}, master_params, lr,
                          grad_scale, found_inf, device);
  TORCH_CHECK(weight_decay.size() == 1 || weight_decay.size() == n, "lars_step_: weight_decay has ",
              weight_decay.size(), " values; expected 1 or one per param (", n, ")");
  for (size_t i = 0; i < weight_decay.size(); ++i)
    TORCH_CHECK(weight_decay[i] >= 0, "lars_step_: weight_decay[", i, "] is ", weight_decay[i], ", expected >= 0");
  TORCH_CHECK(layer_adaptation.size() <= 1 || layer_adaptation.size() == n, "lars_step_: layer_adaptation has ",
              layer_adaptation.size(), " values; expected 0, 1 or one per param (", n, ")");
  chk.in_range(momentum, "momentum", 0.0, INFINITY, false);
  chk.in_range(lars_coeff, "lars_coeff", 0.0, INFINITY, false);
  chk.in_range(eps, "eps", 0.0, INFINITY, false);
  return lists;
}

std::vector<StateList> check_adagrad_step(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                                          at::TensorList steps, const at::Tensor& lr, double lr_decay,
                                          double weight_decay, double eps, const std::optional<at::Tensor>& grad_scale,
                                          const std::optional<at::Tensor>& found_inf,
                                          const std::optional<at::TensorList>& master_params,
                                          const at::Device& device) {
  const ArgChecker chk("adagrad_step_");
  auto lists = check_rows(chk, params, grads, {{"state_sums", state_sums}}, master_params, lr, grad_scale, found_inf,
                          device);
  check_steps(chk, steps, params.size(), device);
  chk.in_range(lr_decay, "lr_decay", 0.0, INFINITY, false);
  chk.in_range(weight_decay, "weight_decay", 0.0, INFINITY, false);
  chk.in_range(eps, "eps", 0.0, INFINITY, false);
  return lists;
}

}  // namespace inductor_lamb::cpu
