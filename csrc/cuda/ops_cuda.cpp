// TORCH_LIBRARY_IMPL(lamb, CUDA): argument checks and layouts (shared with the
// CPU engine: csrc/cpu/engine.h), the device-side tensor table, workspaces, and
// the extern "C" launchers of the .cu files. Built only when torch has CUDA.
//
// No step reads a device value on the host: lr, steps, grad_scale and found_inf
// are read by the kernels. The tensor table (pointers, sizes, chunks) is uploaded
// once per distinct list and cached, so steady-state steps and CUDA graph replays
// do no host-to-device copy; capturing needs one eager (warm-up) call first, as
// CUDA graph capture usually does.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/engine.h"
#include "cpu/op_checks.h"
#include "cuda/launch.h"

namespace inductor_lamb::cuda {
namespace {

using cpu::TensorRows;

// ---- the device-side tensor table ------------------------------------------------

class TableCache {
 public:
  // The device copy of `bytes` (TensorMeta[] then ChunkMeta[]), uploaded on first use.
  const uint8_t* get(const std::string& bytes, const at::Device& device, const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = std::to_string(device.index()) + ":" + bytes;
    const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      TORCH_CHECK(!capturing, op, ": these tensors were never stepped outside CUDA graph capture; run one eager "
                  "(warm-up) step with the same tensors before capturing");
      if (entries_.size() >= kMaxEntries) evict();
      at::Tensor host = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
      // A blocking copy, once per distinct list: the table is then complete for
      // kernels on any stream (steady-state steps hit the cache and copy nothing).
      it = entries_.emplace(key, Entry{host.to(device), false}).first;
    }
    // A captured graph keeps the raw pointer: such entries are never evicted.
    if (capturing) it->second.captured = true;
    return it->second.table.data_ptr<uint8_t>();
  }

 private:
  struct Entry {
    at::Tensor table;
    bool captured;
  };
  static constexpr size_t kMaxEntries = 256;
  void evict() {
    for (auto it = entries_.begin(); it != entries_.end();) it = it->second.captured ? std::next(it) : entries_.erase(it);
  }
  std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
};

TableCache& table_cache() {
  static TableCache cache;
  return cache;
}

// Fills the chunk fields of `tensors`, uploads (or finds) the table, allocates the
// workspace and returns the launch description on the current stream.
struct PreparedLaunch {
  Launch launch;
  at::Tensor workspace;
};

PreparedLaunch prepare(std::vector<TensorMeta>& tensors, const at::Device& device, const at::Tensor& lr,
                       const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                       const char* op) {
  std::vector<ChunkMeta> chunks;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = (tensors[t].numel + kChunk - 1) / kChunk;
    TORCH_CHECK(n <= INT32_MAX, op, ": params[", t, "] has too many elements");
    tensors[t].first_chunk = static_cast<int64_t>(chunks.size());
    tensors[t].num_chunks = static_cast<int32_t>(n);
    for (int32_t k = 0; k < n; ++k) chunks.push_back({static_cast<int32_t>(t), k});
  }
  TORCH_CHECK(chunks.size() <= INT32_MAX, op, ": too many elements in one call");
  std::string bytes(tensors.size() * sizeof(TensorMeta) + chunks.size() * sizeof(ChunkMeta), '\0');
  std::memcpy(bytes.data(), tensors.data(), tensors.size() * sizeof(TensorMeta));
  std::memcpy(bytes.data() + tensors.size() * sizeof(TensorMeta), chunks.data(), chunks.size() * sizeof(ChunkMeta));
  const uint8_t* table = table_cache().get(bytes, device, op);

  PreparedLaunch out;
  const int64_t nt = static_cast<int64_t>(tensors.size()), nc = static_cast<int64_t>(chunks.size());
  out.workspace = at::empty({nc * kPartials + nt * kCoeffs + kPartials}, at::TensorOptions().dtype(at::kFloat).device(device));
  float* ws = out.workspace.data_ptr<float>();
  Launch& l = out.launch;
  l.tensors = reinterpret_cast<const TensorMeta*>(table);
  l.chunks = reinterpret_cast<const ChunkMeta*>(table + nt * sizeof(TensorMeta));
  l.num_tensors = static_cast<int32_t>(nt);
  l.num_chunks = static_cast<int32_t>(nc);
  l.partials = ws;
  l.coeffs = ws + nc * kPartials;
  l.global = ws + nc * kPartials + nt * kCoeffs;
  l.lr = lr.data_ptr<float>();
  l.grad_scale = grad_scale.has_value() && grad_scale->defined() ? grad_scale->data_ptr<float>() : nullptr;
  l.found_inf = found_inf.has_value() && found_inf->defined() ? found_inf->data_ptr<float>() : nullptr;
  l.stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  return out;
}

