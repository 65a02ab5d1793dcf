// Candidate CUDA vector add: c = a + b with float4 loads/stores in a grid-stride loop.
//
//   nvcc -O3 -arch=native -o vector_add_vec4.out vector_add_vec4.cu
//   ./vector_add_vec4.out [N] [REPEATS]  (defaults: N = 1<<26 floats, REPEATS = 20)
//
// The kernel runs REPEATS times so a profiler sees REPEATS launches to time; the
// result is then checked element by element against a CPU reference.

#include <cuda_runtime.h>

#include <algorithm>
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

// One 16-byte access replaces four 4-byte ones of the scalar kernel; cudaMalloc
// returns 256-byte aligned pointers, so the float4 views are aligned.
__global__ void vector_add_vec4(const float* __restrict__ a, const float* __restrict__ b,
                                float* __restrict__ c, int n) {
    const size_t n4 = static_cast<size_t>(n) / 4;
    const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* c4 = reinterpret_cast<float4*>(c);
    for (size_t i = first; i < n4; i += stride) {
        const float4 x = a4[i];
        const float4 y = b4[i];
        c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    // Tail: the last n % 4 elements, when N is not a multiple of 4.
    for (size_t i = n4 * 4 + first; i < static_cast<size_t>(n); i += stride) c[i] = a[i] + b[i];
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

    // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
    int device = 0, sm_count = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    const int block = 256;
    const long long vec_blocks = (static_cast<long long>(n) / 4 + block - 1) / block;
    const int grid = static_cast<int>(std::max(1LL, std::min(vec_blocks, 32LL * sm_count)));
    std::printf("vector_add_vec4: N=%d REPEATS=%d grid=%d block=%d\n", n, repeats, grid, block);
    for (int r = 0; r < repeats; ++r) {
        vector_add_vec4<<<grid, block>>>(d_a, d_b, d_c, n);
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
