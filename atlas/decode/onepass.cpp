// y = x Wᵀ for fp32 x [M, K] and W [N, K] (row-major, as nn.Linear stores it), reading W once for
// every 4 rows of x. Each W row is loaded once and dotted with up to 4 rows of x held in L1, so a
// verify pass of 2-4 rows streams the weights once, as a 1-row decode step does.
//
// Every output y[m, n] is summed in the same order whatever M is and wherever row m sits in the
// block (two 8-wide FMA chains over K, then a fixed horizontal sum, then the tail), so a row's
// result is bitwise the same in a 1-row step and in a k+1-row verify pass. Built with
// -ffp-contract=off so the compiler cannot fuse the tail differently per instantiation.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

template <int M, int64_t PREFETCH>
void block(const float* x, const float* w, float* y, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = w + n * K;
    __m256 a0[M], a1[M];
    for (int m = 0; m < M; ++m) {
      a0[m] = _mm256_setzero_ps();
      a1[m] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      if constexpr (PREFETCH > 0) _mm_prefetch(reinterpret_cast<const char*>(wr + k + PREFETCH), _MM_HINT_T0);
      const __m256 w0 = _mm256_loadu_ps(wr + k), w1 = _mm256_loadu_ps(wr + k + 8);
      for (int m = 0; m < M; ++m) {
        a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * K + k), a0[m]);
        a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * K + k + 8), a1[m]);
      }
    }
    for (int m = 0; m < M; ++m) {
      const __m256 s = _mm256_add_ps(a0[m], a1[m]);
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
      float t = _mm_cvtss_f32(h);
      for (int64_t j = k; j < K; ++j) t += wr[j] * x[m * K + j];
      y[m * N + n] = t;
    }
  }
}

template <int64_t PREFETCH>
void rows(const float* xm, const float* wp, float* ym, int64_t rows_left, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  switch (std::min<int64_t>(4, rows_left)) {
    case 1: block<1, PREFETCH>(xm, wp, ym, N, K, n0, n1); break;
    case 2: block<2, PREFETCH>(xm, wp, ym, N, K, n0, n1); break;
    case 3: block<3, PREFETCH>(xm, wp, ym, N, K, n0, n1); break;
    default: block<4, PREFETCH>(xm, wp, ym, N, K, n0, n1); break;
  }
}

constexpr int64_t PREFETCH_FLOATS = 1024;  // 4 KiB ahead, the distance that timed best of 512-4096 floats

}  // namespace

torch::Tensor onepass_mm(const torch::Tensor& x, const torch::Tensor& w, bool prefetch) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "onepass_mm: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat, "onepass_mm: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "onepass_mm: x [M, K] and W [N, K]");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "onepass_mm: contiguous x and W");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // threads split the weight's rows; every thread runs all of x's rows over its share
  at::parallel_for(0, N, 128, [&](int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const float* xm = xp + m0 * K;
      float* ym = yp + m0 * N;
      if (prefetch) rows<PREFETCH_FLOATS>(xm, wp, ym, M - m0, N, K, n0, n1);
      else rows<0>(xm, wp, ym, M - m0, N, K, n0, n1);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("onepass_mm", &onepass_mm, "y = x W^T, W read once per 4 rows, row-invariant sums; prefetch: ask memory 4 KiB ahead");
  m.attr("PREFETCH_FLOATS") = PREFETCH_FLOATS;
}