void check_launch(int err, const char* op) {
  TORCH_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Where the op runs: the params' device (the lr's for an empty call), as spec.py's checks say.
at::Device device_of(at::TensorList params, const at::Tensor& lr) { return params.empty() ? lr.device() : params[0].device(); }

// Everything an op does once its arguments are checked: device guard, layouts
// (TensorRows), the tensor table, workspace, launches and write-back. `num_states`
// state lists come first in `lists`, then master params when `has_master`;
// fill(i, meta) adds the op's own per-tensor pointers and options.
class CudaCall {
 public:
  template <typename Fill>
  CudaCall(const char* op, at::TensorList params, at::TensorList grads, const std::vector<cpu::StateList>& lists,
           int num_states, bool has_master, const at::Tensor& lr, const std::optional<at::Tensor>& grad_scale,
           const std::optional<at::Tensor>& found_inf, const Fill& fill)
      : op_(op), device_(device_of(params, lr)), guard_(device_), rows_(params, grads, lists), has_master_(has_master),
        num_states_(num_states) {
    if (params.empty()) return;
    std::vector<TensorMeta> tensors(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      TensorMeta& t = tensors[i];
      t = TensorMeta{};
      t.param = rows_.param(i);
      t.grad = rows_.grad(i);
      for (int k = 0; k < num_states; ++k) t.state[k] = rows_.state(i, k);
      t.master = has_master ? rows_.floats(i, num_states) : nullptr;
      t.numel = rows_.numels()[i];
      t.dtype = static_cast<int32_t>(rows_.dtypes()[i]);
      fill(i, t);
    }
    prepared_ = prepare(tensors, device_, lr, grad_scale, found_inf, op);
  }

  bool empty() const { return rows_.size() == 0; }

  // A reduce phase's output: zeros (what a skipped step returns), written by the launches.
  at::Tensor new_reductions(int64_t k) {
    reductions_ = at::zeros({static_cast<int64_t>(rows_.size()), k}, at::TensorOptions().dtype(at::kFloat).device(device_));
    prepared_.launch.reductions = reductions_.data_ptr<float>();
    return reductions_;
  }
  // An apply phase's input (checked last, like spec.py's checks).
  void use_reductions(const at::Tensor& reductions, int64_t k) {
    cpu::check_reductions(cpu::ArgChecker(op_), reductions, static_cast<int64_t>(rows_.size()), k, device_);
    reductions_ = reductions.contiguous();
    prepared_.launch.reductions = reductions_.data_ptr<float>();
  }

  template <typename LaunchFn>
  void launch(const LaunchFn& fn) {
    if (!empty()) check_launch(fn(prepared_.launch), op_);
  }
  // Writes back what a phase wrote (see TensorRows::commit).
  void commit(bool params, std::initializer_list<int> states) {
    rows_.commit(params, states, has_master_ ? num_states_ : -1);
  }
  void commit() { rows_.commit(); }

 private:
  const char* op_;
  at::Device device_;
  c10::cuda::CUDAGuard guard_;
  TensorRows rows_;
  bool has_master_;
  int num_states_;
  PreparedLaunch prepared_{};
  at::Tensor reductions_;
};

// ---- the ops ---------------------------------------------------------------------------
// Each layer-wise op comes as one call and as its two phases (the same launches:
// the one-call op is reduce then apply, bit for bit).


struct LambCall {
  CudaCall call;  // first: its argument checks run before h reads any tensor
  LambHyper h;
  LambCall(const char* op, LAMB_LISTS, LAMB_HYPERS)
      : call(op, params, grads,
             cpu::check_lamb_step(op, params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1_t, beta2_t, eps, weight_decay,
                                  max_grad_norm, grad_scale, found_inf, master_params, device_of(params, lr)),
             2, master_params.has_value(), lr, grad_scale, found_inf,
             [&](size_t i, TensorMeta& t) { t.step = steps[i].data_ptr<float>(); }),
        h{beta1_t.data_ptr<float>(), beta2_t.data_ptr<float>(), eps, weight_decay, max_grad_norm, bias_correction,
          grad_averaging, always_adapt, trust_clip} {}
  at::Tensor reduce() {
    at::Tensor r = call.new_reductions(2);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lamb_reduce(&l, &h); });
    call.commit(false, {0, 1});
    return r;
  }
  void apply(const at::Tensor& reductions) {
    call.use_reductions(reductions, 2);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lamb_apply(&l, &h); });
    call.commit(true, {});
  }
};

INDUCTOR_LAMB_PHASE_ENTRIES(LambCall, lamb_cuda, LAMB_LISTS, LAMB_HYPERS, LAMB_ARGS, "lamb_step_", "lamb_reduce_",
                            "lamb_apply_")


