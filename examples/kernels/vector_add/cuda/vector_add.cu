// Baseline CUDA vector add: c = a + b, one element per thread.
//
//   nvcc -O3 -arch=native -o vector_add_bin vector_add.cu
//   ./vector_add_bin [N] [REPEATS]      (defaults: N = 1<<26 floats, REPEATS = 20)
//
// The kernel runs REPEATS times so a profiler sees REPEATS launches to time; the
// result is then checked element by element against a CPU reference.

#include <cuda_runtime.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            std::fprintf(stderr, "CUDA error at %s:%d: %s failed: %s\n", __FILE__,    \
                         __LINE__, #call, cudaGetErrorString(err_));                  \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

__global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static long long parse_arg(const char* text, const char* what, long long lo, long long hi) {
    char* end = nullptr;
    errno = 0;
    long long value = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < lo || value > hi) {
        std::fprintf(stderr, "invalid %s '%s': expected an integer in [%lld, %lld]\n", what, text, lo, hi);
        std::exit(2);
    }
    return value;
}

int main(int argc, char** argv) {
    if (argc > 3) {
        std::fprintf(stderr, "usage: %s [N] [REPEATS]\n", argv[0]);
        return 2;
    }
    const int n = argc > 1 ? static_cast<int>(parse_arg(argv[1], "N", 1, INT_MAX)) : 1 << 26;
    const int repeats = argc > 2 ? static_cast<int>(parse_arg(argv[2], "REPEATS", 1, 1000000)) : 20;
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);

    // Random, never-zero inputs: a kernel that skips elements or mixes up operands cannot pass.
    std::vector<float> h_a(n), h_b(n), h_c(n);
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (int i = 0; i < n; ++i) {
        h_a[i] = dist(rng);
        h_b[i] = -dist(rng) * 0.25f;
    }

    float *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
    CUDA_CHECK(cudaMalloc(&d_a, bytes));
    CUDA_CHECK(cudaMalloc(&d_b, bytes));
    CUDA_CHECK(cudaMalloc(&d_c, bytes));
    CUDA_CHECK(cudaMemcpy(d_a, h_a.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, h_b.data(), bytes, cudaMemcpyHostToDevice));
    // All-ones bytes are NaN floats: any element the kernel does not write fails the check.
    CUDA_CHECK(cudaMemset(d_c, 0xFF, bytes));

    const int block = 256;
    const int grid = static_cast<int>((static_cast<long long>(n) + block - 1) / block);
    std::printf("vector_add: N=%d REPEATS=%d grid=%d block=%d\n", n, repeats, grid, block);
    for (int r = 0; r < repeats; ++r) {
        vector_add<<<grid, block>>>(d_a, d_b, d_c, n);
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h_c.data(), d_c, bytes, cudaMemcpyDeviceToHost));

    long long wrong = 0;
    for (int i = 0; i < n; ++i) {
        const float expected = h_a[i] + h_b[i];
        if (!(std::fabs(h_c[i] - expected) <= 1e-6f * std::fabs(expected))) {
            if (wrong < 10)
                std::printf("MISMATCH at %d: got %.9g, expected %.9g\n", i, h_c[i], expected);
            ++wrong;
        }
    }

    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_c));

    if (wrong != 0) {
        std::printf("FAILED: %lld of %d elements wrong.\n", wrong, n);
        return 1;
    }
    std::printf("PASSED: All %d elements correct.\n", n);
    return 0;
}
