#pragma once
// The tensor tables of CUDA op calls captured into CUDA graphs (docs/decisions.md, "CUDA tensor
// tables"). No torch or CUDA header: the CPU build compiles it too, with a fake runtime the tests
// drive (torch.classes.lamb._GraphTablesProbe, graph_tables.cpp).
//
// A CUDA step reads its tensor table (pointers, sizes, chunk map) from device memory. An eager
// call's table is a temporary of the call (cuda/tensor_table.cpp). A call captured into a graph
// needs a table for as long as the graph lives, and that is not the call's to know, so the graph
// owns it:
//   * its memory (a device table and the pinned bytes a replay copies from) is allocated outside
//     every memory pool (a CUDA graph tree hands its pool's blocks out again when it switches
//     paths) under relaxed capture mode, which allows the allocation while the stream captures;
//   * the copy into it is captured: every replay writes its table before its kernels read it;
//   * the table joins the captured graph's resources (a CUDA user object): it comes back here only
//     once the graph and every execution of it are gone, and is then given to a later capture of
//     the same size or less; nothing is ever freed (no cudaFree while any stream may capture), so
//     memory stays at the most tables graphs ever held at once;
//   * the graph takes the table before the copy into it is captured, so a captured copy always
//     writes a table its graph owns; a failure before the graph holds it gives the table back.
// So no table memory comes from a graph pool, each graph has its own written table whatever
// order graphs replay in, nothing a live graph may read is reused, and no lock is held past the
// call.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace inductor_lamb {

// What the store needs of the device runtime: CUDA's (cuda/tensor_table.cpp) or a test's.
class TableRuntime {
 public:
  virtual ~TableRuntime() = default;
  // Whether the current stream is capturing a graph.
  virtual bool capturing() = 0;
  // The device the allocations and copies below are on (the call's: a table is only ever given
  // to a capture on the device it was made on).
  virtual int device() = 0;
  // `bytes` of device memory outside every memory pool / of pinned host memory (never freed).
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void* alloc_host(size_t bytes) = 0;
  // Enqueues (captures) the copy of `bytes` from pinned `src` to device `dst` on the current stream.
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  // Makes the graph being captured own `arg`: `release(arg)` runs once the graph and every
  // execution of it are gone (on any thread; it makes no runtime call).
  virtual void give_to_graph(void (*release)(void*), void* arg) = 0;
};

class GraphTables {
 public:
  GraphTables() = default;
  GraphTables(const GraphTables&) = delete;
  GraphTables& operator=(const GraphTables&) = delete;

  // The device copy of `bytes` for a call being captured on the current stream, owned by the
  // captured graph. Throws, giving back what it took, where the runtime fails.
  const void* capture(TableRuntime& rt, const void* bytes, size_t size);

  struct Counts {
    int64_t held;       // tables a live graph holds
    int64_t spare;      // tables whose graph is gone, kept for later captures
    int64_t allocated;  // tables ever allocated (held + spare)
    int64_t bytes;      // their device bytes (the same again in pinned host memory)
  };
  Counts counts() const;

 private:
  struct Table {
    GraphTables* owner;
    int device_index;  // the device `device` is on
    void* device;
    void* host;
    size_t capacity;
  };
  static void on_graph_gone(void* table);  // (TableRuntime::give_to_graph's release)
  Table* take(TableRuntime& rt, size_t size);
  void put_back(Table* t);

  mutable std::mutex mu_;
  std::vector<Table*> spare_;  // (every Table ever made is held or here: never deleted)
  int64_t held_ = 0, allocated_ = 0, bytes_ = 0;
};

// The process's store of graph-owned tables (CUDA calls).
GraphTables& graph_tables();

}  // namespace inductor_lamb
