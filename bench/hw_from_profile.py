#!/usr/bin/env python3
"""bench/hw_from_profile.py — a hardware description whose efficiencies are what loom's own
kernels reached on a device, read from a CUDA `LOOM_PROFILE` table (issue 31 item 7).

    LOOM_PROFILE=15 loom train models/gpt2-124M.json --backend cuda --precision bf16 ... 2> prof.txt
    python3 bench/hw_from_profile.py prof.txt models/hardware/h100-sxm.json OUT.json [prof2.txt ...]

The profile's category table gives, per category, the % of the roofline bound its launches
reached on the hardware file the table names (codegen/cuda/cost.c): the time model's
efficiency of that category (passes/timing.h: time = bound / efficiency). This writes the
description with
  efficiency.matmul     the gemm row's fraction,
  efficiency.attention  the attention row's,
  efficiency.<category> the memory-bound rows' (norm, elementwise, loss, optimizer, cast,
                        reduce, copy),
taking, over several tables (several models), each category's launches-weighted mean; a
category no table timed (0 launches, or 0.0%: the emulated device's clock) keeps the file's
value. The notes gain the date, the device line and the tables it came from. Standard
library only: it runs where the GPU runs.
"""
import datetime
import json
import re
import sys

CATEGORIES = {"gemm": "matmul", "attention": "attention", "norm": "norm", "elementwise": "elementwise",
              "loss": "loss", "optimizer": "optimizer", "cast": "cast", "reduce": "reduce", "copy": "copy"}


def read_table(path):
    """The category rows of a LOOM_PROFILE table: {category: (launches, fraction)}, and its header."""
    rows, header, inside = {}, "", False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("CUDA profile of one step"):
                header, inside = line.strip(), False
            elif line.startswith("category") and "roofline" in line:
                inside = True
            elif inside:
                m = re.match(r"^(\w+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s*$", line)
                if not m:
                    inside = False
                    continue
                name, launches, pct = m.group(1), int(m.group(2)), float(m.group(6))
                if name in CATEGORIES:
                    rows[name] = (launches, pct / 100.0)
    if not header:
        sys.exit(f"{path}: no CUDA profile table (run loom with LOOM_PROFILE=N on the CUDA backend and keep its stderr)")
    return rows, header


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: bench/hw_from_profile.py PROFILE.txt HW.json OUT.json [PROFILE2.txt ...]")
    profiles = [sys.argv[1]] + sys.argv[4:]
    hw_path, out_path = sys.argv[2], sys.argv[3]
    with open(hw_path) as f:
        hw = json.load(f)
    sums = {}   # category -> [launches x fraction, launches]
    headers = []
    for p in profiles:
        rows, header = read_table(p)
        headers.append(f"{p}: {header}")
        for cat, (n, frac) in rows.items():
            if n > 0 and frac > 0:
                s = sums.setdefault(cat, [0.0, 0])
                s[0] += n * frac
                s[1] += n
    eff = dict(hw.get("efficiency", {}))
    measured, kept = [], []
    for cat, key in CATEGORIES.items():
        if cat in sums:
            value = round(min(1.0, sums[cat][0] / sums[cat][1]), 4)
            eff[key] = value
            measured.append(f"{key} {value}")
        else:
            kept.append(key)
    hw["efficiency"] = eff
    date = datetime.date.today().isoformat()
    note = (f"Efficiencies measured {date} from loom's LOOM_PROFILE tables ({'; '.join(headers)}): "
            f"{', '.join(measured) or 'none'}" + (f"; not timed, kept: {', '.join(kept)}" if kept else "") + ".")
    hw["notes"] = (hw.get("notes", "") + " " + note).strip()
    with open(out_path, "w") as f:
        json.dump(hw, f, indent=2)
        f.write("\n")
    print(note)


if __name__ == "__main__":
    main()
