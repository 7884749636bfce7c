#pragma once
// The argument checks of every op, shared by the CPU glue (csrc/cpu/<opt>.cpp)
// and the CUDA glue (csrc/cuda/ops_cuda.cpp): one place says what valid input
// is. Each runs every check before anything is written and returns the op's
// per-element state lists (in TensorRows order).
#include "cpu/engine.h"

namespace inductor_lamb::cpu {

std::vector<StateList> check_lamb_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                       at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr,
                                       double beta1, double beta2, double eps, double weight_decay,
                                       double max_grad_norm, const std::optional<at::Tensor>& grad_scale,
                                       const std::optional<at::Tensor>& found_inf,
                                       const std::optional<at::TensorList>& master_params, const at::Device& device);

std::vector<StateList> check_lamb16_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                         at::TensorList exp_avg_sqs, at::TensorList exp_avg_scales,
                                         at::TensorList exp_avg_sq_scales, at::TensorList steps, const at::Tensor& lr,
                                         double beta1, double beta2, double eps, double weight_decay,
                                         double trust_scale, const std::optional<at::Tensor>& grad_scale,
                                         const std::optional<at::Tensor>& found_inf,
                                         const std::optional<at::TensorList>& master_params, const at::Device& device);

std::vector<StateList> check_lars_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                                       const at::Tensor& lr, double momentum, double lars_coeff, double eps,
                                       c10::ArrayRef<double> weight_decay, const c10::List<bool>& layer_adaptation,
                                       const std::optional<at::Tensor>& grad_scale,
                                       const std::optional<at::Tensor>& found_inf,
                                       const std::optional<at::TensorList>& master_params, const at::Device& device);

std::vector<StateList> check_adagrad_step(at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                                          at::TensorList steps, const at::Tensor& lr, double lr_decay,
                                          double weight_decay, double eps, const std::optional<at::Tensor>& grad_scale,
                                          const std::optional<at::Tensor>& found_inf,
                                          const std::optional<at::TensorList>& master_params,
                                          const at::Device& device);

// LARS per-param options given as one value for all or one per param (0 values: `if_empty`).
template <typename List, typename V>
V per_param(const List& values, size_t i, V if_empty) {
  if (values.size() == 0) return if_empty;
  return values.size() == 1 ? V(values[0]) : V(values[i]);
}

}  // namespace inductor_lamb::cpu
