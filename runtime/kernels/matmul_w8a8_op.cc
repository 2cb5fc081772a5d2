// MatMulW8A8 (domain ai.specrt, version 1): y = x W with W int8 per output column, activations
// quantized to int8 per token (row), in the packed layout of matmul_w8a8.h.
//
//   x [..., K] float ───────────────────┐
//   packed [ceil(N/16), K/4, 64] int8 ──┼─► y [..., N] float        attributes K, N
//   scale [N] float ────────────────────┤
//   bias [N] float (optional) ──────────┘   y = x W + bias, the bias added after each output's product
//
// Exact by construction: a row's output is computed by the same code in the same order whatever
// the number of rows beside it, the split of tiles over onnxruntime's threads and the instruction
// set (its sums are integers), so a verify window's rows equal single steps bit for bit on every
// CPU. The rows of one call share each weight load.
#include <string>
#include <vector>

#include "ort_glue.h"

namespace specrt {
namespace {

constexpr const char* kOpName = "MatMulW8A8";

OrtStatus* fail(const std::string& message) { return specrt::fail(kOpName, message); }

struct MatMulW8A8Kernel {
  int64_t k = 0, n = 0;
  const Isa* isa = nullptr;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    Tensor x, packed, scale, bias;
    if (OrtStatus* status = read_input(context, 0, kOpName, "x", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &x)) return status;
    if (OrtStatus* status = read_input(context, 1, kOpName, "packed", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, &packed))
      return status;
    if (OrtStatus* status = read_input(context, 2, kOpName, "scale", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &scale))
      return status;
    if (x.shape.empty() || x.shape.back() != k)
      return fail("x has shape " + shape_text(x.shape) + ", expected [..., K] with K=" + std::to_string(k));
    const int64_t tiles = (n + kW8Tile - 1) / kW8Tile, groups = k / kW8Group;
    if (packed.shape != std::vector<int64_t>{tiles, groups, kW8GroupBytes})
      return fail("packed has shape " + shape_text(packed.shape) + ", expected " +
                  shape_text({tiles, groups, kW8GroupBytes}) + " for K=" + std::to_string(k) + ", N=" + std::to_string(n));
    if (scale.shape != std::vector<int64_t>{n})
      return fail("scale has shape " + shape_text(scale.shape) + ", expected [" + std::to_string(n) + "]");
    if (OrtStatus* status = read_input(context, 3, kOpName, "bias", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &bias, true))
      return status;
    if (bias.value && bias.shape != std::vector<int64_t>{n})
      return fail("bias has shape " + shape_text(bias.shape) + ", expected [" + std::to_string(n) + "]");
    std::vector<int64_t> shape = x.shape;
    shape.back() = n;
    float* y = nullptr;
    if (OrtStatus* status = output(context, 0, shape, &y)) return status;
    const int64_t m = x.elements() / k;
    if (m == 0) return nullptr;

    thread_local std::vector<int8_t> xq;  // per calling thread; grows to the largest pass seen
    thread_local std::vector<float> a_scale;
    thread_local std::vector<int32_t> offset;
    xq.resize(static_cast<size_t>(m * k));
    a_scale.resize(static_cast<size_t>(m));
    offset.resize(static_cast<size_t>(m));
    const QuantizedTokens tokens{xq.data(), a_scale.data(), offset.data()};
    const W8Weights w{k, n, static_cast<const int8_t*>(packed.data), static_cast<const float*>(scale.data),
                      bias.value ? static_cast<const float*>(bias.data) : nullptr};
    return run_weight_product(context, static_cast<const float*>(x.data), k, m, isa->quantize_tokens, tokens,
                              isa->matmul_w8a8, w, tiles, y);
  }
};

struct MatMulW8A8Op : Ort::CustomOpBase<MatMulW8A8Op, MatMulW8A8Kernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& ort, const OrtKernelInfo* info, void** kernel) const {
    auto* made = new MatMulW8A8Kernel();
    OrtStatus* status = ort.KernelInfoGetAttribute_int64(info, "K", &made->k);
    if (!status) status = ort.KernelInfoGetAttribute_int64(info, "N", &made->n);
    if (!status && (made->k < kW8Group || made->k % kW8Group || made->k > kW8MaxK || made->n < 1))
      status = fail("K=" + std::to_string(made->k) + ", N=" + std::to_string(made->n) + ": expected K a positive "
                    "multiple of 4 up to " + std::to_string(kW8MaxK) + " and N positive");
    return finish_kernel(kOpName, status, made, kernel);
  }
  const char* GetName() const { return kOpName; }
  size_t GetInputTypeCount() const { return 4; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

const OrtCustomOp* matmul_w8a8_op() {
  static MatMulW8A8Op op;
  return &op;
}

}  // namespace specrt
