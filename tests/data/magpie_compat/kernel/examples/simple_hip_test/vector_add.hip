// A vector add with its own check, in the shape of Magpie's simple_hip_test.
#include <hip/hip_runtime.h>
#include <cstdio>

__global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main() {
  const int n = 1 << 20;
  float *a, *b, *c;
  hipMallocManaged(&a, n * sizeof(float));
  hipMallocManaged(&b, n * sizeof(float));
  hipMallocManaged(&c, n * sizeof(float));
  for (int i = 0; i < n; ++i) { a[i] = 1.0f * i; b[i] = 2.0f; }
  vector_add<<<(n + 255) / 256, 256>>>(a, b, c, n);
  hipDeviceSynchronize();
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) { printf("FAIL at %d\n", i); return 1; }
  }
  printf("PASS\n");
  return 0;
}
