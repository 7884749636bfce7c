#pragma once
// Where a CUDA op call's tensor table (TensorMeta[] then ChunkMeta[], cuda/launch.h) lives while
// its kernels read it (docs/decisions.md, "CUDA tensor tables"):
//   * an eager call: a temporary of the call, device memory from torch's caching allocator
//     (released stream-ordered once the call's kernels are enqueued), filled by an asynchronous
//     copy from pinned memory that torch's host allocator keeps until the copy is done. Nothing
//     outlives the call; no host sync.
//   * a call captured into a CUDA graph: a table the graph owns (common/graph_tables.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <string>

namespace inductor_lamb::cuda {

struct DeviceTable {
  const uint8_t* data;
  at::Tensor owner;  // an eager table's memory (undefined for a graph's)
};

// The device copy of `bytes` for kernels on `device`'s current stream.
DeviceTable upload_table(const std::string& bytes, const at::Device& device, const char* op);

}  // namespace inductor_lamb::cuda
