// kernel_lens runtime shared by every target (ONNX Runtime custom ops, TensorRT plugins).
//
// What the targets have in common lives here once: loading the CUDA driver lazily with
// dlopen (so plugin libraries build and load on hosts without a GPU or driver), loading
// kernel modules once per CUDA context, choosing the binary for the running device,
// launching with Triton's ABI (hidden scratch pointers, dynamic shared memory), and error
// text that names the kernel and the CUresult. A target only adapts its host API to
// kl::LaunchContext.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kl_symbolic.h"

namespace kl {

// ---- CUDA driver API, declared here so no CUDA header or library is needed to build ----------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;

constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kAttrMaxSharedOptin = 97;          // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kFuncAttrMaxDynamicShared = 8;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
};

// Errors are plain strings; empty means success. Each target converts them to its own status.
using Status = std::string;

inline std::string result_name(const Driver& d, CUresult r) {
  const char* name = nullptr;
  if (d.cuGetErrorName != nullptr && d.cuGetErrorName(r, &name) == 0 && name != nullptr) return name;
  return "CUresult " + std::to_string(r);
}

template <typename F>
bool load_symbol(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

// The driver, loaded on first use. On a host without libcuda.so.1 this returns an error
// (at run time only: building and loading the plugin library never needs the driver).
inline const Driver* driver(Status* error) {
  static Driver d;
  static Status load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      load_error = std::string("kernel_lens: cannot load the CUDA driver libcuda.so.1 (") +
                   (why ? why : "unknown reason") + "); a GPU with an NVIDIA driver is required to run";
      return;
    }
    bool ok = load_symbol(lib, "cuInit", &d.cuInit) &&
              load_symbol(lib, "cuGetErrorName", &d.cuGetErrorName) &&
              load_symbol(lib, "cuCtxGetCurrent", &d.cuCtxGetCurrent) &&
              load_symbol(lib, "cuCtxGetDevice", &d.cuCtxGetDevice) &&
              load_symbol(lib, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent) &&
              load_symbol(lib, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent) &&
              load_symbol(lib, "cuStreamGetCtx", &d.cuStreamGetCtx) &&
              load_symbol(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute) &&
              load_symbol(lib, "cuModuleLoadData", &d.cuModuleLoadData) &&
              load_symbol(lib, "cuModuleUnload", &d.cuModuleUnload) &&
              load_symbol(lib, "cuModuleGetFunction", &d.cuModuleGetFunction) &&
              load_symbol(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute) &&
              load_symbol(lib, "cuLaunchKernel", &d.cuLaunchKernel) &&
              load_symbol(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync) &&
              load_symbol(lib, "cuMemsetD8Async", &d.cuMemsetD8Async);
    if (!ok) {
      load_error = "kernel_lens: libcuda.so.1 lacks a required driver entry point; update the NVIDIA driver";
      return;
    }
    CUresult r = d.cuInit(0);
    if (r != 0) load_error = "kernel_lens: cuInit failed: " + result_name(d, r);
  });
  if (!load_error.empty()) {
    *error = load_error;
    return nullptr;
  }
  return &d;
}

#define KL_CHECK(drv, call, what)                                                      \
  do {                                                                                 \
    ::kl::CUresult kl_r_ = (call);                                                     \
    if (kl_r_ != 0) return std::string(what) + ": " + ::kl::result_name(drv, kl_r_);   \
  } while (0)

// ---- compiled binaries ----------------------------------------------------------------------
struct Binary {
  const char* kernel;          // kernel id, for error messages
  int arch;                    // compute capability the cubin is for (e.g. 90)
  bool arch_specific;          // PTX target with an 'a' suffix: runs on exactly `arch`
  const unsigned char* cubin;  // may be null
  size_t cubin_size;
  const char* ptx;             // NUL-terminated PTX, the fallback for other archs
  const char* entry;
  unsigned num_warps;
  unsigned num_ctas;
  unsigned shared;             // dynamic shared memory bytes
  size_t global_scratch_size;  // per program
  size_t global_scratch_align;
  size_t profile_scratch_size;
};

