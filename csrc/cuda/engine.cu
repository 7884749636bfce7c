// Engine pieces shared by the optimizers: the grid of a chunk kernel, global grad-norm clipping.
#include <mutex>
#include <unordered_map>
#include <utility>

#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {

namespace {

constexpr int kClipSlot = 3;  // partials slot of the grad norm (pass 1 kernels write 0..3 after it is read)

template <typename P>
__global__ void __launch_bounds__(kThreads, kMinBlocks) grad_sumsq(Launch l) {
  const float mul = grad_multiplier(l, false);
  for_each_chunk<P>(l, [&](const BlockChunk& c) { write_partials(l, c.chunk, walk(c, SumsOfSquares<P, false>{{c.t}, mul}), kClipSlot); });
}

// One block: strided sums in double, then a fixed-order block reduction.
__global__ void __launch_bounds__(kThreads) grad_clip(Launch l, double max_norm) {
  if (skip_step(l)) return;
  double s = 0.0;
  for (int32_t c = threadIdx.x; c < l.num_chunks; c += kThreads) s += l.partials[c * kPartials + kClipSlot];
  s = block_reduce<SumOp, double>(s);
  if (threadIdx.x == 0) l.global[0] = float(1.0 / clip_divisor(sqrt(s), max_norm));
}

}  // namespace

int chunk_grid(const void* kernel, const Launch& l) {
  // Blocks resident at once on the device, per kernel and device (the occupancy of its
  // registers and shared memory), queried once.
  static std::mutex mu;
  static std::unordered_map<const void*, std::unordered_map<int, int>> resident;
  int blocks;
  {
    std::lock_guard<std::mutex> lock(mu);
    int& r = resident[kernel][l.device];
    if (r == 0) {
      int sms = 0, per_sm = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, l.device);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
      r = sms > 0 && per_sm > 0 ? sms * per_sm : 1 << 30;  // (unknown: one block per chunk)
    }
    blocks = r;
  }
  return blocks < l.num_chunks ? blocks : l.num_chunks;
}

int launch_grad_clip(const Launch& l, double max_norm) {
  for_each_variant(l, [&](auto p) { on_chunks(grad_sumsq<decltype(p)>, l); });
  if (l.count) ++*l.count;
  else grad_clip<<<1, kThreads, 0, l.stream>>>(l, max_norm);
  return launched(l);
}

}  // namespace inductor_lamb::cuda
