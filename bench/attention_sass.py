#!/usr/bin/env python3
"""bench/attention_sass.py — the tensor-core attention kernels' SASS, off the GPU (issue 32).

Reads a translation unit `loom ir ... --emit=cuda` wrote, keeps its prelude and the heavy
attention units (the NVRTC program split, runtime/cuda/nvrtc.h), compiles them with nvcc
for ARCH (sm_90a) with `ptxas -v`, and from `cuobjdump -sass` prints per kernel:
registers, spill bytes (stores + loads), and for the loop with the most HMMA instructions
(the key- or query-tile loop: a backward branch's range) its instruction count, its HMMAs and
the ratio.  Targets: at most 6 instructions per HMMA, no spills.  The Hopper kernels
(LOOM_CUDA_WGMMA=1's loom_attn_fwd_wg) issue HGMMA (wgmma) instead: their rows count each
HGMMA m64nNk16 as the N / 8 HMMA m16n8k16 of work it is for each of its 4 warps, so the
ratio stays per HMMA's worth of work (instructions a warp runs per m16n8k16 product), and
give the HGMMAs themselves in their own column.  `regs` is ptxas's count (the kernel's at
entry: what a launch allocates); `R max` is the highest register the SASS names, plus one,
which is more than `regs` where a warpgroup raised its limit with setmaxnreg.inc (the
forward's consumers).  ptxas's lines that cost speed are printed after the table: C7508
(setmaxnreg ignored), C7510 / C7514 / C7520 (wgmma serialized).
  python3 bench/attention_sass.py TU.cu [ARCH] [--kernels PREFIX[,PREFIX...]]
--kernels picks other heavy units by their kernel names' prefixes (default loom_attn_; the
mixture of experts' grouped matmuls: --kernels loom_gmm_, docs/moe.md).
cuobjdump: $CUOBJDUMP, else on PATH or under $CUDA_HOME/bin, else PyPI's nvidia-cuda-cuobjdump
(importable: PYTHONPATH=DIR after `pip install --target DIR nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`: cuobjdump runs nvdisasm).
"""
import os, re, shutil, subprocess, sys, tempfile

def mma_work(op):
    """m16n8k16 products (per warp) an instruction is: HMMA.16816 1, HGMMA.64xNx16 N / 8."""
    if op.startswith("HMMA"): return 1
    m = re.match(r"HGMMA\.64x(\d+)x16", op)
    return int(m.group(1)) // 8 if m else 0

MARK = "\n/*@loom-unit "
PRELUDE = "/*@loom-prelude*/\n"

def paths(body):
    """One iteration's paths through a loop body (its forward branches only): (instructions,
    HMMAs) of the path with the most HMMAs and the fewest instructions (a tile that is not
    masked), and of the one with the most HMMAs and the most instructions (a masked tile)."""
    addrs = [x[0] for x in body]
    index = {a: i for i, a in enumerate(addrs)}
    leaders = {0}
    for i, (a, op, rest, pred) in enumerate(body):
        if op.startswith("BRA") or op.startswith("EXIT"):
            if i + 1 < len(body): leaders.add(i + 1)
            m = re.search(r"0x([0-9a-f]+)", rest)
            if m and int(m.group(1), 16) in index: leaders.add(index[int(m.group(1), 16)])
    starts = sorted(leaders)
    blocks = [(starts[k], (starts[k + 1] if k + 1 < len(starts) else len(body))) for k in range(len(starts))]
    block_of = {b[0]: k for k, b in enumerate(blocks)}
    best_lo = {0: (0, 0)}   # block -> (hmma, -instr) best so far: most HMMA, fewest instructions
    best_hi = {0: (0, 0)}   # most HMMA, most instructions
    for k, (b0, b1) in enumerate(blocks):
        if k not in best_lo: continue
        seg = body[b0:b1]
        h = sum(mma_work(x[1]) for x in seg)
        lo = (best_lo[k][0] + h, best_lo[k][1] - len(seg))
        hi = (best_hi[k][0] + h, best_hi[k][1] + len(seg))
        last = seg[-1]
        succ = []
        m = re.search(r"0x([0-9a-f]+)", last[2]) if last[1].startswith("BRA") else None
        if m and int(m.group(1), 16) in index and index[int(m.group(1), 16)] > b0:
            succ.append(block_of[index[int(m.group(1), 16)]])
        if not (last[1].startswith("BRA") and not last[3]) and not last[1].startswith("EXIT") and k + 1 < len(blocks):
            succ.append(k + 1)
        if k == len(blocks) - 1:
            best_lo["end"] = max(best_lo.get("end", (-1, 0)), lo)
            best_hi["end"] = max(best_hi.get("end", (-1, 0)), hi)
        for n in succ:
            best_lo[n] = max(best_lo.get(n, (-1, 0)), lo)
            best_hi[n] = max(best_hi.get(n, (-1, 0)), hi)
    lo, hi = best_lo.get("end", (0, 0)), best_hi.get("end", (0, 0))
    return (-lo[1], lo[0]), (hi[1], hi[0])

