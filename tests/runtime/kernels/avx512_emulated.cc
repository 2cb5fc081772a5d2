// specrt's AVX-512 kernel units (compiled against SIMDe, simde_avx512.h) against the scalar units,
// bit for bit: MatMulQ4's and MatMulW8A8's activation quantization and products (AVX-512 BW and VNNI), SwiGLU and
// SpecAttention's per-row attention. Prints "all equal" and exits 0, or names each difference.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention.h"
#include "matmul_q4.h"
#include "matmul_w8a8.h"

using namespace specrt;

namespace {

std::mt19937 gen(1);

std::vector<float> normal(size_t n, float scale) {
  std::normal_distribution<float> draw;
  std::vector<float> v(n);
  for (float& x : v) x = draw(gen) * scale;
  return v;
}

int check_matmul_q4() {
  int failures = 0;
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t k : {32, 96, 896})
    for (int64_t n : {16, 24, 40, 160})
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9}) {
        const int64_t tiles = (n + kQ4Tile - 1) / kQ4Tile, blocks = k / kQ4Block;
        std::vector<uint8_t> packed(static_cast<size_t>(tiles * blocks * kQ4TileBytes));
        for (uint8_t& b : packed) b = static_cast<uint8_t>(byte(gen));
        // binary16 scales: random sign and exponent (subnormals and the largest finite included), random mantissa
        std::uniform_int_distribution<int> bits(0, 0x7BFF);
        std::vector<uint16_t> scales(static_cast<size_t>(tiles * blocks * kQ4Tile));
        for (uint16_t& h : scales) h = static_cast<uint16_t>(bits(gen) | (byte(gen) & 0x80) << 8);
        std::vector<float> x = normal(static_cast<size_t>(m * k), 3.0f);
        if (m > 1) std::memset(x.data() + k, 0, kQ4Block * sizeof(float));  // an all-zero block
        const std::vector<float> bias = normal(static_cast<size_t>(n), 1.0f);
        const Q4Weights w{k, n, packed.data(), scales.data(), m % 2 ? bias.data() : nullptr};  // odd M: with a bias
        std::vector<int8_t> xq[2];
        std::vector<float> dx[2];
        std::vector<int32_t> offset[2];
        QuantizedRows rows[2];
        for (int v = 0; v < 2; ++v) {
          xq[v].resize(static_cast<size_t>(m * k));
          dx[v].resize(static_cast<size_t>(m * blocks));
          offset[v].resize(static_cast<size_t>(m * blocks));
          rows[v] = {xq[v].data(), dx[v].data(), offset[v].data()};
        }
        scalar::quantize_rows(x.data(), k, 0, m, rows[0]);
        avx512::quantize_rows(x.data(), k, 0, m, rows[1]);
        if (xq[0] != xq[1] || dx[0] != dx[1] || offset[0] != offset[1]) {
          std::printf("quantize_rows differs: K=%ld M=%ld\n", static_cast<long>(k), static_cast<long>(m));
          ++failures;
        }
        const MatMulQ4Fn kernels[] = {scalar::matmul_q4, avx512::matmul_q4, avx512vnni::matmul_q4};
        const char* names[] = {"scalar", "avx512", "avx512vnni"};
        std::vector<float> y[3];
        for (int i = 0; i < 3; ++i) {
          y[i].assign(static_cast<size_t>(m * n), -1.0f);
          kernels[i](w, rows[0], m, 0, tiles, y[i].data());
        }
        for (int i = 1; i < 3; ++i)
          if (std::memcmp(y[0].data(), y[i].data(), y[0].size() * sizeof(float))) {
            std::printf("matmul_q4 %s differs: K=%ld N=%ld M=%ld\n", names[i], static_cast<long>(k), static_cast<long>(n),
                        static_cast<long>(m));
            ++failures;
          }
      }
  return failures;
}

