// A CUDA testcase that times itself: a 5-point Jacobi stencil on an N x N grid of floats,
// SWEEPS sweeps per sample, checked against a host reference, then timed SAMPLES times with
// CUDA events.
//
//   nvcc -O3 -arch=native -o stencil_a.out stencil.cu && ./stencil_a.out [N] [SAMPLES]
//
// It exits 1 (and prints the first mismatch) when the stencil disagrees with the reference,
// 3 when no GPU can be used, and otherwise prints one line that `magpie analyze|compare` times the
// kernel with:
//   MAGPIE_TIMING_JSON: {"samples_ms": [...]}
// The line declares no clock on purpose: on a machine with a GPU the engine takes such samples as
// device times (CUDA events are) and uses the GPU tie margin.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

static const int SWEEPS = 8;

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                   cudaGetErrorString(err_));                                         \
      std::exit(err_ == cudaErrorNoDevice || err_ == cudaErrorInsufficientDriver ? 3 : 1); \
    }                                                                                 \
  } while (0)

// One sweep: out = average of the 4 neighbours of in (the border stays fixed).
__global__ void sweep(const float* __restrict__ in, float* __restrict__ out, int n) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int i = blockIdx.y * blockDim.y + threadIdx.y;
  if (i < 1 || j < 1 || i >= n - 1 || j >= n - 1) return;
  out[i * n + j] = 0.25f * (in[(i - 1) * n + j] + in[(i + 1) * n + j] + in[i * n + j - 1] + in[i * n + j + 1]);
}

static void init(std::vector<float>& g, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      g[size_t(i) * n + j] = std::sin(0.01f * i) * std::cos(0.02f * j) + (i == 0 || j == 0 ? 1.0f : 0.0f);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4096;
  const int samples = argc > 2 ? std::atoi(argv[2]) : 20;
  if (n < 3 || samples < 2) {
    std::fprintf(stderr, "usage: %s [N >= 3] [SAMPLES >= 2]\n", argv[0]);
    return 2;
  }
  const size_t count = size_t(n) * n, bytes = count * sizeof(float);
  std::vector<float> host(count), got(count);
  init(host, n);
  float *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  const dim3 block(32, 8), grid((n + block.x - 1) / block.x, (n + block.y - 1) / block.y);

  // Correctness: one sweep on the device against the host, on every interior point.
  CHECK(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, host.data(), bytes, cudaMemcpyHostToDevice));
  sweep<<<grid, block>>>(a, b, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(got.data(), b, bytes, cudaMemcpyDeviceToHost));
  for (int i = 1; i < n - 1; ++i)
    for (int j = 1; j < n - 1; ++j) {
      const size_t k = size_t(i) * n + j;
      const float want = 0.25f * (host[k - n] + host[k + n] + host[k - 1] + host[k + 1]);
      if (std::fabs(got[k] - want) > 1e-5f * (1.0f + std::fabs(want))) {
        std::fprintf(stderr, "mismatch at (%d, %d): got %.9g, want %.9g\n", i, j, got[k], want);
        return 1;
      }
    }

  // Timing: 3 untimed warm-up samples, then SAMPLES timed ones, each from the same starting grid.
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int s = -3; s < samples; ++s) {
    CHECK(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, host.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaEventRecord(start));
    for (int k = 0; k < SWEEPS; ++k) {
      sweep<<<grid, block>>>(k % 2 ? b : a, k % 2 ? a : b, n);
    }
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaGetLastError());
    float t = 0.0f;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    if (s >= 0) ms.push_back(t);
  }
  CHECK(cudaMemcpy(got.data(), a, bytes, cudaMemcpyDeviceToHost));
  const float centre = got[size_t(n / 2) * n + n / 2];
  if (!std::isfinite(centre)) {
    std::fprintf(stderr, "non-finite result\n");
    return 1;
  }
  std::printf("PASSED: %dx%d grid, %d sweeps (centre %.6f)\n", n, n, SWEEPS, centre);
  std::printf("MAGPIE_TIMING_JSON: {\"samples_ms\": [");
  for (size_t i = 0; i < ms.size(); ++i) std::printf("%s%.6f", i ? ", " : "", ms[i]);
  std::printf("]}\n");
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 0;
}