def main():
    argv, prefixes = list(sys.argv[1:]), ["loom_attn_"]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip()); return 0 if argv else 2
    if "--kernels" in argv:
        i = argv.index("--kernels")
        prefixes = argv[i + 1].split(",")
        del argv[i:i + 2]
    tu = open(argv[0]).read()
    arch = argv[1] if len(argv) > 1 else "sm_90a"
    first = tu.index(MARK)
    start = tu.find(PRELUDE)
    prelude = tu[start if 0 <= start < first else 0:first]
    units = tu[first:].split(MARK)[1:]
    keep = [u for u in units if any(u.startswith("heavy " + p) for p in prefixes)]
    if not keep:
        print("no heavy kernels named", ",".join(prefixes) + "* in", argv[0]); return 1
    src = prelude + "".join(MARK + u for u in keep)
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.environ.get("NVCC") or (f"{cuda}/bin/nvcc" if os.path.exists(f"{cuda}/bin/nvcc") else "nvcc")
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or f"{cuda}/bin/cuobjdump"
    env = dict(os.environ)
    try:   # PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (the toolkit here ships neither)
        import nvidia.cu13 as cu
        for d in cu.__path__:
            b = os.path.join(d, "bin")
            if not os.path.exists(cuobjdump) and os.path.exists(os.path.join(b, "cuobjdump")):
                cuobjdump = os.path.join(b, "cuobjdump")
            if os.path.exists(os.path.join(b, "nvdisasm")):
                env["NVDISASM_PATH"] = b
                env["PATH"] = env.get("PATH", "") + os.pathsep + b
    except ImportError:
        pass
    if not os.path.exists(cuobjdump):
        print("SKIP: no cuobjdump (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"); return 0
    with tempfile.TemporaryDirectory() as d:
        open(f"{d}/a.cu", "w").write(src)
        r = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", "-o", f"{d}/a.cubin", f"{d}/a.cu"],
                           capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-3000:]); return 1
        ptxas = r.stderr
        r = subprocess.run([cuobjdump, "-sass", f"{d}/a.cubin"], capture_output=True, text=True, env=env)
        if r.returncode or "Function" not in r.stdout:
            print("cuobjdump failed:", (r.stderr or r.stdout)[-800:]); return 1
        sass = r.stdout
    regs, spills = {}, {}
    cur = None
    for line in ptxas.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or re.search(r"Function properties for (\w+)", line)
        if m: cur = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur: spills[cur] = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur: regs[cur] = int(m.group(1))
    # SASS per function: address -> opcode
    funcs, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            name = m.group(1); funcs[name] = []; continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);", line)
        if m and name:
            funcs[name].append((int(m.group(1), 16), m.group(3), m.group(4), bool(m.group(2))))
    rmax = {fn: 1 + max([int(r) for x in ins for r in re.findall(r"\bR(\d+)\b", x[2])] or [-1]) for fn, ins in funcs.items()}
    worst = 0.0
    print(f"{'kernel':30s} {'regs':>4s} {'R max':>5s} {'spill st/ld':>11s} {'instr':>6s} {'HMMA':>5s} {'loop HMMA':>9s} "
          f"{'tile path':>9s} {'per HMMA':>8s} {'edge path':>9s} {'per HMMA':>8s} {'HGMMA':>5s}")
    for fn, ins in funcs.items():
        ins = [x for x in ins if x[1] != "NOP"]
        hmma = sum(mma_work(op) for _, op, _, _ in ins)
        hgmma = sum(1 for _, op, _, _ in ins if op.startswith("HGMMA"))
        best = None   # the loop (a backward branch's range) with the most HMMAs
        for i, (addr, op, rest, pred) in enumerate(ins):
            m = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
            # a loop's back edge is conditional; an unconditional backward jump is an out-of-line
            # block (an mbarrier wait's retry) returning to the code it left
            if not m or int(m.group(1), 16) >= addr or not pred: continue
            tgt = int(m.group(1), 16)
            body = [x for x in ins if tgt <= x[0] <= addr]
            h = sum(mma_work(x[1]) for x in body)
            if h and (best is None or h > best[0]): best = (h, body)
        lo = hi = (0, 0)
        if best:
            lo, hi = paths(best[1])
        if os.environ.get("VERBOSE") and best:   # the loop's opcodes, most frequent first
            hist = {}
            for x in best[1]:
                hist[x[1].split(".")[0]] = hist.get(x[1].split(".")[0], 0) + 1
            print("  " + fn, " ".join(f"{k}:{v}" for k, v in sorted(hist.items(), key=lambda kv: -kv[1])))
        r_lo = lo[0] / lo[1] if lo[1] else float("nan")
        r_hi = hi[0] / hi[1] if hi[1] else float("nan")
        worst = max(worst, r_lo if lo[1] else 0)
        st, ld = spills.get(fn, (0, 0))
        print(f"{fn:30s} {regs.get(fn, 0):4d} {rmax[fn]:5d} {st:5d}/{ld:<5d} {len(ins):6d} {hmma:5d} {best[0] if best else 0:9d} "
              f"{lo[0]:9d} {r_lo:8.1f} {hi[0]:9d} {r_hi:8.1f} {hgmma:5d}")
    for line in ptxas.splitlines():
        if re.search(r"\(C75(08|10|14|20)\)", line): print("ptxas:", line.strip())
    print(f"most instructions per HMMA on a tile's path through the inner loop: {worst:.1f} (target at most 6; "
          "the edge path, masked tiles on the diagonal or at the end, is beside it; HGMMA counted as N/8 HMMA)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
