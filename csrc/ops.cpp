// Every lamb:: op, declared once: its schema (the literal text below) and what a
// schema cannot say (its Contract: which lists are optimizer state and in which
// dtype, which hold one 0-d tensor per param, the two-phase reductions). Every
// other form derives from these: the C++ kernels read their arguments by name
// against the schema (common/op_args.h), and inductor_lamb/spec.py reads names,
// types, defaults and aliasing from the registered schema and the rest from
// lamb::_contract. Kernels register per backend (csrc/cpu/<opt>.cpp,
// csrc/cuda/ops_cuda.cpp). Every op's checks alone (the kernels' own, then the
// output's shape) are registered below for a dispatch key no tensor has
// (PrivateUse3): the fake implementations (inductor_lamb/ops.py) redispatch to
// them, so every compile path runs the kernels' checks at trace time.
#include <Python.h>
#include <torch/library.h>

#include <string>

#include "common/op_args.h"
#include "cpu/engine.h"

// An empty Python module: importing it loads the library, whose static
// initializers register the ops. No pybind11, so the module is abi3.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

namespace inductor_lamb {

namespace {

const std::vector<Contract>& contracts() {
  static const std::vector<Contract> all = {
      {"lamb_step_", "lamb_reduce_", "lamb_apply_",
       {{"exp_avgs", at::kFloat}, {"exp_avg_sqs", at::kFloat}},
       {"steps"},
       {{"p_sumsq", "sum"}, {"u_sumsq", "sum"}},
       {}},
      {"lamb16_step_", "lamb16_reduce_", "lamb16_apply_",
       {{"exp_avgs", at::kFloat8_e4m3fn}, {"exp_avg_sqs", at::kFloat8_e5m2}},
       {"exp_avg_scales", "exp_avg_sq_scales", "steps"},
       {{"p_sumsq", "sum"}, {"u_sumsq", "sum"}, {"m_amax", "max"}, {"v_amax", "max"}},
       {}},
      {"lars_step_", "lars_reduce", "lars_apply_",
       {{"momentum_buffers", at::kFloat}},
       {},
       {{"p_sumsq", "sum"}, {"g_sumsq", "sum"}},
       {"rescale_grad"}},
      {"adagrad_step_", nullptr, nullptr, {{"state_sums", at::kFloat}}, {"steps"}, {}, {}},
  };
  return all;
}

// The contract as text for inductor_lamb/spec.py: "key=value" items joined by ";".
std::string contract_text(const std::string& op) {
  const Contract& c = contract_of(op);
  auto names = [](const auto& items, auto item) {
    std::string out;
    for (const auto& x : items) out += (out.empty() ? "" : ",") + item(x);
    return out;
  };
  auto dtype = [](at::ScalarType s) -> std::string {
    switch (s) {
      case at::kFloat: return "float32";
      case at::kFloat8_e4m3fn: return "float8_e4m3fn";
      case at::kFloat8_e5m2: return "float8_e5m2";
      default: TORCH_INTERNAL_ASSERT(false, "no Python name for ", s);
    }
  };
  return std::string("step=") + c.step + ";reduce=" + (c.reduce ? c.reduce : "") + ";apply=" +
         (c.apply ? c.apply : "") +
         ";states=" + names(c.states, [&](const StateDecl& s) { return std::string(s.name) + ":" + dtype(s.dtype); }) +
         ";scalars=" + names(c.scalars, [](const char* s) { return std::string(s); }) +
         ";reductions=" + names(c.reductions, [](const auto& r) { return std::string(r.first) + ":" + r.second; }) +
         ";signed=" + names(c.signed_floats, [](const char* s) { return std::string(s); });
}

// Every op's checks, then a reduce op's [n, k] output (empty): what its fake implementation runs.
void check_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpArgs a(op, *stack);
  check_call(a, a.device());
  std::optional<at::Tensor> out;
  if (a.phase() == Phase::Reduce)
    out = at::empty({int64_t(a.size()), int64_t(a.contract().reductions.size())},
                    at::TensorOptions().dtype(at::kFloat).device(a.device()));
  a.finish(stack, std::move(out));
}

// force < 0: query. Returns the active capability (0 generic, 1 AVX2, 2 AVX512).
int64_t cpu_capability(int64_t force) {
  using inductor_lamb::cpu::Capability;
  if (force >= 0) inductor_lamb::cpu::set_cpu_capability(static_cast<Capability>(force));
  return static_cast<int64_t>(inductor_lamb::cpu::cpu_capability());
}

int64_t max_cpu_capability() { return static_cast<int64_t>(inductor_lamb::cpu::max_cpu_capability()); }

}  // namespace

const Contract& contract_of(const std::string& op) {
  for (const Contract& c : contracts())
    for (const char* name : {c.step, c.reduce, c.apply})
      if (name != nullptr && op == name) return c;
  TORCH_CHECK(false, "no lamb op named ", op);
}

}  // namespace inductor_lamb

