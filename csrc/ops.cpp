// Every lamb:: schema, in one place. Kernels register per backend
// (csrc/cpu/*.cpp for CPU); fake implementations live in inductor_lamb/ops.py.
#include <Python.h>
#include <torch/library.h>

#include <string>

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

// Argument lists with alias annotations filled in per op: `mutated` names the
// lists an op writes ("Tensor[] x" -> "Tensor(a!)[] x"), and a two-phase apply
// op takes `Tensor reductions` right after its tensor lists (before `lr`).
std::string schema(const char* name, const std::string& args, std::initializer_list<const char*> mutated,
                   const char* returns, bool takes_reductions = false) {
  std::string out = std::string(name) + "(";
  char alias = 'a';
  size_t pos = 0;
  bool first = true;
  while (pos < args.size()) {
    size_t next = args.find(", ", pos);
    if (next == std::string::npos) next = args.size();
    std::string arg = args.substr(pos, next - pos);
    pos = next + 2;
    const std::string arg_name = arg.substr(arg.find(' ') + 1, arg.find('=') - arg.find(' ') - 1);
    if (takes_reductions && arg_name == "lr") out += ", Tensor reductions";
    for (const char* m : mutated)
      if (arg_name == m) arg.insert(6, std::string("(") + alias++ + "!)");  // after "Tensor"
    out += (first ? "" : ", ") + arg;
    first = false;
  }
  return out + ") -> " + returns;
}

// The arguments of each step op, in order (no alias annotations: schema() adds them).
const std::string kLambArgs =
    "Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, Tensor lr, "
    "Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.01, bool bias_correction=True, "
    "bool grad_averaging=True, bool always_adapt=False, bool trust_clip=False, float max_grad_norm=0.0, "
    "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor[]? master_params=None";
const std::string kLarsArgs =
    "Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, Tensor lr, Tensor momentum, "
    "float lars_coeff=0.001, float eps=0.0, float rescale_grad=1.0, float[] weight_decay=[0.0005], "
    "bool[] layer_adaptation=[], Tensor? grad_scale=None, Tensor? found_inf=None, Tensor[]? master_params=None";
const std::string kAdagradArgs =
    "Tensor[] params, Tensor[] grads, Tensor[] state_sums, Tensor[] steps, Tensor lr, float lr_decay=0.0, "
    "float weight_decay=0.0, float eps=1e-10, bool maximize=False, Tensor? grad_scale=None, "
    "Tensor? found_inf=None, Tensor[]? master_params=None";
const std::string kLamb16Args =
    "Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] exp_avg_scales, "
    "Tensor[] exp_avg_sq_scales, Tensor[] steps, Tensor lr, Tensor beta1, Tensor beta2, float eps=1e-06, "
    "float weight_decay=0.0, float trust_scale=0.382, bool stochastic_rounding=True, int seed=0, "
    "Tensor? grad_scale=None, Tensor? found_inf=None, "
    "Tensor[]? master_params=None";

}  // namespace

// Scheduled hyper-parameters (lr, betas, momentum) are 0-d float32 tensors on the
// params' device: a new value never recompiles a graph or syncs the host. The
// Python description of every argument (roles, defaults, ranges) is
// inductor_lamb/spec.py; tests/test_spec.py keeps the two in agreement.
//
// The layer-wise steps also come in two phases (protocol: inductor_lamb/spec.py,
// CONTRIBUTING.md): *_reduce_ does pass 1 and returns the per-tensor partial
// reductions as one float32 [n, k] tensor; *_apply_ takes them (all-reduced over
// shards, if sharded) and does pass 2. The one-call op is exactly reduce then apply.
TORCH_LIBRARY(lamb, m) {
  m.def(schema("lamb_step_", kLambArgs, {"params", "exp_avgs", "exp_avg_sqs", "steps", "master_params"}, "()").c_str());
  m.def(schema("lamb_reduce_", kLambArgs, {"exp_avgs", "exp_avg_sqs", "steps"}, "Tensor").c_str());
  m.def(schema("lamb_apply_", kLambArgs, {"params", "master_params"}, "()", true).c_str());
  m.def(schema("lars_step_", kLarsArgs, {"params", "momentum_buffers", "master_params"}, "()").c_str());
  m.def(schema("lars_reduce", kLarsArgs, {}, "Tensor").c_str());
  m.def(schema("lars_apply_", kLarsArgs, {"params", "momentum_buffers", "master_params"}, "()", true).c_str());
  m.def(schema("adagrad_step_", kAdagradArgs, {"params", "state_sums", "steps", "master_params"}, "()").c_str());
  m.def(schema("lamb16_step_", kLamb16Args,
               {"params", "exp_avgs", "exp_avg_sqs", "exp_avg_scales", "exp_avg_sq_scales", "steps", "master_params"},
               "()").c_str());
  m.def(schema("lamb16_reduce_", kLamb16Args, {"steps"}, "Tensor").c_str());
  m.def(schema("lamb16_apply_", kLamb16Args,
               {"params", "exp_avgs", "exp_avg_sqs", "exp_avg_scales", "exp_avg_sq_scales", "master_params"}, "()",
               true).c_str());
  // Utilities (no tensors): CPU ISA selection, for tests and debugging.
  m.def("_cpu_capability(int force=-1) -> int", &cpu_capability);
  m.def("_max_cpu_capability() -> int", &max_cpu_capability);
}