int check_matmul_w8a8() {
  int failures = 0;
  std::uniform_int_distribution<int> weight(-127, 127);
  for (int64_t k : {4, 36, 896, 1028})  // 36, 1028: an odd number of groups
    for (int64_t n : {16, 24, 40, 160})
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 16, 29}) {  // 29 = 16 + 8 + 4 + 1: every row block
        const int64_t tiles = (n + kW8Tile - 1) / kW8Tile;
        std::vector<int8_t> packed(static_cast<size_t>(tiles * (k / kW8Group) * kW8GroupBytes));
        for (int8_t& b : packed) b = static_cast<int8_t>(weight(gen));
        packed[0] = 127;
        const std::vector<float> scale = normal(static_cast<size_t>(n), 0.01f), bias = normal(static_cast<size_t>(n), 1.0f);
        std::vector<float> x = normal(static_cast<size_t>(m * k), 3.0f);
        if (m > 1) std::memset(x.data() + k, 0, static_cast<size_t>(k) * sizeof(float));  // an all-zero row
        const W8Weights w{k, n, packed.data(), scale.data(), m % 2 ? bias.data() : nullptr};  // odd M: with a bias
        std::vector<int8_t> xq[2];
        std::vector<float> a_scale[2];
        std::vector<int32_t> offset[2];
        QuantizedTokens tokens[2];
        for (int v = 0; v < 2; ++v) {
          xq[v].resize(static_cast<size_t>(m * k));
          a_scale[v].resize(static_cast<size_t>(m));
          offset[v].resize(static_cast<size_t>(m));
          tokens[v] = {xq[v].data(), a_scale[v].data(), offset[v].data()};
        }
        scalar::quantize_tokens(x.data(), k, 0, m, tokens[0]);
        avx512::quantize_tokens(x.data(), k, 0, m, tokens[1]);
        if (xq[0] != xq[1] || a_scale[0] != a_scale[1] || offset[0] != offset[1]) {
          std::printf("quantize_tokens differs: K=%ld M=%ld\n", static_cast<long>(k), static_cast<long>(m));
          ++failures;
        }
        const MatMulW8A8Fn kernels[] = {scalar::matmul_w8a8, avx512::matmul_w8a8, avx512vnni::matmul_w8a8};
        const char* names[] = {"scalar", "avx512", "avx512vnni"};
        std::vector<float> y[3];
        for (int i = 0; i < 3; ++i) {
          y[i].assign(static_cast<size_t>(m * n), -1.0f);
          kernels[i](w, tokens[0], m, 0, tiles, y[i].data());
        }
        for (int i = 1; i < 3; ++i)
          if (std::memcmp(y[0].data(), y[i].data(), y[0].size() * sizeof(float))) {
            std::printf("matmul_w8a8 %s differs: K=%ld N=%ld M=%ld\n", names[i], static_cast<long>(k),
                        static_cast<long>(n), static_cast<long>(m));
            ++failures;
          }
      }
  return failures;
}

int check_swiglu() {
  int failures = 0;
  for (int64_t inner : {16, 48, 4864}) {
    const std::vector<float> x = normal(static_cast<size_t>(2 * inner), 4.0f);
    std::vector<float> a(static_cast<size_t>(inner)), b(static_cast<size_t>(inner));
    scalar::swiglu(x.data(), inner, a.data());
    avx512::swiglu(x.data(), inner, b.data());
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) {
      std::printf("swiglu differs: inner=%ld\n", static_cast<long>(inner));
      ++failures;
    }
  }
  return failures;
}

int check_attention() {
  int failures = 0;
  for (int64_t past : {0, 5, 130})
    for (int64_t d : {16, 64, 128}) {
      const int64_t s = 4, heads = 4, kv = 2, t = past + s;
      std::vector<float> query = normal(static_cast<size_t>(s * heads * d), 1.0f);
      std::vector<float> cos = normal(static_cast<size_t>(s * d), 1.0f), sin = normal(static_cast<size_t>(s * d), 1.0f);
      std::vector<float> past_key = normal(static_cast<size_t>(past * kv * d + 1), 1.0f);
      std::vector<float> past_value = normal(static_cast<size_t>(past * kv * d + 1), 1.0f);
      std::vector<float> new_key = normal(static_cast<size_t>(s * kv * d), 1.0f);
      std::vector<float> new_value = normal(static_cast<size_t>(s * kv * d), 1.0f);
      std::vector<float> bias(static_cast<size_t>(s * t), 0.0f);  // causal, and every third past slot masked
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < t; ++j)
          if (j > past + i || (j < past && j % 3 == 1)) bias[static_cast<size_t>(i * t + j)] = -3.4e38f;
      AttentionPass pass;
      pass.s = s;
      pass.past = past;
      pass.heads = heads;
      pass.kv_heads = kv;
      pass.head_dim = d;
      pass.scale = 0.125f;
      pass.query_stride = heads * d;
      pass.query = query.data();
      pass.cos = cos.data();
      pass.sin = sin.data();
      pass.bias = bias.data();
      pass.past_key = past_key.data();
      pass.past_value = past_value.data();
      pass.new_key = new_key.data();
      pass.new_value = new_value.data();
      std::vector<int64_t> visible(static_cast<size_t>(t));
      std::vector<float> scores(static_cast<size_t>(heads * ((t + 15) / 16 * 16))), rotated(static_cast<size_t>(heads * d));
      std::vector<float> out[2];
      const AttendFn attend[] = {scalar::attend, avx512::attend};
      for (int i = 0; i < 2; ++i) {
        out[i].assign(static_cast<size_t>(s * heads * d), 0.0f);
        pass.out = out[i].data();
        for (int64_t row = 0; row < s; ++row)
          for (int64_t h = 0; h < kv; ++h)
            attend[i](pass, row, h, h * (heads / kv), (h + 1) * (heads / kv),
                      Workspace{visible.data(), scores.data(), rotated.data()});
      }
      if (std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float))) {
        std::printf("attention differs: past=%ld head_dim=%ld\n", static_cast<long>(past), static_cast<long>(d));
        ++failures;
      }
    }
  return failures;
}

}  // namespace

int main() {
  const int failures = check_matmul_q4() + check_matmul_w8a8() + check_swiglu() + check_attention();
  if (failures) {
    std::printf("%d differences\n", failures);
    return 1;
  }
  std::printf("all equal\n");
  return 0;
}