// Loaded functions, one per (context, binary); loading is serialized, lookups are cheap.
class ModuleCache {
 public:
  Status function(const Driver& d, CUcontext ctx, const Binary& b, CUfunction* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto key = std::make_pair(ctx, &b);
    auto it = functions_.find(key);
    if (it != functions_.end()) {
      *out = it->second;
      return {};
    }
    CUdevice dev = 0;
    KL_CHECK(d, d.cuCtxGetDevice(&dev), std::string("kernel ") + b.kernel + ": cuCtxGetDevice");
    int major = 0, minor = 0;
    KL_CHECK(d, d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
    KL_CHECK(d, d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
    const int cc = major * 10 + minor;
    const void* image = nullptr;
    if (b.cubin != nullptr && b.arch == cc) {
      image = b.cubin;
    } else if (b.ptx != nullptr && (b.arch_specific ? b.arch == cc : b.arch <= cc)) {
      image = b.ptx;  // JIT-compiled by the driver (PTX ISA clamped at build time if asked)
    } else {
      return std::string("kernel ") + b.kernel + ": compiled for sm_" + std::to_string(b.arch) +
             ", cannot run on this sm_" + std::to_string(cc) + " device; recompile with --arch sm_" +
             std::to_string(cc);
    }
    CUmodule module = nullptr;
    KL_CHECK(d, d.cuModuleLoadData(&module, image), std::string("kernel ") + b.kernel + ": cuModuleLoadData");
    CUfunction fn = nullptr;
    Status s = prepare(d, dev, module, b, &fn);
    if (!s.empty()) {
      d.cuModuleUnload(module);  // do not leak the module on a failed setup
      return s;
    }
    functions_[key] = fn;
    *out = fn;
    return {};
  }

 private:
  static Status prepare(const Driver& d, CUdevice dev, CUmodule module, const Binary& b, CUfunction* fn) {
    KL_CHECK(d, d.cuModuleGetFunction(fn, module, b.entry), std::string("kernel ") + b.kernel + ": cuModuleGetFunction");
    if (b.shared > 48 * 1024) {
      int optin = 0;
      KL_CHECK(d, d.cuDeviceGetAttribute(&optin, kAttrMaxSharedOptin, dev), "cuDeviceGetAttribute");
      if (static_cast<int>(b.shared) > optin)
        return std::string("kernel ") + b.kernel + ": needs " + std::to_string(b.shared) +
               " bytes of shared memory, the device allows " + std::to_string(optin);
      KL_CHECK(d, d.cuFuncSetAttribute(*fn, kFuncAttrMaxDynamicShared, static_cast<int>(b.shared)),
               std::string("kernel ") + b.kernel + ": cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
    return {};
  }

  std::mutex mutex_;
  std::map<std::pair<CUcontext, const Binary*>, CUfunction> functions_;
};

inline ModuleCache& module_cache() {
  static ModuleCache cache;
  return cache;
}

// ---- what a target provides to the generated launch code --------------------------------------
class LaunchContext {
 public:
  virtual ~LaunchContext() = default;
  virtual int64_t dim(int input, int d) const = 0;             // a node input's dimension
  virtual char* input(int i) const = 0;                        // a node input's device memory
  virtual Status output(int i, const std::vector<int64_t>& shape, char** data) = 0;
  virtual Status scratch(size_t bytes, void** data) = 0;       // temporary device memory
  virtual CUstream stream() const = 0;
};

// Makes the stream's context current for the duration of a launch.
class ContextGuard {
 public:
  ContextGuard(const Driver& d, CUstream s) : d_(d) {
    CUcontext current = nullptr;
    if (d_.cuStreamGetCtx(s, &ctx_) != 0 || ctx_ == nullptr) d_.cuCtxGetCurrent(&ctx_);
    d_.cuCtxGetCurrent(&current);
    if (ctx_ != nullptr && ctx_ != current) pushed_ = d_.cuCtxPushCurrent(ctx_) == 0;
  }
  ~ContextGuard() {
    if (pushed_) {
      CUcontext ignored = nullptr;
      d_.cuCtxPopCurrent(&ignored);
    }
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  CUcontext context() const { return ctx_; }

 private:
  const Driver& d_;
  CUcontext ctx_ = nullptr;
  bool pushed_ = false;
};

inline Status copy_device(const Driver& d, LaunchContext& ctx, char* dst, const char* src, size_t bytes) {
  if (bytes == 0 || dst == src) return {};
  KL_CHECK(d, d.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                                  bytes, ctx.stream()),
           "kernel_lens: copying an in-place tensor (cuMemcpyDtoDAsync)");
  return {};
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// Launch one binary with Triton's ABI: `params` holds the visible arguments; the two hidden
// scratch pointers are appended here. A grid with a zero extent launches nothing, as in Triton.
inline Status launch(const Driver& d, LaunchContext& ctx, const Binary& b, int64_t gx, int64_t gy, int64_t gz,
                     std::vector<void*> params) {
  if (gx < 0 || gy < 0 || gz < 0)
    return std::string("kernel ") + b.kernel + ": negative grid (" + std::to_string(gx) + ", " +
           std::to_string(gy) + ", " + std::to_string(gz) + ")";
  if (gx == 0 || gy == 0 || gz == 0) return {};
  if (gx * b.num_ctas > INT32_MAX || gy > 65535 || gz > 65535)
    return std::string("kernel ") + b.kernel + ": grid (" + std::to_string(gx) + ", " + std::to_string(gy) +
           ", " + std::to_string(gz) + ") exceeds CUDA's limits";
  ContextGuard guard(d, ctx.stream());
  CUfunction fn = nullptr;
  Status s = module_cache().function(d, guard.context(), b, &fn);
  if (!s.empty()) return s;
  void* global_scratch = nullptr;
  void* profile_scratch = nullptr;
  const size_t programs = static_cast<size_t>(gx) * gy * gz * b.num_ctas;
  if (b.global_scratch_size > 0) {
    s = ctx.scratch(b.global_scratch_size * programs, &global_scratch);
    if (!s.empty()) return s;
  }
  if (b.profile_scratch_size > 0) {
    s = ctx.scratch(b.profile_scratch_size * programs, &profile_scratch);
    if (!s.empty()) return s;
  }
  params.push_back(&global_scratch);
  params.push_back(&profile_scratch);
  KL_CHECK(d, d.cuLaunchKernel(fn, static_cast<unsigned>(gx * b.num_ctas), static_cast<unsigned>(gy),
                               static_cast<unsigned>(gz), 32 * b.num_warps, 1, 1, b.shared, ctx.stream(),
                               params.data(), nullptr),
           std::string("kernel ") + b.kernel + ": cuLaunchKernel");
  return {};
}

}  // namespace kl
