// TORCH_LIBRARY_IMPL(lamb, CUDA): argument checks and layouts (device-neutral:
// csrc/common/), the device-side tensor table, workspaces, and the extern "C"
// launchers of the .cu files. Built only when torch has CUDA.
//
// No step syncs the host: lr, steps, grad_scale and found_inf are read by the kernels, and
// the tensor table (pointers, sizes, alignment, chunks) goes up asynchronously from pinned
// memory, once per distinct list (cached by its bytes): steady-state steps copy nothing, a
// list first seen inside CUDA graph capture is captured with its copy (TableCache).
#include <c10/cuda/CUDACachingAllocator.h>
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

#include "common/op_args.h"
#include "cuda/launch.h"
#include "cuda/chunk_layout.h"

namespace inductor_lamb::cuda {
namespace {

// ---- the device-side tensor table ------------------------------------------------

class TableCache {
 public:
  // The device copy of `bytes` (TensorMeta[] then ChunkMeta[]) for kernels on `stream`.
  //
  // Never a host sync: a new table is written into pinned host memory that its entry owns
  // and copied with cudaMemcpyAsync on `stream`, ahead of the kernels that read it. Inside
  // CUDA graph capture that copy is captured too (its source stays unchanged while the entry
  // lives), so a list first seen while capturing works, and every replay re-copies the same
  // bytes; an eager call that finds such an entry, whose device copy only a replay writes,
  // copies it once first. Entries a graph captured are never evicted.
  const uint8_t* get(const std::string& bytes, const at::Device& device, cudaStream_t stream, const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = std::to_string(device.index()) + ":" + bytes;
    const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (entries_.size() >= kMaxEntries) evict();
      Entry e;
      e.size = bytes.size();
      if (capturing) {
        // Outside the capture's memory pool (whose blocks CUDA graph trees hand out again
        // when they switch paths), as torch's allocator grows a pool while capturing: a raw
        // allocation under relaxed capture mode, kept for the life of the process.
        c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
        check(cudaMallocHost(&e.host, e.size), op);
        check(cudaMalloc(&e.device, e.size), op);
      } else {
        e.host_tensor = at::empty({static_cast<int64_t>(e.size)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
        e.device_tensor = at::empty({static_cast<int64_t>(e.size)}, at::TensorOptions().dtype(at::kByte).device(device));
        e.host = e.host_tensor.data_ptr();
        e.device = e.device_tensor.data_ptr();
      }
      std::memcpy(e.host, bytes.data(), e.size);
      it = entries_.emplace(key, std::move(e)).first;
      upload(it->second, stream, capturing, op);
    } else if (it->second.filled_by_replay && !capturing) {
      upload(it->second, stream, false, op);
    } else if (!capturing && it->second.stream != stream) {
      // (another stream: after the upload, and the device copy kept for its kernels)
      if (it->second.uploaded != nullptr) check(cudaStreamWaitEvent(stream, it->second.uploaded, 0), op);
      if (it->second.device_tensor.defined())
        c10::cuda::CUDACachingAllocator::recordStream(it->second.device_tensor.storage().data_ptr(),
                                                      c10::cuda::getStreamFromExternal(stream, device.index()));
    }
    if (capturing) it->second.captured = true;
    return static_cast<const uint8_t*>(it->second.device);
  }

 private:
  struct Entry {
    size_t size = 0;
    void* host = nullptr;    // pinned, unchanged while the entry lives (a captured copy reads it)
    void* device = nullptr;
    at::Tensor host_tensor, device_tensor;  // owners of an eager entry's memory (else raw, never freed)
    cudaStream_t stream = nullptr;
    cudaEvent_t uploaded = nullptr;  // recorded after an eager copy (eviction waits for it)
    bool captured = false, filled_by_replay = false;
  };
  static constexpr size_t kMaxEntries = 256;

  static void check(cudaError_t err, const char* op) {
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA error while uploading the tensor table: ", cudaGetErrorString(err));
  }
  static void upload(Entry& e, cudaStream_t stream, bool capturing, const char* op) {
    check(cudaMemcpyAsync(e.device, e.host, e.size, cudaMemcpyHostToDevice, stream), op);
    e.stream = stream;
    e.filled_by_replay = capturing;
    if (!capturing) {
      if (e.uploaded == nullptr) check(cudaEventCreateWithFlags(&e.uploaded, cudaEventDisableTiming), op);
      check(cudaEventRecord(e.uploaded, stream), op);
    }
  }
  // Drops the entries no graph captured whose copy is done (a pending one stays: its pinned
  // source must outlive the copy).
  void evict() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& e = it->second;
      const bool done = e.uploaded == nullptr || cudaEventQuery(e.uploaded) == cudaSuccess;
      if (e.captured || !done) {
        ++it;
        continue;
      }
      if (e.uploaded != nullptr) cudaEventDestroy(e.uploaded);
      it = entries_.erase(it);
    }
    (void)cudaGetLastError();  // (a query of a pending event leaves cudaErrorNotReady behind)
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
  at::Tensor workspace, inv_grad_scale;
};

PreparedLaunch prepare(std::vector<TensorMeta>& tensors, const at::Device& device, const at::Tensor& lr,
                       const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                       const char* op) {
  std::vector<ChunkMeta> chunks;
  uint32_t variants = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = (tensors[t].numel + kChunk - 1) / kChunk;
    TORCH_CHECK(n <= INT32_MAX, op, ": params[", t, "] has too many elements");
    tensors[t].first_chunk = static_cast<int64_t>(chunks.size());
    tensors[t].num_chunks = static_cast<int32_t>(n);
    for (int32_t k = 0; k < n; ++k) chunks.push_back({static_cast<int32_t>(t), k});
    if (n > 0) variants |= 1u << param_variant(tensors[t]);
  }
  TORCH_CHECK(chunks.size() <= INT32_MAX, op, ": too many elements in one call");
  std::string bytes(tensors.size() * sizeof(TensorMeta) + chunks.size() * sizeof(ChunkMeta), '\0');
  std::memcpy(bytes.data(), tensors.data(), tensors.size() * sizeof(TensorMeta));
  std::memcpy(bytes.data() + tensors.size() * sizeof(TensorMeta), chunks.data(), chunks.size() * sizeof(ChunkMeta));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const uint8_t* table = table_cache().get(bytes, device, stream, op);

