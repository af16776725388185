// Runs a kernel_lens-compiled model with ONNX Runtime's C++ API and no Python.
//
//   run_model MODEL.onnx LIBRARY.so OUT.bin IN0.bin:dtype:d0xd1x... [IN1.bin:...]
//
// Each input is a raw little-endian file plus its element type (f32, f16, i64, i32) and
// shape; the first output is written raw to OUT.bin. ORT's CUDA execution provider runs
// the graph; the kernel_lens custom-op library launches the Triton kernels.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"

namespace {

struct Input {
  std::vector<char> data;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type;
};

ONNXTensorElementDataType parse_type(const std::string& t) {
  if (t == "f32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  if (t == "f16") return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  if (t == "i64") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  if (t == "i32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  throw std::runtime_error("unknown element type " + t + " (use f32, f16, i64 or i32)");
}

Input read_input(const std::string& spec) {
  std::istringstream parts(spec);
  std::string path, type, dims;
  std::getline(parts, path, ':');
  std::getline(parts, type, ':');
  std::getline(parts, dims, ':');
  Input in;
  in.type = parse_type(type);
  std::istringstream ds(dims);
  for (std::string d; std::getline(ds, d, 'x');) in.shape.push_back(std::stoll(d));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  in.data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: run_model MODEL.onnx LIBRARY.so OUT.bin IN.bin:dtype:d0xd1 ...\n";
    return 2;
  }
  try {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "kernel_lens");
    Ort::SessionOptions options;
    options.RegisterCustomOpsLibrary(argv[2]);
    OrtCUDAProviderOptionsV2* cuda = nullptr;
    Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda));
    // Full fp32 matmuls (ORT's CUDA EP defaults to TF32), as PyTorch does by default.
    const char* keys[] = {"use_tf32"};
    const char* vals[] = {"0"};
    Ort::ThrowOnError(Ort::GetApi().UpdateCUDAProviderOptions(cuda, keys, vals, 1));
    options.AppendExecutionProvider_CUDA_V2(*cuda);
    Ort::GetApi().ReleaseCUDAProviderOptions(cuda);
    Ort::Session session(env, argv[1], options);

    Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    std::vector<Input> inputs;
    std::vector<Ort::Value> values;
    for (int i = 4; i < argc; ++i) inputs.push_back(read_input(argv[i]));
    for (auto& in : inputs)
      values.push_back(Ort::Value::CreateTensor(cpu, in.data.data(), in.data.size(), in.shape.data(),
                                                in.shape.size(), in.type));
    Ort::AllocatorWithDefaultOptions allocator;
    std::vector<Ort::AllocatedStringPtr> names;
    std::vector<const char*> in_names, out_names;
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
      names.push_back(session.GetInputNameAllocated(i, allocator));
      in_names.push_back(names.back().get());
    }
    names.push_back(session.GetOutputNameAllocated(0, allocator));
    out_names.push_back(names.back().get());
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_names.data(), values.data(), values.size(),
                               out_names.data(), out_names.size());
    auto info = outputs[0].GetTensorTypeAndShapeInfo();
    size_t item = 0;
    switch (info.GetElementType()) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: item = 2; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: item = 4; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: item = 8; break;
      default: throw std::runtime_error("output element type not handled by this example");
    }
    const size_t bytes = info.GetElementCount() * item;
    std::ofstream out(argv[3], std::ios::binary);
    out.write(static_cast<const char*>(outputs[0].GetTensorRawData()), static_cast<std::streamsize>(bytes));
    std::cout << "ok: " << info.GetElementCount() << " elements written to " << argv[3] << "\n";
  } catch (const std::exception& e) {
    std::cerr << "run_model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
