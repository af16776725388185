/* A fake CUDA driver for tests: exports every driver entry point kl_runtime.h's driver()
 * loads, records what the runtime asks of it, and can be told to fail any call.
 *
 * TEST ONLY. The runtime loads it instead of libcuda.so.1 when the environment variable
 * KERNEL_LENS_TEST_CUDA_DRIVER names it (docs/testing.md). Device memory is host memory:
 * tests pass host pointers as device pointers, cuMemcpyDtoDAsync is memcpy.
 *
 * Contexts are opaque pointers chosen by the test. fake_set_context(ctx, id) gives `ctx`
 * the unique id cuCtxGetId reports and makes it the context of every stream (cuStreamGetCtx);
 * fake_set_current(ctx) sets the bottom of the current-context stack. Changing the id of a
 * context models one destroyed and recreated at the same address.
 *
 * Build: cc -shared -fPIC -o libfake_cuda.so fake_cuda.c
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  ERR_INVALID_VALUE = 1,
  ERR_NOT_INITIALIZED = 3,
  ERR_INVALID_CONTEXT = 201,
  ERR_INVALID_HANDLE = 400,
  ERR_NOT_FOUND = 500,
};

#define MAX_FAILS 32
#define MAX_CTXS 16
#define MAX_STACK 16
#define MAX_MODULES 64
#define MAX_LAUNCHES 64
#define MAX_PARAMS 64  /* liger kernels take 30+ */
#define PARAM_BYTES 1024  /* TMA descriptors take 128 each */
#define IMAGE_BYTES 16
#define MAX_ATTRS 8

struct fail_rule { char name[64]; int result; };
struct module { int live; unsigned char image[IMAGE_BYTES]; const void* image_ptr; };
struct launch {
  void* func;
  unsigned grid[3], block[3], shared;
  void* stream;
  int param_bytes;
  unsigned char params[PARAM_BYTES];
  int ex;                     /* 1: launched by cuLaunchKernelEx */
  int nattrs;                 /* its attributes: id and the value's first int */
  int attrs[MAX_ATTRS][2];
};

static struct {
  int initialized;
  struct fail_rule fails[MAX_FAILS];
  int nfails;
  void* ctxs[MAX_CTXS];
  unsigned long long ids[MAX_CTXS];
  int nctxs;
  void* stream_ctx;
  void* stack[MAX_STACK];
  int depth;
  int pushes, pops;
  int major, minor, optin;
  struct module modules[MAX_MODULES];
  int nmodules, unloads;
  int last_unloaded;  /* module index, -1 if none */
  char functions[MAX_MODULES];  /* function handle i belongs to module i */
  char last_function_name[128];
  int func_attr, func_attr_value;
  int param_sizes[MAX_PARAMS];
  int nparam_sizes;
  struct launch launches[MAX_LAUNCHES];
  int nlaunches;
  int copies, memsets, tensor_maps;
} S;

EXPORT void fake_reset(void) {
  memset(&S, 0, sizeof S);
  S.major = 9;
  S.minor = 0;
  S.optin = 227 * 1024;
  S.last_unloaded = -1;
  S.nparam_sizes = 0;
}

__attribute__((constructor)) static void fake_init(void) { fake_reset(); }

/* ---- control and inspection (called by tests through dlsym) ------------------------------ */
EXPORT void fake_fail(const char* name, int result) {
  for (int i = 0; i < S.nfails; ++i) {
    if (strcmp(S.fails[i].name, name) == 0) {
      S.fails[i].result = result;
      return;
    }
  }
  if (S.nfails < MAX_FAILS) {
    strncpy(S.fails[S.nfails].name, name, sizeof S.fails[0].name - 1);
    S.fails[S.nfails].result = result;
    ++S.nfails;
  }
}

