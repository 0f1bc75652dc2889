// tests/gpu/test_kernels.cu — the hand-written kernels that `test_cuda_runtime --gpu` runs
// through runtime/cuda/cuda_exec.c (the LoomArgs contract of runtime/program.h).
//
// The test embeds them as PTX (tests/gpu/test_kernels_ptx.h), so the GPU machine needs no
// compiler.  Regenerate after an edit with tests/gpu/gen_ptx.sh (nvcc -ptx, no FMA
// contraction, so that results are bitwise those of the test's C mirror).
struct LoomArgs {
  void *buf[16];
  long long i[40];
  double f[4];
};

// x -> y: y = x * f[0] + f[1];  i: n
extern "C" __global__ void t_affine(LoomArgs a) {
  long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < a.i[0]) ((float *)a.buf[1])[k] = ((const float *)a.buf[0])[k] * (float)a.f[0] + (float)a.f[1];
}

// x (f32) -> y (bf16), round to nearest even;  i: n
extern "C" __global__ void t_to_bf16(LoomArgs a) {
  long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < a.i[0]) {
    unsigned u = __float_as_uint(((const float *)a.buf[0])[k]);
    u += 0x7FFFu + ((u >> 16) & 1u);
    ((unsigned short *)a.buf[1])[k] = (unsigned short)(u >> 16);
  }
}

// Writes to the address i[0]: a fault, to check that errors are reported and survivable.
extern "C" __global__ void t_fault(LoomArgs a) { *(volatile int *)(unsigned long long)a.i[0] = 1; }

// tokens targets w -> g (+=) loss, one thread;  i: n, V
extern "C" __global__ void t_grad(LoomArgs a) {
  const int *tok = (const int *)a.buf[0], *tgt = (const int *)a.buf[1];
  const float *w = (const float *)a.buf[2];
  float *g = (float *)a.buf[3], *loss = (float *)a.buf[4];
  long long n = a.i[0];
  float l = 0;
  for (long long k = 0; k < n; k++) {
    float c = (float)(tgt[k] + 1) / (float)n;
    l += w[tok[k]] * c;
    g[tok[k]] += c;
  }
  loss[0] = l;
}

// lr t -> w m g (in place) norm, one thread:  norm = |g|, m = beta m + g, w -= lr m, g = 0;
// i: V;  f: beta
extern "C" __global__ void t_opt(LoomArgs a) {
  float lr = ((const float *)a.buf[0])[0];
  float *w = (float *)a.buf[2], *m = (float *)a.buf[3], *g = (float *)a.buf[4], *norm = (float *)a.buf[5];
  float beta = (float)a.f[0], ss = 0;
  for (long long k = 0; k < a.i[0]; k++) ss += g[k] * g[k];
  norm[0] = sqrtf(ss);
  for (long long k = 0; k < a.i[0]; k++) {
    m[k] = beta * m[k] + g[k];
    w[k] = w[k] - lr * m[k];
    g[k] = 0;
  }
}
