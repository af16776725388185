// A stand-in for TensorRT's plugin registry, for testing kernel_lens's registration library
// (serving/kl_trt_register.cpp.j2) where no TensorRT with the 10.x ABI can run: built as a library
// named libnvinfer.so.10 that exports getPluginRegistry(), with IPluginRegistry implemented from the
// real TensorRT 10.14 headers (so the calls go through the real interface's vtable layout). It
// records registerCreator(IPluginCreatorInterface&, namespace) calls; fake_registered() lists them
// as "name/version/namespace" lines.
#include <cstring>
#include <string>
#include <vector>

#include "NvInferRuntime.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using namespace nvinfer1;

namespace {

class Registry final : public IPluginRegistry {
 public:
  bool registerCreator(IPluginCreator&, AsciiChar const* const) noexcept override { return false; }
  IPluginCreator* const* getPluginCreatorList(int32_t* const n) const noexcept override {
    *n = 0;
    return nullptr;
  }
  IPluginCreator* getPluginCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override {
    return nullptr;
  }
  void setErrorRecorder(IErrorRecorder* const) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
  bool deregisterCreator(IPluginCreator const&) noexcept override { return false; }
  bool isParentSearchEnabled() const override { return false; }
  void setParentSearchEnabled(bool const) override {}
  PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
  void deregisterLibrary(PluginLibraryHandle) noexcept override {}
  bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept override {
    if (std::strcmp(creator.getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0) {
      auto& c = static_cast<IPluginCreatorV3One&>(creator);
      record(c.getPluginName(), c.getPluginVersion(), ns);
    } else {
      auto& c = static_cast<IPluginCreator&>(creator);
      record(c.getPluginName(), c.getPluginVersion(), ns);
    }
    return true;
  }
  IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override {
    *n = 0;
    return nullptr;
  }
  IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override {
    return nullptr;
  }
  bool deregisterCreator(IPluginCreatorInterface const&) noexcept override { return false; }
  IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override { return nullptr; }
  int32_t releasePluginResource(AsciiChar const*) noexcept override { return 0; }
  IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept override {
    *n = 0;
    return nullptr;
  }

  std::string registered;

 private:
  void record(AsciiChar const* name, AsciiChar const* version, AsciiChar const* ns) {
    registered += std::string(name) + "/" + version + "/" + (ns ? ns : "") + "\n";
  }
};

Registry g_registry;

}  // namespace

extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept { return &g_registry; }
extern "C" __attribute__((visibility("default"))) const char* fake_registered() { return g_registry.registered.c_str(); }
