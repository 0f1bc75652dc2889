#!/usr/bin/python3
"""f32 GEMM throughput as PyTorch (and numpy) see it, at the shapes of bench-gpt2-small.

    /usr/bin/python3 bench/blas_gflops.py [--threads N] [--seconds S]

For each shape this times C = A @ B (torch.matmul on contiguous float32 tensors, and
numpy.matmul on the same data) and prints GFLOP/s = 2*M*N*K / time (the median of
repeated runs, each repeat lasting about --seconds / shapes).  The shapes are those of
one training step of models/bench-gpt2-small.json (B*T = 2048 rows, D = 256, V = 4096):

    qkv        [2048,256]  x [256,768]     c_attn forward
    mlp_fc     [2048,256]  x [256,1024]    c_fc forward
    mlp_proj   [2048,1024] x [1024,256]    c_proj forward
    lm_head    [2048,256]  x [256,4096]    tied lm_head forward (the biggest GEMM)
    lm_head_dW [4096,2048] x [2048,256]    its weight gradient (long K)
    square1024 [1024,1024] x [1024,1024]   the usual peak-ish reference

It also prints which BLAS torch and numpy are linked against.  On Debian, PyTorch is built
with BLAS_INFO=generic: it calls whatever libblas.so.3 the alternatives system points to,
which is OpenBLAS when libopenblas0 is installed and the netlib reference BLAS otherwise
(tens of times slower).  The libraries actually mapped into this process are read from
/proc/self/maps, so the report says what is used, not what was configured.

Threads: torch.set_num_threads(N) sets PyTorch's OpenMP pool, but Debian's OpenBLAS is the
pthreads build, which keeps its own pool (OPENBLAS_NUM_THREADS, default: all CPUs).  This
script sets OPENBLAS_NUM_THREADS=N and OMP_NUM_THREADS=N before torch is imported and also
calls openblas_set_num_threads(N), so both pools use N threads.
"""

import argparse
import os
import sys

SHAPES = [
    ("qkv", 2048, 256, 768),
    ("mlp_fc", 2048, 256, 1024),
    ("mlp_proj", 2048, 1024, 256),
    ("lm_head", 2048, 256, 4096),
    ("lm_head_dW", 4096, 2048, 256),
    ("square1024", 1024, 1024, 1024),
]


def default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=default_threads(),
                    help="threads for torch and OpenBLAS (default: CPUs available, %(default)s)")
    ap.add_argument("--seconds", type=float, default=6.0,
                    help="rough total time budget per library (default %(default)s)")
    ap.add_argument("--no-numpy", action="store_true", help="skip numpy")
    return ap.parse_args(argv)


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])
    # Both pools get N threads; this must happen before torch (and OpenBLAS) is loaded.
    # (bench/torch_gpt2_step.py imports this file after doing the same.)
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import ctypes  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit("blas_gflops.py: PyTorch is not installed for %s (on Debian: apt-get install "
             "python3-torch; it needs libopenblas0 for a fast BLAS)" % sys.executable)


