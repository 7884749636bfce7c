// Every lamb:: schema, in one place. Kernels register per backend
// (csrc/cpu/*.cpp for CPU); fake implementations live in inductor_lamb/ops.py.
#include <Python.h>
#include <torch/library.h>

#include "cpu/engine.h"

// An empty Python module: importing it loads the library, whose static
// initializers register the ops. No pybind11, so the module is abi3.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

namespace {

// force < 0: query. Returns the active capability (0 generic, 1 AVX2, 2 AVX512).
int64_t cpu_capability(int64_t force) {
  using inductor_lamb::cpu::Capability;
  if (force >= 0) inductor_lamb::cpu::set_cpu_capability(static_cast<Capability>(force));
  return static_cast<int64_t>(inductor_lamb::cpu::cpu_capability());
}

int64_t max_cpu_capability() { return static_cast<int64_t>(inductor_lamb::cpu::max_cpu_capability()); }

}  // namespace

// Scheduled hyper-parameters (lr, betas, momentum) are 0-d float32 tensors on the
// params' device: a new value never recompiles a graph or syncs the host. The
// Python description of every argument (roles, defaults, ranges) is
// inductor_lamb/spec.py; tests/test_spec.py keeps the two in agreement.
TORCH_LIBRARY(lamb, m) {
  m.def(
      "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] steps, Tensor lr, Tensor beta1, Tensor beta2, float eps=1e-06, "
      "float weight_decay=0.01, bool bias_correction=True, bool grad_averaging=True, bool always_adapt=False, "
      "bool trust_clip=False, float max_grad_norm=0.0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(e!)[]? master_params=None) -> ()");
  m.def(
      "lars_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, Tensor lr, "
      "Tensor momentum, float lars_coeff=0.001, float eps=0.0, float rescale_grad=1.0, "
      "float[] weight_decay=[0.0005], bool[] layer_adaptation=[], Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor(c!)[]? master_params=None) -> ()");
  m.def(
      "adagrad_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state_sums, Tensor(c!)[] steps, "
      "Tensor lr, float lr_decay=0.0, float weight_decay=0.0, float eps=1e-10, bool maximize=False, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor(d!)[]? master_params=None) -> ()");
  m.def(
      "lamb16_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] exp_avg_scales, Tensor(e!)[] exp_avg_sq_scales, Tensor(f!)[] steps, Tensor lr, "
      "Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.0, float trust_scale=0.382, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor(g!)[]? master_params=None) -> ()");
  // Utilities (no tensors): CPU ISA selection, for tests and debugging.
  m.def("_cpu_capability(int force=-1) -> int", &cpu_capability);
  m.def("_max_cpu_capability() -> int", &max_cpu_capability);
}
