// Shared by the library's operators: see ort_glue.h. Also the library's C entry points.
#include "ort_glue.h"

#include <cstdlib>
#include <cstring>
#if defined(SPECRT_AMX_UNITS)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace specrt {
namespace {

const OrtApi* g_api = nullptr;

#if defined(SPECRT_AMX_UNITS)
// AMX with int8 products: the CPU has it (CPUID 7.0 EDX bits 24, 25), the OS saves its state (XCR0
// bits 17, 18) and grants this process the tile data (Linux: arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA; once granted, for every thread of the process).
bool amx_granted() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 24)) || !(edx & (1u << 25))) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE: xgetbv works
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}
#endif

bool cpu_has(const char* isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#if defined(SPECRT_AMX_UNITS)
  if (std::strcmp(isa, "amx") == 0) return cpu_has("avx512vnni") && amx_granted();
#endif
  if (std::strcmp(isa, "avx512vnni") == 0) return cpu_has("avx512") && __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(isa, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma");
  if (std::strcmp(isa, "avxvnni") == 0) return cpu_has("avx2") && __builtin_cpu_supports("avxvnni");
  if (std::strcmp(isa, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  return std::strcmp(isa, "scalar") == 0;
}

const Isa kIsas[] = {
#if defined(SPECRT_AMX_UNITS)
    // AVX-512 VNNI with AMX: MatMulW8A8 from 2 rows and MatMulQ4 from 5 rows on the tile unit
    {"amx", avx512::attend, avx512::swiglu, avx512::quantize_rows, amx::matmul_q4,
     avx512::quantize_tokens, amx::matmul_w8a8},
#endif
#if defined(__x86_64__) || defined(__i386__)
    {"avx512vnni", avx512::attend, avx512::swiglu, avx512::quantize_rows, avx512vnni::matmul_q4,
     avx512::quantize_tokens, avx512vnni::matmul_w8a8},
    {"avx512", avx512::attend, avx512::swiglu, avx512::quantize_rows, avx512::matmul_q4,
     avx512::quantize_tokens, avx512::matmul_w8a8},
    // AVX2 with AVX-VNNI, without AVX-512: the AVX2 kernels but MatMulW8A8's (MatMulQ4's 4-bit codes fit
    // AVX2's 16-bit sums, where int8 weights need the sign trick)
    {"avxvnni", avx2::attend, avx2::swiglu, avx2::quantize_rows, avx2::matmul_q4,
     avx2::quantize_tokens, avxvnni::matmul_w8a8},
    {"avx2", avx2::attend, avx2::swiglu, avx2::quantize_rows, avx2::matmul_q4,
     avx2::quantize_tokens, avx2::matmul_w8a8},
#endif
    {"scalar", scalar::attend, scalar::swiglu, scalar::quantize_rows, scalar::matmul_q4,
     scalar::quantize_tokens, scalar::matmul_w8a8},
};

}  // namespace

const OrtApi& api() { return *g_api; }
void set_api(const OrtApi* table) { g_api = table; }

std::string choose_isa(const Isa** chosen) {
  const char* wanted = std::getenv("SPECRT_KERNEL_ISA");
  for (const Isa& isa : kIsas) {
    if (wanted && *wanted && std::strcmp(wanted, isa.name) != 0) continue;
    if (!cpu_has(isa.name)) {
      if (wanted && *wanted) return std::string("SPECRT_KERNEL_ISA=") + wanted + ": this CPU lacks it";
      continue;
    }
    *chosen = &isa;
    return "";
  }
  return std::string("SPECRT_KERNEL_ISA=") + (wanted ? wanted : "") +
         ": expected scalar, avx2, avxvnni, avx512, avx512vnni or amx";
}

OrtStatus* fail(const char* op, const std::string& message) {
  return g_api->CreateStatus(ORT_INVALID_ARGUMENT, (std::string(op) + ": " + message).c_str());
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t Tensor::elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

OrtStatus* read_input(OrtKernelContext* context, size_t index, const char* op, const char* name,
                      ONNXTensorElementDataType type, Tensor* tensor, bool optional) {
  size_t count = 0;
  if (OrtStatus* status = g_api->KernelContext_GetInputCount(context, &count)) return status;
  if (index < count)
    if (OrtStatus* status = g_api->KernelContext_GetInput(context, index, &tensor->value)) return status;
  if (!tensor->value) return optional ? nullptr : fail(op, std::string("input ") + name + " is missing");
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* status = g_api->GetTensorTypeAndShape(tensor->value, &info)) return status;
  size_t rank = 0;
  ONNXTensorElementDataType got = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  OrtStatus* status = g_api->GetDimensionsCount(info, &rank);
  if (!status) {
    tensor->shape.resize(rank);
    status = g_api->GetDimensions(info, tensor->shape.data(), rank);
  }
  if (!status) status = g_api->GetTensorElementType(info, &got);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (status) return status;
  if (got != type)
    return fail(op, std::string("input ") + name + " must be " +
                        (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT     ? "float32"
                         : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? "float16"
                         : type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8    ? "int8"
                                                                         : "uint8"));
  void* data = nullptr;
  if (OrtStatus* s = g_api->GetTensorMutableData(const_cast<OrtValue*>(tensor->value), &data)) return s;
  tensor->data = data;
  return nullptr;
}

OrtStatus* output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape, float** data) {
  OrtValue* value = nullptr;
  if (OrtStatus* status = g_api->KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value))
    return status;
  void* raw = nullptr;
  if (OrtStatus* status = g_api->GetTensorMutableData(value, &raw)) return status;
  *data = static_cast<float*>(raw);
  return nullptr;
}

}  // namespace specrt

