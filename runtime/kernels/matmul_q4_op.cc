// MatMulQ4 (domain ai.specrt, version 1): y = x W with W 4-bit in blocks of 32 along K, in the
// packed layout of matmul_q4.h, activations quantized to int8 per row and block.
//
//   x [..., K] float ─┐
//   packed [ceil(N/16), K/32, 256] uint8 ─┼─► y [..., N] float        attributes K, N
//   scales [ceil(N/16), K/32, 16] float16 ┤
//   bias [N] float (optional) ────────────┘   y = x W + bias, the bias added after each output's chain
//
// Exact by construction: a row's output is computed by the same code in the same order whatever
// the number of rows beside it, the split of tiles over onnxruntime's threads and the instruction
// set, so a verify window's rows equal single steps bit for bit on every CPU. The rows of one call
// share each block's weight load and unpack.
#include <string>
#include <vector>

#include "ort_glue.h"

namespace specrt {
namespace {

constexpr const char* kOpName = "MatMulQ4";

OrtStatus* fail(const std::string& message) { return specrt::fail(kOpName, message); }

struct MatMulQ4Kernel {
  int64_t k = 0, n = 0;
  const Isa* isa = nullptr;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    Tensor x, packed, scales, bias;
    if (OrtStatus* status = read_input(context, 0, kOpName, "x", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &x)) return status;
    if (OrtStatus* status = read_input(context, 1, kOpName, "packed", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, &packed))
      return status;
    if (OrtStatus* status = read_input(context, 2, kOpName, "scales", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, &scales))
      return status;
    if (x.shape.empty() || x.shape.back() != k)
      return fail("x has shape " + shape_text(x.shape) + ", expected [..., K] with K=" + std::to_string(k));
    const int64_t tiles = (n + kQ4Tile - 1) / kQ4Tile, blocks = k / kQ4Block;
    if (packed.shape != std::vector<int64_t>{tiles, blocks, kQ4TileBytes})
      return fail("packed has shape " + shape_text(packed.shape) + ", expected " +
                  shape_text({tiles, blocks, kQ4TileBytes}) + " for K=" + std::to_string(k) + ", N=" + std::to_string(n));
    if (scales.shape != std::vector<int64_t>{tiles, blocks, kQ4Tile})
      return fail("scales has shape " + shape_text(scales.shape) + ", expected " + shape_text({tiles, blocks, kQ4Tile}));
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
    thread_local std::vector<float> dx;
    thread_local std::vector<int32_t> offset;
    xq.resize(static_cast<size_t>(m * k));
    dx.resize(static_cast<size_t>(m * blocks));
    offset.resize(static_cast<size_t>(m * blocks));
    const QuantizedRows rows{xq.data(), dx.data(), offset.data()};
    const Q4Weights w{k, n, static_cast<const uint8_t*>(packed.data), static_cast<const uint16_t*>(scales.data),
                      bias.value ? static_cast<const float*>(bias.data) : nullptr};
    return run_weight_product(context, static_cast<const float*>(x.data), k, m, isa->quantize_rows, rows,
                              isa->matmul_q4, w, tiles, y);
  }
};

struct MatMulQ4Op : Ort::CustomOpBase<MatMulQ4Op, MatMulQ4Kernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& ort, const OrtKernelInfo* info, void** kernel) const {
    auto* made = new MatMulQ4Kernel();
    OrtStatus* status = ort.KernelInfoGetAttribute_int64(info, "K", &made->k);
    if (!status) status = ort.KernelInfoGetAttribute_int64(info, "N", &made->n);
    if (!status && (made->k < kQ4Block || made->k % kQ4Block || made->n < 1))
      status = fail("K=" + std::to_string(made->k) + ", N=" + std::to_string(made->n) +
                    ": expected K a positive multiple of 32 and N positive");
    return finish_kernel(kOpName, status, made, kernel);
  }
  const char* GetName() const { return kOpName; }
  size_t GetInputTypeCount() const { return 4; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 3 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
           : index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

const OrtCustomOp* matmul_q4_op() {
  static MatMulQ4Op op;
  return &op;
}

}  // namespace specrt
