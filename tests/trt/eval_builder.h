// An IExprBuilder that evaluates: TensorRT's IDimensionExpr / IExprBuilder forward to an
// implementation object (mImpl, protected), so the tests implement apiv::VDimensionExpr and
// apiv::VExprBuilder over int64 values instead of building a TensorRT graph. Used by the plugin
// harness (tests/trt/harness.cpp) and the IExprBuilder printer test.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "NvInferRuntime.h"

namespace kl_test {

class Value final : public nvinfer1::apiv::VDimensionExpr {
 public:
  explicit Value(int64_t v) : v_(v) {}
  bool isConstant() const override { return true; }
  int64_t getConstantValue() const override { return v_; }
  bool isSizeTensor() const override { return false; }

 private:
  int64_t v_;
};

class Expr final : public nvinfer1::IDimensionExpr {
 public:
  explicit Expr(int64_t v) : impl_(v) { mImpl = &impl_; }

 private:
  Value impl_;
};

inline int64_t floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

class BuilderImpl final : public nvinfer1::apiv::VExprBuilder {
 public:
  nvinfer1::IDimensionExpr const* constant(int64_t v) override {
    keep_.emplace_back(new Expr(v));
    return keep_.back().get();
  }
  nvinfer1::IDimensionExpr const* operation(nvinfer1::DimensionOperation op, nvinfer1::IDimensionExpr const& x,
                                            nvinfer1::IDimensionExpr const& y) override {
    const int64_t a = x.getConstantValue(), b = y.getConstantValue();
    int64_t r = 0;
    switch (op) {
      case nvinfer1::DimensionOperation::kSUM: r = a + b; break;
      case nvinfer1::DimensionOperation::kPROD: r = a * b; break;
      case nvinfer1::DimensionOperation::kMAX: r = a > b ? a : b; break;
      case nvinfer1::DimensionOperation::kMIN: r = a < b ? a : b; break;
      case nvinfer1::DimensionOperation::kSUB: r = a - b; break;
      case nvinfer1::DimensionOperation::kEQUAL: r = a == b; break;
      case nvinfer1::DimensionOperation::kLESS: r = a < b; break;
      case nvinfer1::DimensionOperation::kFLOOR_DIV: r = floordiv(a, b); break;
      case nvinfer1::DimensionOperation::kCEIL_DIV: r = -floordiv(-a, b); break;
    }
    return constant(r);
  }
  nvinfer1::IDimensionExpr const* declareSizeTensor(int32_t, nvinfer1::IDimensionExpr const&,
                                                    nvinfer1::IDimensionExpr const&) override {
    std::abort();
  }

 private:
  std::vector<std::unique_ptr<Expr>> keep_;
};

class ExprBuilder final : public nvinfer1::IExprBuilder {
 public:
  ExprBuilder() { mImpl = &impl_; }

 private:
  BuilderImpl impl_;
};

}  // namespace kl_test