extern "C" {

// The onnxruntime C API version these headers declare: the runtime refuses to load the library
// into an onnxruntime older than it (specrt/backend/kernels.py reads this first, to say so plainly).
int specrt_kernels_api_version() { return ORT_API_VERSION; }

// The instruction set the kernels run with on this CPU (under SPECRT_KERNEL_ISA), or the error.
const char* specrt_kernels_isa() {
  thread_local std::string answer;
  const specrt::Isa* isa = nullptr;
  answer = specrt::choose_isa(&isa);
  return answer.empty() ? isa->name : answer.c_str();
}

OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) {  // an onnxruntime older than these headers: say so through the oldest API it has
    for (uint32_t version = ORT_API_VERSION - 1; version >= 1 && !api; --version) api = api_base->GetApi(version);
    if (!api) return nullptr;
    const std::string message = std::string("specrt kernels were built against onnxruntime API ") +
                                std::to_string(ORT_API_VERSION) + "; this onnxruntime is " +
                                api_base->GetVersionString() + ": upgrade onnxruntime";
    return api->CreateStatus(ORT_FAIL, message.c_str());
  }
  specrt::set_api(api);
  Ort::InitApi(api);
  // One domain for the process, shared by every session: sessions keep pointers to it and to its
  // operators, so all of them live as long as the library.
  static OrtCustomOpDomain* domain = nullptr;
  static OrtStatus* made = [&]() -> OrtStatus* {
    if (OrtStatus* status = api->CreateCustomOpDomain("ai.specrt", &domain)) return status;
    for (const OrtCustomOp* op : {specrt::spec_attention_op(), specrt::swiglu_op(), specrt::matmul_q4_op(),
                                      specrt::matmul_w8a8_op()})
      if (OrtStatus* status = api->CustomOpDomain_Add(domain, const_cast<OrtCustomOp*>(op))) return status;
    return nullptr;
  }();
  if (made) return api->CreateStatus(api->GetErrorCode(made), api->GetErrorMessage(made));
  return api->AddCustomOpDomain(options, domain);
}

}  // extern "C"