EXPORT void fake_set_context(void* ctx, unsigned long long id) {
  S.stream_ctx = ctx;
  for (int i = 0; i < S.nctxs; ++i) {
    if (S.ctxs[i] == ctx) {
      S.ids[i] = id;
      return;
    }
  }
  if (S.nctxs < MAX_CTXS) {
    S.ctxs[S.nctxs] = ctx;
    S.ids[S.nctxs] = id;
    ++S.nctxs;
  }
}
EXPORT void fake_set_current(void* ctx) {
  S.stack[0] = ctx;
  if (S.depth == 0) S.depth = 1;
  if (ctx == NULL && S.depth == 1) S.depth = 0;
}
EXPORT void* fake_current(void) { return S.depth > 0 ? S.stack[S.depth - 1] : NULL; }
EXPORT int fake_ctx_depth(void) { return S.depth; }
EXPORT int fake_push_count(void) { return S.pushes; }
EXPORT int fake_pop_count(void) { return S.pops; }
EXPORT void fake_set_arch(int major, int minor, int optin) {
  S.major = major;
  S.minor = minor;
  S.optin = optin;
}
/* The byte size of each kernel parameter of the next launches (the driver cannot know it). */
EXPORT void fake_set_param_sizes(const int* sizes, int n) {
  S.nparam_sizes = n < MAX_PARAMS ? n : MAX_PARAMS;
  for (int i = 0; i < S.nparam_sizes; ++i) S.param_sizes[i] = sizes[i];
}
EXPORT int fake_module_loads(void) { return S.nmodules; }
EXPORT int fake_module_unloads(void) { return S.unloads; }
EXPORT int fake_live_modules(void) {
  int n = 0;
  for (int i = 0; i < S.nmodules; ++i) n += S.modules[i].live;
  return n;
}
EXPORT int fake_last_unloaded(void) { return S.last_unloaded; }
/* The first bytes of module load i's image (copied at load time), and its pointer. */
EXPORT const unsigned char* fake_module_image(int i) { return i >= 0 && i < S.nmodules ? S.modules[i].image : NULL; }
EXPORT const void* fake_module_image_ptr(int i) { return i >= 0 && i < S.nmodules ? S.modules[i].image_ptr : NULL; }
EXPORT const char* fake_last_function_name(void) { return S.last_function_name; }
EXPORT int fake_func_attribute_value(void) { return S.func_attr_value; }
EXPORT int fake_launch_count(void) { return S.nlaunches; }
/* Launch i: out[0..6] = grid x, y, z, block x, y, z, shared bytes; returns its module index. */
EXPORT int fake_launch_info(int i, unsigned* out) {
  if (i < 0 || i >= S.nlaunches) return -1;
  const struct launch* l = &S.launches[i];
  for (int k = 0; k < 3; ++k) out[k] = l->grid[k], out[3 + k] = l->block[k];
  out[6] = l->shared;
  return (int)((char*)l->func - S.functions);
}
/* Launch i's parameters, each parameter's bytes in order; returns the byte count. */
EXPORT int fake_launch_params(int i, unsigned char* out, int cap) {
  if (i < 0 || i >= S.nlaunches) return -1;
  int n = S.launches[i].param_bytes < cap ? S.launches[i].param_bytes : cap;
  memcpy(out, S.launches[i].params, (size_t)n);
  return n;
}
/* Launch i's attributes as (id, value) pairs into out (2 ints each); returns how many, or -1 for
 * a launch by cuLaunchKernel (no attributes possible). */
EXPORT int fake_launch_attrs(int i, int* out, int cap) {
  if (i < 0 || i >= S.nlaunches) return -2;
  const struct launch* l = &S.launches[i];
  if (!l->ex) return -1;
  for (int k = 0; k < l->nattrs && 2 * k + 1 < cap; ++k) out[2 * k] = l->attrs[k][0], out[2 * k + 1] = l->attrs[k][1];
  return l->nattrs;
}
EXPORT int fake_copy_count(void) { return S.copies; }

/* ---- the driver API ------------------------------------------------------------------------ */
static int failing(const char* name, CUresult* r) {
  for (int i = 0; i < S.nfails; ++i) {
    if (strcmp(S.fails[i].name, name) == 0 && S.fails[i].result != 0) {
      *r = S.fails[i].result;
      return 1;
    }
  }
  return 0;
}
#define FAIL_IF_TOLD(name)        \
  do {                            \
    CUresult fr_;                 \
    if (failing(name, &fr_)) return fr_; \
  } while (0)

