// The CUDA engine's index math (csrc/cuda/chunk_layout.h) on the host: which elements each thread of a
// block visits, and with which accesses. Built by tests/test_chunk_layout.py with the host
// compiler (chunk_layout.h includes no CUDA header) and called through ctypes.
#include <stdint.h>

#include <vector>

#include "cuda/chunk_layout.h"

using namespace inductor_lamb;
using namespace inductor_lamb::cuda;

extern "C" int head_of(const uint64_t* addrs, const int* sizes, int n) { return tensor_head(addrs, sizes, n); }

// Walks a tensor of `numel` elements as the engine does: chunks of kChunkElems, `threads`
// threads a block, packs of E elements; the streams' addresses (0: absent) and element sizes.
// Returns the number of errors: an element visited other than once, a pack that is not 16-byte
// aligned in every stream or that leaves its chunk's vector range. *packed: elements in packs.
extern "C" int64_t coverage_errors(int64_t numel, const uint64_t* addrs, const int* sizes, int n, int E, int threads,
                                   int64_t* packed) {
  const int head = tensor_head(addrs, sizes, n);
  std::vector<uint8_t> visits(static_cast<size_t>(numel), 0);
  int64_t errors = 0;
  *packed = 0;
  for (int64_t begin = 0; begin < numel; begin += kChunkElems) {
    const int64_t end = begin + kChunkElems < numel ? begin + kChunkElems : numel;
    const ChunkPlan plan = plan_chunk(begin, end, head, E);
    if (plan.begin != begin || plan.end != end || plan.vec_begin < begin || plan.vec_end < plan.vec_begin ||
        plan.vec_end > end || (plan.vec_end - plan.vec_begin) % E != 0)
      ++errors;
    for (int tid = 0; tid < threads; ++tid) {
      walk_chunk(
          plan, E, tid, threads,
          [&](int64_t i) {
            if (i < plan.vec_begin || i + E > plan.vec_end) ++errors;
            for (int s = 0; s < n; ++s)
              if (addrs[s] != 0 && (addrs[s] + uint64_t(i) * sizes[s]) % kVecBytes != 0) ++errors;
            for (int j = 0; j < E; ++j)
              if (i + j >= 0 && i + j < numel) ++visits[i + j];
              else ++errors;
            *packed += E;
          },
          [&](int64_t start, int64_t stop) {
            walk_scalar(start, stop, tid, threads, [&](int64_t i) {
              if (i >= 0 && i < numel) ++visits[i];
              else ++errors;
            });
          });
    }
  }
  for (uint8_t v : visits) errors += v != 1;
  return errors;
}
