// upload_table (cuda/tensor_table.h): an eager call's temporary, or a captured call's table owned
// by its graph through the CUDA runtime below.
#include "cuda/tensor_table.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/graph_tables.h"

namespace inductor_lamb::cuda {
namespace {

class CudaTableRuntime : public TableRuntime {
 public:
  CudaTableRuntime(cudaStream_t stream, int device, const char* op) : stream_(stream), device_(device), op_(op) {}

  bool capturing() override {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  }
  int device() override { return device_; }  // (the current one: the call's device guard)
  void* alloc_device(size_t bytes) override {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};  // (allowed while capturing)
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void* alloc_host(size_t bytes) override {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    return p;
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }
  void give_to_graph(void (*release)(void*), void* arg) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    check(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &graph), "cudaStreamGetCaptureInfo");
    TORCH_CHECK(status == cudaStreamCaptureStatusActive && graph != nullptr, op_,
                ": the stream stopped capturing while its tensor table was made");
    cudaUserObject_t object = nullptr;
    check(cudaUserObjectCreate(&object, arg, release, 1, cudaUserObjectNoDestructorSync), "cudaUserObjectCreate");
    // (on failure the object keeps its reference and is never released, a few bytes lost: releasing
    // it would run `release` for a table the caller gives back itself)
    check(cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove), "cudaGraphRetainUserObject");
  }

 private:
  void check(cudaError_t err, const char* what) {
    TORCH_CHECK(err == cudaSuccess, op_, ": ", what, " failed while making the tensor table: ",
                cudaGetErrorString(err));
  }
  cudaStream_t stream_;
  int device_;
  const char* op_;
};

}  // namespace

DeviceTable upload_table(const std::string& bytes, const at::Device& device, const char* op) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  CudaTableRuntime rt(stream, device.index(), op);
  if (rt.capturing())
    return {static_cast<const uint8_t*>(graph_tables().capture(rt, bytes.data(), bytes.size())), at::Tensor()};
  const int64_t n = static_cast<int64_t>(bytes.size());
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  at::Tensor table = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(device));
  table.copy_(host, /*non_blocking=*/true);  // (the host allocator keeps `host` until the copy is done)
  return {table.data_ptr<uint8_t>(), table};
}

}  // namespace inductor_lamb::cuda