EXPORT CUresult cuInit(unsigned flags) {
  FAIL_IF_TOLD("cuInit");
  if (flags != 0) return ERR_INVALID_VALUE;
  S.initialized = 1;
  return OK;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char** name) {
  static const struct { int code; const char* name; } names[] = {
      {0, "CUDA_SUCCESS"},
      {1, "CUDA_ERROR_INVALID_VALUE"},
      {2, "CUDA_ERROR_OUT_OF_MEMORY"},
      {3, "CUDA_ERROR_NOT_INITIALIZED"},
      {201, "CUDA_ERROR_INVALID_CONTEXT"},
      {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
      {218, "CUDA_ERROR_INVALID_PTX"},
      {400, "CUDA_ERROR_INVALID_HANDLE"},
      {500, "CUDA_ERROR_NOT_FOUND"},
      {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
      {999, "CUDA_ERROR_UNKNOWN"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    if (names[i].code == r) {
      *name = names[i].name;
      return OK;
    }
  }
  *name = NULL;
  return ERR_INVALID_VALUE;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  FAIL_IF_TOLD("cuCtxGetCurrent");
  *ctx = fake_current();
  return OK;
}

EXPORT CUresult cuCtxGetDevice(int* dev) {
  FAIL_IF_TOLD("cuCtxGetDevice");
  if (fake_current() == NULL) return ERR_INVALID_CONTEXT;
  *dev = 0;
  return OK;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAIL_IF_TOLD("cuCtxPushCurrent_v2");
  if (ctx == NULL || S.depth >= MAX_STACK) return ERR_INVALID_CONTEXT;
  S.stack[S.depth++] = ctx;
  ++S.pushes;
  return OK;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  FAIL_IF_TOLD("cuCtxPopCurrent_v2");
  if (S.depth == 0) return ERR_INVALID_CONTEXT;
  void* top = S.stack[--S.depth];
  if (ctx != NULL) *ctx = top;
  ++S.pops;
  return OK;
}

EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  (void)stream;
  FAIL_IF_TOLD("cuStreamGetCtx");
  if (S.stream_ctx == NULL) return ERR_INVALID_CONTEXT;
  *ctx = S.stream_ctx;
  return OK;
}

/* Built with -DFAKE_NO_CTX_GET_ID it models a pre-12.0 driver without cuCtxGetId. */
#ifndef FAKE_NO_CTX_GET_ID
EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  FAIL_IF_TOLD("cuCtxGetId");
  for (int i = 0; i < S.nctxs; ++i) {
    if (S.ctxs[i] == ctx) {
      *id = S.ids[i];
      return OK;
    }
  }
  return ERR_INVALID_CONTEXT;
}
#endif

EXPORT CUresult cuDeviceGetAttribute(int* value, int attr, int dev) {
  FAIL_IF_TOLD("cuDeviceGetAttribute");
  if (dev != 0) return ERR_INVALID_VALUE;
  switch (attr) {
    case 75: *value = S.major; return OK;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = S.minor; return OK;   /* COMPUTE_CAPABILITY_MINOR */
    case 97: *value = S.optin; return OK;   /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: return ERR_INVALID_VALUE;
  }
}

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAIL_IF_TOLD("cuModuleLoadData");
  if (fake_current() == NULL) return ERR_INVALID_CONTEXT;
  if (image == NULL || S.nmodules >= MAX_MODULES) return ERR_INVALID_VALUE;
  struct module* m = &S.modules[S.nmodules];
  m->live = 1;
  m->image_ptr = image;
  memcpy(m->image, image, IMAGE_BYTES);  /* every test image is at least this long */
  *module = &S.modules[S.nmodules];
  ++S.nmodules;
  return OK;
}

static int module_index(CUmodule module) {
  for (int i = 0; i < S.nmodules; ++i)
    if ((void*)&S.modules[i] == module) return i;
  return -1;
}

EXPORT CUresult cuModuleUnload(CUmodule module) {
  FAIL_IF_TOLD("cuModuleUnload");
  int i = module_index(module);
  if (i < 0 || !S.modules[i].live) return ERR_INVALID_HANDLE;
  S.modules[i].live = 0;
  S.last_unloaded = i;
  ++S.unloads;
  return OK;
}

EXPORT CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  FAIL_IF_TOLD("cuModuleGetFunction");
  int i = module_index(module);
  if (i < 0 || !S.modules[i].live) return ERR_INVALID_HANDLE;
  strncpy(S.last_function_name, name, sizeof S.last_function_name - 1);
  *fn = &S.functions[i];
  return OK;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction fn, int attr, int value) {
  FAIL_IF_TOLD("cuFuncSetAttribute");
  if (fn == NULL) return ERR_INVALID_HANDLE;
  S.func_attr = attr;
  S.func_attr_value = value;
  return OK;
}

