#pragma once
// Every op's arguments on the C++ side, shared by the CPU glue (csrc/cpu/<opt>.cpp)
// and the CUDA glue (csrc/cuda/ops_cuda.cpp): the C++ parameter lists, what valid
// input is (one check per op, with messages naming the argument and list index),
// and the hyper-parameter struct of common/<opt>.h that the kernels receive.
//
// Each check_<op> runs every check (naming `op`, the step op or one of its phases)
// before anything is written, then returns the op's per-element state lists (in
// TensorRows order: states, then master params) and its Hyper. Order and messages
// are mirrored by inductor_lamb/spec.py::check (the trace-time checks of every
// compile path): list lengths, then per index the param, grad and state rows,
// then the per-tensor scalar lists, the scheduled tensor hyper-parameters (lr,
// betas, momentum), grad_scale / found_inf, and last the float hyper-parameters
// in schema order. Scheduled tensors are data: their values are not range-checked
// (a compiled step could not check them at trace time).
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "common/adagrad.h"
#include "common/lamb.h"
#include "common/lamb16.h"
#include "common/lars.h"
#include "common/rows.h"

namespace inductor_lamb {

// Checks with messages like "lamb_step_: grads[3] has shape [2, 3] but params[3] has shape [3, 2]".
class ArgChecker {
 public:
  explicit ArgChecker(const char* op) : op_(op) {}
  const char* op() const { return op_; }

  void same_length(const char* name, at::TensorList list, const char* ref_name, size_t n) const;
  // `t` (list entry `name`[i]) must be defined, dense (strided), on `device`.
  void dense_on(const at::Tensor& t, const char* name, size_t i, const at::Device& device) const;
  void same_shape(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name, size_t i) const;
  void dtype_is(const at::Tensor& t, const char* name, size_t i, at::ScalarType expected) const;
  void param_dtype(const at::Tensor& t, const char* name, size_t i) const;  // float32 / bfloat16 / float16
  // A 0-d float32 tensor (lr, steps[i]); i < 0 for a non-list argument.
  void scalar_tensor(const at::Tensor& t, const char* name, int64_t i, const at::Device& device) const;
  // grad_scale / found_inf: one float32 element on `device`.
  void optional_scalar(const std::optional<at::Tensor>& t, const char* name, const at::Device& device) const;
  void in_range(double v, const char* name, double lo, double hi, bool hi_open) const;

 private:
  const char* op_;
};

// `reductions` of an apply op: float32 [n, k] on `device` (checked after the op's other arguments).
void check_reductions(const char* op, const at::Tensor& reductions, int64_t n, int64_t k, const at::Device& device);

// A checked call: the state lists (then master params) and the kernels' hyper-parameters.
template <typename Hyper>
struct Checked {
  std::vector<StateList> lists;
  Hyper hyper;
};

// The C++ parameter lists of the ops (one-call, reduce and apply share them; an
// apply op takes `const at::Tensor& reductions` between <OP>_LISTS and
// <OP>_HYPERS, as its schema does), and the matching argument lists.
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
      double trust_scale, bool stochastic_rounding, int64_t seed, const std::optional<at::Tensor>&grad_scale,    \
      const std::optional<at::Tensor>&found_inf, std::optional<at::TensorList> master_params
#define LAMB16_ARGS                                                                                          \
  params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps, lr, beta1_t, beta2_t, eps, \
      weight_decay, trust_scale, stochastic_rounding, seed, grad_scale, found_inf, master_params
#define LARS_LISTS at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers
#define LARS_HYPERS                                                                                           \
  const at::Tensor &lr, const at::Tensor &momentum_t, double lars_coeff, double eps, double rescale_grad,     \
      c10::ArrayRef<double> weight_decay, const c10::List<bool>&layer_adaptation,                              \
      const std::optional<at::Tensor>&grad_scale, const std::optional<at::Tensor>&found_inf,                  \
      std::optional<at::TensorList> master_params
#define LARS_ARGS                                                                                              \
  params, grads, momentum_buffers, lr, momentum_t, lars_coeff, eps, rescale_grad, weight_decay, layer_adaptation, \
      grad_scale, found_inf, master_params
#define ADAGRAD_LISTS at::TensorList params, at::TensorList grads, at::TensorList state_sums, at::TensorList steps
#define ADAGRAD_HYPERS                                                                                      \
  const at::Tensor &lr, double lr_decay, double weight_decay, double eps, bool maximize,                   \
      const std::optional<at::Tensor>&grad_scale, const std::optional<at::Tensor>&found_inf,               \
      std::optional<at::TensorList> master_params
#define ADAGRAD_ARGS \
  params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf, master_params

Checked<lamb::Hyper> check_lamb(const char* op, const at::Device& device, LAMB_LISTS, LAMB_HYPERS);
Checked<lamb16::Hyper> check_lamb16(const char* op, const at::Device& device, LAMB16_LISTS, LAMB16_HYPERS);
Checked<lars::Hyper> check_lars(const char* op, const at::Device& device, LARS_LISTS, LARS_HYPERS);
Checked<adagrad::Hyper> check_adagrad(const char* op, const at::Device& device, ADAGRAD_LISTS, ADAGRAD_HYPERS);

// LARS's per-param options of index i (weight_decay: one value for all or one per
// param; layer_adaptation: none (all on), one for all or one per param).
lars::Options lars_options(c10::ArrayRef<double> weight_decay, const c10::List<bool>& layer_adaptation, size_t i);

// The entry points of an op on one device over its call class `Call`
// (Call(op, <args>) checks everything; reduce() -> reductions; apply(reductions);
// step(), the one-call op, which gives the phases' bits). INDUCTOR_LAMB_PHASE_IMPLS
// registers them.
#define INDUCTOR_LAMB_PHASE_ENTRIES(Call, fn, P, step_op, reduce_op, apply_op)                         \
  void fn##_step(P##_LISTS, P##_HYPERS) {                                                               \
    Call(step_op, P##_ARGS).step();                                                                     \
  }                                                                                                     \
  at::Tensor fn##_reduce(P##_LISTS, P##_HYPERS) { return Call(reduce_op, P##_ARGS).reduce(); }         \
  void fn##_apply(P##_LISTS, const at::Tensor& reductions, P##_HYPERS) { Call(apply_op, P##_ARGS).apply(reductions); }
#define INDUCTOR_LAMB_PHASE_IMPLS(m, fn, step_op, reduce_op, apply_op) \
  m.impl(step_op, &fn##_step);                                         \
  m.impl(reduce_op, &fn##_reduce);                                     \
  m.impl(apply_op, &fn##_apply)

}  // namespace inductor_lamb
