// The kernel timeline of any CUDA program, graph nodes included: a CUPTI injection library
// (the driver loads it at initialization when CUDA_INJECTION64_PATH names it), recording every
// kernel's device start and end through CUPTI's concurrent-kernel activity — which, unlike the
// serializing kernel activity or Nsight Compute, leaves launches overlapping as they would
// (programmatic dependent launch included) — into a tab-separated file.
//
// Why: a one-token decode step is a CUDA graph of ~150 kernels chained by PDL; per-kernel
// profiles serialize them and lab loops of one kernel keep its code and operands warm, and
// neither adds up to the step (docs/perf.md, versions 30 and 31). The graphed step's own timeline
// says where its time goes: each kernel's duration, how far it overlapped its predecessor, and the
// idle gaps between them (scripts/device/kernel_timeline.py reads the file).
//
// Usage: DEEPINFER_KERNEL_TRACE=trace.tsv
//        CUDA_INJECTION64_PATH=.../libdeepinfer_kernel_trace.so deepinfer bench ...
//        (both in the traced program's environment)
// Output, one line per kernel, memory copy and memset in completion order of CUPTI's buffers (sort
// by start):
//   start_ns end_ns correlation graph_id graph_node_id stream grid block dyn_smem name
// graph_id 0: launched outside a graph; a graph launch's records share its correlation id. A
// kernel's name is demangled, its parameter list dropped; a copy or memset has grid and block 0,
// its bytes in the dyn_smem column and the name "[memcpy HtoD]" (the direction), "[memset]".
// Errors go to stderr and tracing stops; the traced program runs on either way.
#include <cupti.h>
#include <cxxabi.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

namespace {

constexpr size_t kBufferBytes = 8u << 20;  // per CUPTI activity buffer
constexpr size_t kAlign = 8;               // CUPTI's buffer alignment

std::mutex g_mutex;
FILE* g_out = nullptr;

// A kernel's name demangled, without its parameter list: "ns::kernel<T, 2>".
std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // The parameter list: from the first '(' outside template arguments that does not open
  // "(anonymous namespace)".
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (c == '(' && depth == 0 && i > 0 && s.compare(i, 12, "(anonymous n") != 0) {
      s.resize(i);
      break;
    }
  }
  for (char& c : s)
    if (c == '\t' || c == '\n') c = ' ';
  return s;
}

// A copy's direction, as Nsight names it.
const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void report(const char* what, CUptiResult r) {
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "deepinfer_kernel_trace: %s failed: %s\n", what, msg != nullptr ? msg : "?");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = std::aligned_alloc(kAlign, kBufferBytes);
  *buffer = static_cast<uint8_t*>(p);
  *size = p != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (g_out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        std::fprintf(g_out, "%llu\t%llu\t%u\t%u\t%llu\t%u\t%d\t%d\t%d\t%s\n", static_cast<unsigned long long>(k->start),
                     static_cast<unsigned long long>(k->end), k->correlationId, k->graphId,
                     static_cast<unsigned long long>(k->graphNodeId), k->streamId, k->gridX * k->gridY * k->gridZ,
                     k->blockX * k->blockY * k->blockZ, k->dynamicSharedMemory, short_name(k->name).c_str());
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // grid, block 0; dyn_smem: the bytes
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        std::fprintf(g_out, "%llu\t%llu\t%u\t%u\t%llu\t%u\t0\t0\t%llu\t[memcpy %s]\n",
                     static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end),
                     m->correlationId, m->graphId, static_cast<unsigned long long>(m->graphNodeId), m->streamId,
                     static_cast<unsigned long long>(m->bytes), copy_kind(m->copyKind));
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        std::fprintf(g_out, "%llu\t%llu\t%u\t%u\t%llu\t%u\t0\t0\t%llu\t[memset]\n",
                     static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end),
                     m->correlationId, m->graphId, static_cast<unsigned long long>(m->graphNodeId), m->streamId,
                     static_cast<unsigned long long>(m->bytes));
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
      std::fprintf(stderr, "deepinfer_kernel_trace: %zu records dropped\n", dropped);
  }
  std::free(buffer);
}

void at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out != nullptr) {
    std::fclose(g_out);
    g_out = nullptr;
  }
}

}  // namespace

// Called by the CUDA driver at initialization (CUDA_INJECTION64_PATH). Returns 1 (success) even
// when tracing could not start, so the program runs untraced rather than failing.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  const char* path = std::getenv("DEEPINFER_KERNEL_TRACE");
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr, "deepinfer_kernel_trace: DEEPINFER_KERNEL_TRACE (the output file) is not set; not tracing\n");
    return 1;
  }
  g_out = std::fopen(path, "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "deepinfer_kernel_trace: cannot open %s: %s; not tracing\n", path, std::strerror(errno));
    return 1;
  }
  std::fprintf(g_out, "start_ns\tend_ns\tcorrelation\tgraph_id\tgraph_node_id\tstream\tgrid\tblock\tdyn_smem\tname\n");
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    report("cuptiActivityRegisterCallbacks", r);
    return 1;
  }
  for (const auto& [kind, what] : {std::pair{CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL"},
                                   std::pair{CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY"},
                                   std::pair{CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET"}}) {
    r = cuptiActivityEnable(kind);
    if (r != CUPTI_SUCCESS) {
      report(what, r);
      return 1;
    }
  }
  std::atexit(at_exit);
  return 1;
}