static CUresult record_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  if (fn == NULL || extra != NULL || fake_current() == NULL) return ERR_INVALID_VALUE;
  int idx = (int)((char*)fn - S.functions);
  if (idx < 0 || idx >= S.nmodules || !S.modules[idx].live) return ERR_INVALID_HANDLE;
  if (S.nlaunches >= MAX_LAUNCHES) return ERR_INVALID_VALUE;
  struct launch* l = &S.launches[S.nlaunches];
  memset(l, 0, sizeof *l);
  l->func = fn;
  l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
  l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
  l->shared = shared;
  l->stream = stream;
  for (int k = 0; k < S.nparam_sizes; ++k) {
    int size = S.param_sizes[k];
    if (l->param_bytes + size > PARAM_BYTES) break;
    memcpy(l->params + l->param_bytes, params[k], (size_t)size);
    l->param_bytes += size;
  }
  ++S.nlaunches;
  return OK;
}

EXPORT CUresult cuLaunchKernel(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  FAIL_IF_TOLD("cuLaunchKernel");
  return record_launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

/* cuda.h's CUlaunchAttribute (id, 4 bytes of padding, a 64-byte value) and CUlaunchConfig. */
typedef struct { int id; char pad[4]; union { char bytes[64]; int i; } value; } CUlaunchAttribute;
typedef struct {
  unsigned gx, gy, gz, bx, by, bz, shared;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned nattrs;
} CUlaunchConfig;

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction fn, void** params, void** extra) {
  FAIL_IF_TOLD("cuLaunchKernelEx");
  if (c == NULL || c->nattrs > MAX_ATTRS || (c->nattrs > 0 && c->attrs == NULL)) return ERR_INVALID_VALUE;
  CUresult r = record_launch(fn, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shared, c->stream, params, extra);
  if (r != OK) return r;
  struct launch* l = &S.launches[S.nlaunches - 1];
  l->ex = 1;
  l->nattrs = (int)c->nattrs;
  for (unsigned k = 0; k < c->nattrs; ++k) l->attrs[k][0] = c->attrs[k].id, l->attrs[k][1] = c->attrs[k].value.i;
  return OK;
}

/* A CUtensorMap is opaque; the fake writes the encoding's arguments into its 128 bytes so tests
 * can check them: bytes 0-5 data type, rank, interleave, swizzle, L2 promotion, OOB fill (u8
 * each), 8 the address (u64), 16 the 5 global dims (u64), 56 the 4 global byte strides (u64),
 * 88 the 5 box dims (u32), 108 the 5 element strides (u32); unused entries are 0. */
EXPORT CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address,
                                       const uint64_t* dims, const uint64_t* strides,
                                       const unsigned* box, const unsigned* element_strides,
                                       int interleave, int swizzle, int l2, int fill) {
  FAIL_IF_TOLD("cuTensorMapEncodeTiled");
  if (map == NULL || rank < 1 || rank > 5) return ERR_INVALID_VALUE;
  unsigned char* m = (unsigned char*)map;
  memset(m, 0, 128);
  m[0] = (unsigned char)type, m[1] = (unsigned char)rank, m[2] = (unsigned char)interleave;
  m[3] = (unsigned char)swizzle, m[4] = (unsigned char)l2, m[5] = (unsigned char)fill;
  uint64_t addr = (uint64_t)(uintptr_t)address;
  memcpy(m + 8, &addr, 8);
  memcpy(m + 16, dims, 8 * (size_t)rank);
  memcpy(m + 56, strides, 8 * (size_t)(rank - 1));
  memcpy(m + 88, box, 4 * (size_t)rank);
  memcpy(m + 108, element_strides, 4 * (size_t)rank);
  ++S.tensor_maps;
  return OK;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  (void)stream;
  FAIL_IF_TOLD("cuMemcpyDtoDAsync_v2");
  if (fake_current() == NULL) return ERR_INVALID_CONTEXT;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
  ++S.copies;
  return OK;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream) {
  (void)stream;
  FAIL_IF_TOLD("cuMemsetD8Async");
  if (fake_current() == NULL) return ERR_INVALID_CONTEXT;
  memset((void*)(uintptr_t)dst, value, bytes);
  ++S.memsets;
  return OK;
}