  PreparedLaunch out;
  const int64_t nt = static_cast<int64_t>(tensors.size()), nc = static_cast<int64_t>(chunks.size());
  out.workspace = at::empty({nc * kPartials + nt * kCoeffs + kPartials}, at::TensorOptions().dtype(at::kFloat).device(device));
  float* ws = out.workspace.data_ptr<float>();
  Launch& l = out.launch;
  l = Launch{};
  l.tensors = reinterpret_cast<const TensorMeta*>(table);
  l.chunks = reinterpret_cast<const ChunkMeta*>(table + nt * sizeof(TensorMeta));
  l.num_tensors = static_cast<int32_t>(nt);
  l.num_chunks = static_cast<int32_t>(nc);
  l.variants = variants;
  l.partials = ws;
  l.coeffs = ws + nc * kPartials;
  l.global = ws + nc * kPartials + nt * kCoeffs;
  l.lr = lr.data_ptr<float>();
  if (grad_scale.has_value() && grad_scale->defined()) {
    // (1 / x rounded once, as the CPU kernels' 1.f / grad_scale)
    out.inv_grad_scale = at::reciprocal(*grad_scale);
    l.inv_grad_scale = out.inv_grad_scale.data_ptr<float>();
  }
  l.found_inf = found_inf.has_value() && found_inf->defined() ? found_inf->data_ptr<float>() : nullptr;
  l.stream = stream;
  l.device = device.index();
  return out;
}

// Bytes of one element of a list's storage.
int element_size(at::ScalarType t) { return static_cast<int>(c10::elementSize(t)); }

void check_launch(int err, const char* op) {
  TORCH_CHECK(err == 0, op, ": CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Everything an op does once its arguments are checked (check_call): device
// guard, layouts (TensorRows), the Hyper the launchers take, the tensor table,
// workspace, launches and write-back; fill(i, meta) adds the op's own per-tensor
// pointers and options.
template <typename Hyper>
class CudaCall {
 public:
  using Launcher = int (*)(const Launch*, const Hyper*);
  // A two-phase op: its launchers (reduce, apply, the one-call step), reduction columns, and the
  // state lists each phase writes (bit k: state list k; apply also writes the params).
  struct Phases {
    Launcher reduce, apply, step;
    int64_t k;
    unsigned reduce_writes, apply_writes;
  };

  // `num_states` state lists come first in the checked lists, then the master params if given.
  template <typename Fill>
  CudaCall(const OpArgs& a, int num_states, Hyper (*hyper_of)(const OpArgs&), const Fill& fill, Phases phases = {})
      : CudaCall(a, check_call(a, a.device()), num_states, hyper_of, fill, phases) {}

  // Pass 1: the reductions (zeros on a skipped step, written by the launches).
  at::Tensor reduce() {
    at::Tensor r = at::empty({static_cast<int64_t>(rows_.size()), phases_.k}, at::TensorOptions().dtype(at::kFloat).device(device_));
    prepared_.launch.reductions = r.data_ptr<float>();
    run(phases_.reduce);
    rows_.commit(false, phases_.reduce_writes, master_);
    return r;
  }
  // Pass 2 from the reductions (check_call checked them).
  void apply(const at::Tensor& reductions) {
    const at::Tensor r = reductions.contiguous();
    prepared_.launch.reductions = r.data_ptr<float>();
    run(phases_.apply);
    rows_.commit(true, phases_.apply_writes, master_);
  }
  // The one-call form of a two-phase op: the same kernels and bits, the per-tensor work of
  // both phases in one launch.
  void step() {
    run(phases_.step);
    rows_.commit(true, phases_.reduce_writes | phases_.apply_writes, master_);
  }
  // A one-launcher op: everything it wrote is written back.
  void step(Launcher fn) {
    run(fn);
    rows_.commit();
  }

 private:
  template <typename Fill>
  CudaCall(const OpArgs& a, std::vector<StateList> lists, int num_states, Hyper (*hyper_of)(const OpArgs&),
           const Fill& fill, Phases phases)
      : op_(a.op()), device_(a.device()), guard_(device_), rows_(a.list("params"), a.list("grads"), lists),
        hyper_(hyper_of(a)), master_(a.optional_list("master_params").has_value() ? num_states : -1), phases_(phases) {
    const at::TensorList params = a.list("params");
    const bool has_master = master_ >= 0;
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
      t.dtype = rows_.dtypes()[i];
      // The first element at which every stream is 16-byte aligned (chunk_layout.h).
      uint64_t addrs[5] = {reinterpret_cast<uint64_t>(t.param), reinterpret_cast<uint64_t>(t.grad),
                           reinterpret_cast<uint64_t>(t.master)};
      int sizes[5] = {element_size(params[i].scalar_type()), element_size(params[i].scalar_type()), 4};
      for (int k = 0; k < num_states; ++k) {
        addrs[3 + k] = reinterpret_cast<uint64_t>(t.state[k]);
        sizes[3 + k] = element_size(lists[k].dtype);
      }
      t.head = tensor_head(addrs, sizes, 3 + num_states);
      fill(i, t);
    }
    prepared_ = prepare(tensors, device_, a.tensor("lr"), a.optional_tensor("grad_scale"), a.optional_tensor("found_inf"), op_);
  }

  void run(Launcher fn) {
    if (rows_.size() > 0) check_launch(fn(&prepared_.launch, &hyper_), op_);
  }

  const char* op_;
  at::Device device_;
  c10::cuda::CUDAGuard guard_;
  TensorRows rows_;
  Hyper hyper_;
  int master_;
  Phases phases_;
  PreparedLaunch prepared_{};
};

// ---- the ops ---------------------------------------------------------------------------
// Each layer-wise op comes as one call and as its two phases (the same kernels:
// the one-call op is reduce then apply, bit for bit). A call class is its
// CudaCall with the op's per-tensor table entries and phases.

struct LambCall : CudaCall<lamb::Hyper> {
  explicit LambCall(const OpArgs& a)
      : CudaCall(a, 2, &lamb::hyper_of<OpArgs>,
                 [steps = a.list("steps")](size_t i, TensorMeta& t) { t.step = steps[i].data_ptr<float>(); },
                 {inductor_lamb_cuda_lamb_reduce, inductor_lamb_cuda_lamb_apply, inductor_lamb_cuda_lamb_step,
                  lamb::kReductions, 0b11u, 0u}) {}
};

struct Lamb16Call : CudaCall<lamb16::Hyper> {
  explicit Lamb16Call(const OpArgs& a)
      : CudaCall(a, 2, &lamb16::hyper_of<OpArgs>,
                 [&a](size_t i, TensorMeta& t) {
                   t.step = a.list("steps")[i].data_ptr<float>();
                   t.scalar[0] = a.list("exp_avg_scales")[i].data_ptr<float>();
                   t.scalar[1] = a.list("exp_avg_sq_scales")[i].data_ptr<float>();
                 },
                 // reduce writes only the steps (never copied); apply the params, m8, v8 and scales
                 {inductor_lamb_cuda_lamb16_reduce, inductor_lamb_cuda_lamb16_apply, inductor_lamb_cuda_lamb16_step,
                  lamb16::kReductions, 0u, 0b11u}) {}
};

struct LarsCall : CudaCall<lars::Hyper> {
  explicit LarsCall(const OpArgs& a)
      : CudaCall(a, 1, &lars::hyper_of<OpArgs>, [&a](size_t i, TensorMeta& t) { t.options = lars::options_of(a, i); },
                 {inductor_lamb_cuda_lars_reduce, inductor_lamb_cuda_lars_apply, inductor_lamb_cuda_lars_step,
                  lars::kReductions, 0u, 0b1u}) {}
};

struct AdagradCall : CudaCall<adagrad::Hyper> {
  explicit AdagradCall(const OpArgs& a)
      : CudaCall(a, 1, &adagrad::hyper_of<OpArgs>,
                 [steps = a.list("steps")](size_t i, TensorMeta& t) { t.step = steps[i].data_ptr<float>(); }) {}
  void step() { CudaCall::step(inductor_lamb_cuda_adagrad_step); }
};

// The kernels one call of `op` launches on a list of one float32 tensor (clipped: LAMB with
// max_grad_norm > 0), counted by running its launchers with Launch::count set: nothing is
// launched and no device is needed. What torch.compile's launch model reads (_inductor/cost.py).
int64_t launch_count(const std::string& op, bool clipped) {
  int n = 0;
  Launch l{};
  l.num_tensors = l.num_chunks = 1;
  l.variants = 1u << param_variant(Dtype::Float, false);
  l.count = &n;
  lamb::Hyper lamb_h{};
  lamb_h.max_grad_norm = clipped ? 1.0 : 0.0;
  const lamb16::Hyper lamb16_h{};
  const lars::Hyper lars_h{};
  const adagrad::Hyper adagrad_h{};
  if (op == "lamb_step_") inductor_lamb_cuda_lamb_step(&l, &lamb_h);
  else if (op == "lamb_reduce_") inductor_lamb_cuda_lamb_reduce(&l, &lamb_h);
  else if (op == "lamb_apply_") inductor_lamb_cuda_lamb_apply(&l, &lamb_h);
  else if (op == "lamb16_step_") inductor_lamb_cuda_lamb16_step(&l, &lamb16_h);
  else if (op == "lamb16_reduce_") inductor_lamb_cuda_lamb16_reduce(&l, &lamb16_h);
  else if (op == "lamb16_apply_") inductor_lamb_cuda_lamb16_apply(&l, &lamb16_h);
  else if (op == "lars_step_") inductor_lamb_cuda_lars_step(&l, &lars_h);
  else if (op == "lars_reduce") inductor_lamb_cuda_lars_reduce(&l, &lars_h);
  else if (op == "lars_apply_") inductor_lamb_cuda_lars_apply(&l, &lars_h);
  else if (op == "adagrad_step_") inductor_lamb_cuda_adagrad_step(&l, &adagrad_h);
  else TORCH_CHECK(false, "_cuda_launches: unknown op '", op, "'");
  return n;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lamb, m) {
  m.def("_cuda_launches(str op, bool clipped=False) -> int", &launch_count);
}

TORCH_LIBRARY_IMPL(lamb, CUDA, m) {
  register_family<LambCall>(m, "lamb_step_");
  register_family<Lamb16Call>(m, "lamb16_step_");
  register_family<LarsCall>(m, "lars_step_");
  register_family<AdagradCall>(m, "adagrad_step_");
}

}  // namespace inductor_lamb::cuda