def mapped_libs(words=("blas", "lapack", "mkl", "dnnl", "omp")):
    """Shared libraries mapped into this process whose file name contains one of words."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith("/"):
                    base = os.path.basename(parts[5]).lower()
                    if ".so" in base and any(w in base for w in words):
                        libs.add(os.path.realpath(parts[5]))
    except OSError:
        pass
    return sorted(libs)


def openblas_handle():
    """ctypes handle of the OpenBLAS mapped into the process (None if there is none)."""
    for path in mapped_libs(("blas",)):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib, path
        except (OSError, AttributeError):
            continue
    return None, None


def blas_description():
    """One line: which BLAS torch calls, as configured and as mapped."""
    cfg = torch.__config__.show()
    info = "?"
    for tok in cfg.replace(",", " ").split():
        if tok.startswith("BLAS_INFO="):
            info = tok.split("=", 1)[1]
    lib, path = openblas_handle()
    if lib is not None:
        n = lib.openblas_get_num_threads() if hasattr(lib, "openblas_get_num_threads") else -1
        return ("openblas", "BLAS_INFO=%s -> %s (OpenBLAS %s, core %s, %d threads)" % (
            info, path, lib.openblas_get_config().decode(), lib.openblas_get_corename().decode(), n))
    blas = [p for p in mapped_libs(("blas",))]
    if info == "mkl" or any("mkl" in p for p in mapped_libs(("mkl",))):
        return ("mkl", "BLAS_INFO=%s (MKL)" % info)
    return ("reference" if blas else "none",
            "BLAS_INFO=%s -> %s (no OpenBLAS symbols: likely the netlib reference BLAS, slow)"
            % (info, ", ".join(blas) or "no libblas mapped"))


def set_threads(n):
    torch.set_num_threads(n)
    lib, _ = openblas_handle()
    if lib is not None and hasattr(lib, "openblas_set_num_threads"):
        lib.openblas_set_num_threads(n)


def time_fn(fn, budget):
    """Median seconds per call: warm up, then repeat for about budget seconds."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(5, min(200, int(budget / one)))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_torch(budget):
    out = {}
    g = torch.Generator().manual_seed(0)
    for name, m, k, n in SHAPES:
        a = torch.randn(m, k, generator=g)
        b = torch.randn(k, n, generator=g)
        c = torch.empty(m, n)
        t = time_fn(lambda: torch.matmul(a, b, out=c), budget / len(SHAPES))
        out[name] = 2.0 * m * n * k / t / 1e9
    return out


def bench_numpy(budget):
    import numpy as np
    out = {}
    rng = np.random.default_rng(0)
    for name, m, k, n in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), dtype=np.float32)
        t = time_fn(lambda: np.matmul(a, b, out=c), budget / len(SHAPES))
        out[name] = 2.0 * m * n * k / t / 1e9
    return out


def main():
    n = ARGS.threads
    set_threads(n)
    kind, desc = blas_description()
    print("torch %s, %d threads (torch.get_num_threads() = %d)" % (torch.__version__, n,
                                                                    torch.get_num_threads()))
    print("torch BLAS: %s" % desc)
    res = {"torch": bench_torch(ARGS.seconds)}
    if not ARGS.no_numpy:
        try:
            import numpy  # noqa: F401
            res["numpy"] = bench_numpy(ARGS.seconds)
        except ImportError:
            print("numpy: not installed, skipped")
    cols = list(res)
    print("%-12s %-24s %s" % ("shape", "M x K x N", " ".join("%12s" % ("%s GF/s" % c) for c in cols)))
    for name, m, k, nn in SHAPES:
        print("%-12s %-24s %s" % (name, "%d x %d x %d" % (m, k, nn),
                                  " ".join("%12.1f" % res[c][name] for c in cols)))
    model = [s[0] for s in SHAPES if s[0] != "square1024"]
    hm = len(model) / sum(1.0 / res["torch"][s] for s in model)
    # The machine-readable line cpu_step.sh reads:
    print("BLAS_SUMMARY torch_model_gflops=%.1f torch_square_gflops=%.1f%s blas=%s threads=%d" % (
        hm, res["torch"]["square1024"],
        (" numpy_square_gflops=%.1f" % res["numpy"]["square1024"]) if "numpy" in res else "",
        kind, n))
    print("torch f32 GEMM: %.1f GFLOP/s over the model's shapes (harmonic mean), %.1f GFLOP/s "
          "square 1024 (threads %d, BLAS %s)" % (hm, res["torch"]["square1024"], n, kind))
    if kind != "openblas" and kind != "mkl":
        print("WARNING: torch is not using an optimized BLAS; install libopenblas0 (or "
              "libopenblas-dev) so that libblas.so.3 points to OpenBLAS, or the torch baseline "
              "is not a fair one.")


if __name__ == "__main__":
    main()