struct Lamb16Call {
  CudaCall call;  // first: its argument checks run before h reads any tensor
  Lamb16Hyper h;
  Lamb16Call(const char* op, LAMB16_LISTS, LAMB16_HYPERS)
      : call(op, params, grads,
             cpu::check_lamb16_step(op, params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps,
                                    lr, beta1_t, beta2_t, eps, weight_decay, trust_scale, grad_scale, found_inf,
                                    master_params, device_of(params, lr)),
             2, master_params.has_value(), lr, grad_scale, found_inf, [&](size_t i, TensorMeta& t) {
               t.step = steps[i].data_ptr<float>();
               t.scalar[0] = exp_avg_scales[i].data_ptr<float>();
               t.scalar[1] = exp_avg_sq_scales[i].data_ptr<float>();
             }),
        h{beta1_t.data_ptr<float>(), beta2_t.data_ptr<float>(), eps, weight_decay, trust_scale} {}
  at::Tensor reduce() {
    at::Tensor r = call.new_reductions(4);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lamb16_reduce(&l, &h); });
    return r;  // (only the steps, which are never copied, were written)
  }
  void apply(const at::Tensor& reductions) {
    call.use_reductions(reductions, 4);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lamb16_apply(&l, &h); });
    call.commit(true, {0, 1});
  }
};

INDUCTOR_LAMB_PHASE_ENTRIES(Lamb16Call, lamb16_cuda, LAMB16_LISTS, LAMB16_HYPERS, LAMB16_ARGS, "lamb16_step_", "lamb16_reduce_",
                            "lamb16_apply_")


struct LarsCall {
  CudaCall call;  // first: its argument checks run before h reads any tensor
  LarsHyper h;
  LarsCall(const char* op, LARS_LISTS, LARS_HYPERS)
      : call(op, params, grads,
             cpu::check_lars_step(op, params, grads, momentum_buffers, lr, momentum_t, lars_coeff, eps, rescale_grad,
                                  weight_decay, layer_adaptation, grad_scale, found_inf, master_params,
                                  device_of(params, lr)),
             1, master_params.has_value(), lr, grad_scale, found_inf, [&](size_t i, TensorMeta& t) {
               t.option[0] = float(cpu::per_param(weight_decay, i, 0.0));
               t.option[1] = cpu::per_param(layer_adaptation, i, true) ? 1.f : 0.f;
             }),
        h{momentum_t.data_ptr<float>(), lars_coeff, eps, rescale_grad} {}
  at::Tensor reduce() {
    at::Tensor r = call.new_reductions(2);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lars_reduce(&l, &h); });
    return r;
  }
  void apply(const at::Tensor& reductions) {
    call.use_reductions(reductions, 2);
    call.launch([&](const Launch& l) { return inductor_lamb_cuda_lars_apply(&l, &h); });
    call.commit(true, {0});
  }
};

INDUCTOR_LAMB_PHASE_ENTRIES(LarsCall, lars_cuda, LARS_LISTS, LARS_HYPERS, LARS_ARGS, "lars_step_", "lars_reduce",
                            "lars_apply_")

void adagrad_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList state_sums, at::TensorList steps,
                       const at::Tensor& lr, double lr_decay, double weight_decay, double eps, bool maximize,
                       const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                       std::optional<at::TensorList> master_params) {
  const AdagradHyper h{lr_decay, weight_decay, eps, maximize};
  CudaCall call("adagrad_step_", params, grads,
                cpu::check_adagrad_step("adagrad_step_", params, grads, state_sums, steps, lr, lr_decay, weight_decay,
                                        eps, grad_scale, found_inf, master_params, device_of(params, lr)),
                1, master_params.has_value(), lr, grad_scale, found_inf,
                [&](size_t i, TensorMeta& t) { t.step = steps[i].data_ptr<float>(); });
  call.launch([&](const Launch& l) { return inductor_lamb_cuda_adagrad_step(&l, &h); });
  call.commit();
}

}  // namespace

TORCH_LIBRARY_IMPL(lamb, CUDA, m) {
  INDUCTOR_LAMB_PHASE_IMPLS(m, lamb_cuda, "lamb_step_", "lamb_reduce_", "lamb_apply_");
  INDUCTOR_LAMB_PHASE_IMPLS(m, lamb16_cuda, "lamb16_step_", "lamb16_reduce_", "lamb16_apply_");
  INDUCTOR_LAMB_PHASE_IMPLS(m, lars_cuda, "lars_step_", "lars_reduce", "lars_apply_");
  m.impl("adagrad_step_", &adagrad_step_cuda);
}

}  // namespace inductor_lamb::cuda
