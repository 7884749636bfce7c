#pragma once
// The argument checks of every op, shared by the CPU glue (csrc/cpu/<opt>.cpp)
// and the CUDA glue (csrc/cuda/ops_cuda.cpp): one place says what valid input
// is. Each runs every check (naming `op`, the step op or one of its phases) before anything is written and returns the op's
// per-element state lists (in TensorRows order).
//
// Order and messages are mirrored by inductor_lamb/spec.py::check (the trace-time
// checks of every compile path): list lengths, then per index the param, grad
// and state rows, then the per-tensor scalar lists, the scheduled tensor
// hyper-parameters (lr, betas, momentum), grad_scale / found_inf, and last the
// float hyper-parameters in schema order. Scheduled tensors are data: their
// values are not range-checked (a compiled step could not check them at trace time).
#include "cpu/engine.h"

namespace inductor_lamb::cpu {

using OptTensor = std::optional<at::Tensor>;
using OptList = std::optional<at::TensorList>;

std::vector<StateList> check_lamb_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                       at::TensorList exp_avg_sqs, at::TensorList steps, const at::Tensor& lr,
                                       const at::Tensor& beta1, const at::Tensor& beta2, double eps,
                                       double weight_decay, double max_grad_norm, const OptTensor& grad_scale,
                                       const OptTensor& found_inf, const OptList& master_params,
                                       const at::Device& device);

std::vector<StateList> check_lamb16_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                                         at::TensorList exp_avg_sqs, at::TensorList exp_avg_scales,
                                         at::TensorList exp_avg_sq_scales, at::TensorList steps, const at::Tensor& lr,
                                         const at::Tensor& beta1, const at::Tensor& beta2, double eps,
                                         double weight_decay, double trust_scale, const OptTensor& grad_scale,
                                         const OptTensor& found_inf, const OptList& master_params,
                                         const at::Device& device);

std::vector<StateList> check_lars_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                                       const at::Tensor& lr, const at::Tensor& momentum, double lars_coeff, double eps,
                                       double rescale_grad, c10::ArrayRef<double> weight_decay,
                                       const c10::List<bool>& layer_adaptation, const OptTensor& grad_scale,
                                       const OptTensor& found_inf, const OptList& master_params,
                                       const at::Device& device);

std::vector<StateList> check_adagrad_step(const char* op, at::TensorList params, at::TensorList grads, at::TensorList state_sums,
                                          at::TensorList steps, const at::Tensor& lr, double lr_decay,
                                          double weight_decay, double eps, const OptTensor& grad_scale,
                                          const OptTensor& found_inf, const OptList& master_params,
                                          const at::Device& device);

// The C++ parameter lists of the layer-wise ops (one-call, reduce and apply
// share them; an apply op takes `const at::Tensor& reductions` between
// <OP>_LISTS and <OP>_HYPERS, as its schema does), for the CPU and CUDA glue.
#define LAMB_LISTS                                                                                        \
  at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,      \
      at::TensorList steps
#define LAMB_HYPERS                                                                                       \
  const at::Tensor &lr, const at::Tensor &beta1_t, const at::Tensor &beta2_t, double eps, double weight_decay, \
      bool bias_correction, bool grad_averaging, bool always_adapt, bool trust_clip, double max_grad_norm,     \
      const std::optional<at::Tensor>&grad_scale, const std::optional<at::Tensor>&found_inf,                  \
      std::optional<at::TensorList> master_params
#define LAMB_ARGS                                                                                          \
  params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1_t, beta2_t, eps, weight_decay, bias_correction,   \
      grad_averaging, always_adapt, trust_clip, max_grad_norm, grad_scale, found_inf, master_params
#define LAMB16_LISTS                                                                                        \
  at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,        \
      at::TensorList exp_avg_scales, at::TensorList exp_avg_sq_scales, at::TensorList steps
#define LAMB16_HYPERS                                                                                       \
  const at::Tensor &lr, const at::Tensor &beta1_t, const at::Tensor &beta2_t, double eps, double weight_decay, \
      double trust_scale, const std::optional<at::Tensor>&grad_scale, const std::optional<at::Tensor>&found_inf, \
      std::optional<at::TensorList> master_params
#define LAMB16_ARGS                                                                                          \
  params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps, lr, beta1_t, beta2_t, eps, \
      weight_decay, trust_scale, grad_scale, found_inf, master_params
#define LARS_LISTS at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers
#define LARS_HYPERS                                                                                           \
  const at::Tensor &lr, const at::Tensor &momentum_t, double lars_coeff, double eps, double rescale_grad,     \
      c10::ArrayRef<double> weight_decay, const c10::List<bool>&layer_adaptation,                              \
      const std::optional<at::Tensor>&grad_scale, const std::optional<at::Tensor>&found_inf,                  \
      std::optional<at::TensorList> master_params
#define LARS_ARGS                                                                                              \
  params, grads, momentum_buffers, lr, momentum_t, lars_coeff, eps, rescale_grad, weight_decay, layer_adaptation, \
      grad_scale, found_inf, master_params

// The entry points of a two-phase op on one device over its call class `Step`
// (Step(op, <args>) checks everything; reduce() -> reductions; apply(reductions)):
// the one-call op is reduce then apply on one checked call, so it gives the
// phases' bits. INDUCTOR_LAMB_PHASE_IMPLS registers them.
#define INDUCTOR_LAMB_PHASE_ENTRIES(Step, fn, lists, hypers, args, step_op, reduce_op, apply_op)      \
  void fn##_step(lists, hypers) {                                                                     \
    Step s(step_op, args);                                                                            \
    s.apply(s.reduce());                                                                              \
  }                                                                                                   \
  at::Tensor fn##_reduce(lists, hypers) { return Step(reduce_op, args).reduce(); }                    \
  void fn##_apply(lists, const at::Tensor& reductions, hypers) { Step(apply_op, args).apply(reductions); }
#define INDUCTOR_LAMB_PHASE_IMPLS(m, fn, step_op, reduce_op, apply_op) \
  m.impl(step_op, &fn##_step);                                         \
  m.impl(reduce_op, &fn##_reduce);                                     \
  m.impl(apply_op, &fn##_apply)

// The CPU entry points and registrations (CPU, and SparseCPU so that a sparse
// grad reaches the checks that name it) of a two-phase op whose parameter
// macros are P_LISTS, P_HYPERS, P_ARGS.
#define INDUCTOR_LAMB_CPU_PHASE_OPS(Step, fn, P, step_op, reduce_op, apply_op)                                   \
  INDUCTOR_LAMB_PHASE_ENTRIES(Step, fn, P##_LISTS, P##_HYPERS, P##_ARGS, step_op, reduce_op, apply_op)           \
  TORCH_LIBRARY_IMPL(lamb, CPU, m) { INDUCTOR_LAMB_PHASE_IMPLS(m, fn, step_op, reduce_op, apply_op); }         \
  TORCH_LIBRARY_IMPL(lamb, SparseCPU, m) { INDUCTOR_LAMB_PHASE_IMPLS(m, fn, step_op, reduce_op, apply_op); }

// LARS per-param options given as one value for all or one per param (0 values: `if_empty`).
template <typename List, typename V>
V per_param(const List& values, size_t i, V if_empty) {
  if (values.size() == 0) return if_empty;
  return values.size() == 1 ? V(values[0]) : V(values[i]);
}

// The value of a scheduled 0-d float32 hyper-parameter on the CPU (a float, like the kernels use).
inline double cpu_value(const at::Tensor& t) { return double(t.item<float>()); }

}  // namespace inductor_lamb::cpu