// Scheduled hyper-parameters (lr, betas, momentum) are 0-d float32 tensors on the
// params' device: a new value never recompiles a graph or syncs the host.
//
// The layer-wise steps also come in two phases (protocol: docs/design.md): *_reduce_
// does pass 1 and returns the per-tensor partial reductions as one float32 [n, k]
// tensor; *_apply_ takes them (all-reduced over shards, if sharded) and does pass 2.
// Both take the one-call op's arguments (apply: plus `reductions` before `lr`); the
// one-call op is exactly reduce then apply. Each schema marks what that op writes.
TORCH_LIBRARY(lamb, m) {
  m.def(
      "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] steps, Tensor lr, Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.01, "
      "bool bias_correction=True, bool grad_averaging=True, bool always_adapt=False, bool trust_clip=False, "
      "float max_grad_norm=0.0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(e!)[]? master_params=None) -> ()");
  m.def(
      "lamb_reduce_(Tensor[] params, Tensor[] grads, Tensor(a!)[] exp_avgs, Tensor(b!)[] exp_avg_sqs, "
      "Tensor(c!)[] steps, Tensor lr, Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.01, "
      "bool bias_correction=True, bool grad_averaging=True, bool always_adapt=False, bool trust_clip=False, "
      "float max_grad_norm=0.0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor[]? master_params=None) -> Tensor");
  m.def(
      "lamb_apply_(Tensor(a!)[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, Tensor[] steps, "
      "Tensor reductions, Tensor lr, Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.01, "
      "bool bias_correction=True, bool grad_averaging=True, bool always_adapt=False, bool trust_clip=False, "
      "float max_grad_norm=0.0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(b!)[]? master_params=None) -> ()");
  m.def(
      "lamb16_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] exp_avg_scales, Tensor(e!)[] exp_avg_sq_scales, Tensor(f!)[] steps, Tensor lr, Tensor beta1, "
      "Tensor beta2, float eps=1e-06, float weight_decay=0.0, float trust_scale=0.382, "
      "bool stochastic_rounding=True, int seed=0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(g!)[]? master_params=None) -> ()");
  m.def(
      "lamb16_reduce_(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
      "Tensor[] exp_avg_scales, Tensor[] exp_avg_sq_scales, Tensor(a!)[] steps, Tensor lr, Tensor beta1, "
      "Tensor beta2, float eps=1e-06, float weight_decay=0.0, float trust_scale=0.382, "
      "bool stochastic_rounding=True, int seed=0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor[]? master_params=None) -> Tensor");
  m.def(
      "lamb16_apply_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
      "Tensor(d!)[] exp_avg_scales, Tensor(e!)[] exp_avg_sq_scales, Tensor[] steps, Tensor reductions, Tensor lr, "
      "Tensor beta1, Tensor beta2, float eps=1e-06, float weight_decay=0.0, float trust_scale=0.382, "
      "bool stochastic_rounding=True, int seed=0, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(f!)[]? master_params=None) -> ()");
  m.def(
      "lars_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, Tensor lr, Tensor momentum, "
      "float lars_coeff=0.001, float eps=0.0, float rescale_grad=1.0, float[] weight_decay=[0.0005], "
      "bool[] layer_adaptation=[], Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor(c!)[]? master_params=None) -> ()");
  m.def(
      "lars_reduce(Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, Tensor lr, Tensor momentum, "
      "float lars_coeff=0.001, float eps=0.0, float rescale_grad=1.0, float[] weight_decay=[0.0005], "
      "bool[] layer_adaptation=[], Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor[]? master_params=None) -> Tensor");
  m.def(
      "lars_apply_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, Tensor reductions, "
      "Tensor lr, Tensor momentum, float lars_coeff=0.001, float eps=0.0, float rescale_grad=1.0, "
      "float[] weight_decay=[0.0005], bool[] layer_adaptation=[], Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor(c!)[]? master_params=None) -> ()");
  m.def(
      "adagrad_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state_sums, Tensor(c!)[] steps, Tensor lr, "
      "float lr_decay=0.0, float weight_decay=0.0, float eps=1e-10, bool maximize=False, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor(d!)[]? master_params=None) -> ()");
  // Utilities (no tensors): each op's contract, for inductor_lamb/spec.py; CPU ISA selection.
  m.def("_contract(str op) -> str", &inductor_lamb::contract_text);
  m.def("_cpu_capability(int force=-1) -> int", &inductor_lamb::cpu_capability);
  m.def("_max_cpu_capability() -> int", &inductor_lamb::max_cpu_capability);
}

TORCH_LIBRARY_IMPL(lamb, PrivateUse3, m) {
  for (const auto& c : inductor_lamb::contracts())
    for (const char* op : {c.step, c.reduce, c.apply})
      if (op != nullptr) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&inductor_lamb::check_kernel>());
}
