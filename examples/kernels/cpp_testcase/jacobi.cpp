// A CPU testcase that times itself: a 5-point Jacobi stencil on an N x N grid of doubles,
// SWEEPS sweeps per sample, checked against a plain reference, then timed SAMPLES times.
//
//   g++ -O3 -std=c++17 -o jacobi_a.out jacobi.cpp && ./jacobi_a.out [N] [SAMPLES]
//
// It exits 1 (and prints the first mismatch) when the stencil disagrees with the reference,
// and otherwise prints one line that `magpie analyze|compare` times the kernel with:
//   MAGPIE_TIMING_JSON: {"samples_ms": [...], "clock": "cpu"}
// "clock": "cpu" says the samples are host wall times (std::chrono::steady_clock), so a compare
// uses the CPU tie margin even on a machine that has a GPU.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

static const int SWEEPS = 8;

// One sweep: out = average of the 4 neighbours of in (the border stays fixed).
static void sweep(const double* in, double* out, int n) {
  for (int i = 1; i < n - 1; ++i) {
    const double* up = in + (i - 1) * n;
    const double* mid = in + i * n;
    const double* down = in + (i + 1) * n;
    double* o = out + i * n;
    for (int j = 1; j < n - 1; ++j) o[j] = 0.25 * (up[j] + down[j] + mid[j - 1] + mid[j + 1]);
  }
}

static void run(std::vector<double>& a, std::vector<double>& b, int n) {
  for (int s = 0; s < SWEEPS; ++s) {
    sweep(a.data(), b.data(), n);
    a.swap(b);
  }
}

// The same computation written element by element, for the check.
static double reference_at(const std::vector<double>& grid, int n, int i, int j) {
  return 0.25 * (grid[(i - 1) * n + j] + grid[(i + 1) * n + j] + grid[i * n + j - 1] + grid[i * n + j + 1]);
}

static void init(std::vector<double>& g, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) g[i * n + j] = std::sin(0.01 * i) * std::cos(0.02 * j) + (i == 0 || j == 0 ? 1.0 : 0.0);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 768;
  const int samples = argc > 2 ? std::atoi(argv[2]) : 20;
  if (n < 3 || samples < 2) {
    std::fprintf(stderr, "usage: %s [N >= 3] [SAMPLES >= 2]\n", argv[0]);
    return 2;
  }
  std::vector<double> a(size_t(n) * n), b(size_t(n) * n);

  // Correctness: one sweep of the kernel against the reference, on every interior point.
  init(a, n);
  b = a;
  sweep(a.data(), b.data(), n);
  for (int i = 1; i < n - 1; ++i)
    for (int j = 1; j < n - 1; ++j) {
      const double want = reference_at(a, n, i, j);
      if (std::fabs(b[i * n + j] - want) > 1e-12 * (1.0 + std::fabs(want))) {
        std::fprintf(stderr, "mismatch at (%d, %d): got %.17g, want %.17g\n", i, j, b[i * n + j], want);
        return 1;
      }
    }

  // Timing: 3 untimed warm-up samples, then SAMPLES timed ones, each on a fresh grid.
  std::vector<double> ms;
  double checksum = 0.0;
  for (int s = -3; s < samples; ++s) {
    init(a, n);
    b = a;
    const auto t0 = std::chrono::steady_clock::now();
    run(a, b, n);
    const auto t1 = std::chrono::steady_clock::now();
    checksum += a[(n / 2) * n + n / 2];
    if (s >= 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  if (!std::isfinite(checksum)) {
    std::fprintf(stderr, "non-finite result\n");
    return 1;
  }
  std::printf("PASSED: %dx%d grid, %d sweeps (checksum %.6f)\n", n, n, SWEEPS, checksum);
  std::printf("MAGPIE_TIMING_JSON: {\"samples_ms\": [");
  for (size_t i = 0; i < ms.size(); ++i) std::printf("%s%.6f", i ? ", " : "", ms[i]);
  std::printf("], \"clock\": \"cpu\"}\n");
  return 0;
}
