"""The machine code of the CUDA kernels, read without a GPU: per chunk kernel (the element
loops of every op and param variant) and architecture, how its main loop reads and writes the
element streams (accesses by width and address space), its registers, local memory (spills),
theoretical occupancy at its block size and float8 conversions per element; a check that fails
where a main-loop element access of an aligned tensor is narrower than 16 bytes or not global,
where a kernel spills, or where occupancy falls below 50%.

    pip install --target DIR nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm   # (one call; or a CUDA toolkit)
    python -m tools.cuda_sass [--module inductor_lamb/_C.abi3.so] [--arch 80 90 100] [--tools DIR]
                              [--markdown] [--json out.json]

The module is the built extension (a CUDA build of the package: ``pip install
--no-build-isolation -e .`` under a CUDA torch with nvcc). ``cuobjdump -sass`` disassembles each
architecture's cubin; ``--dump-resource-usage`` gives registers and local memory.

The main loop of a kernel is its innermost loop (a backward branch with no loop inside) that
holds 16-byte accesses: the vector body of the engine (csrc/cuda/chunk_layout.h). The scalar head and
tail of a chunk, and tensors whose streams cannot be aligned together, run other loops, one
element at a time; their accesses are counted apart. Elements per iteration: the engine's pack
(``PACK_ELEMS``: LAMB16 16, else one 16-byte vector of the param, float32 4, 16-bit 8).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 256  # kThreads
# Per architecture: threads, 32-bit registers, shared memory (bytes) and blocks an SM holds.
SM = {
    80: dict(threads=2048, regs=65536, smem=167936, blocks=32),
    90: dict(threads=2048, regs=65536, smem=233472, blocks=32),
    100: dict(threads=2048, regs=65536, smem=233472, blocks=32),
}
MIN_OCCUPANCY = 0.5

_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_RESOURCE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_CONVERSION = re.compile(r"^F2FP\..*(E4M3|E5M2)")


@dataclasses.dataclass
class Instr:
    addr: int
    op: str
    args: str


def find_tool(name: str, folder: str | None) -> str:
    """``name`` from --tools (a PyPI target folder or a bin folder), the nvidia PyPI packages, or PATH."""
    candidates = []
    if folder:
        candidates += [Path(folder) / "nvidia" / "cu13" / "bin" / name, Path(folder) / "bin" / name, Path(folder) / name]
    try:
        import nvidia  # the PyPI packages (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)

        for base in nvidia.__path__:
            candidates += sorted(Path(base).glob(f"cu*/bin/{name}"))
    except ImportError:
        pass
    for c in candidates:
        if c.is_file():
            return str(c)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} not found: pip install --target DIR nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                            f"(both in one call) and pass --tools DIR, or put a CUDA toolkit's bin on PATH")


def default_module() -> Path:
    mods = sorted((ROOT / "inductor_lamb").glob("_C*.so"))
    if not mods:
        raise FileNotFoundError("no built module under inductor_lamb/ (pip install --no-build-isolation -e .)")
    return mods[0]


def run(cmd: list[str], tools_bin: str) -> str:
    env = dict(os.environ, PATH=os.pathsep.join([tools_bin, os.environ.get("PATH", "")]))  # (cuobjdump runs nvdisasm)
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout


def functions(sass: str) -> dict[str, list[Instr]]:
    out: dict[str, list[Instr]] = {}
    current = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            current.append(Instr(int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loops(code: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every loop: a branch back to an earlier address."""
    index = {ins.addr: k for k, ins in enumerate(code)}
    out = []
    for k, ins in enumerate(code):
        if ins.op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", ins.args)
            if m and int(m.group(1), 16) <= ins.addr and int(m.group(1), 16) in index:
                out.append((index[int(m.group(1), 16)], k))
    return out


def innermost(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]


def vector_width(ins: Instr) -> bool:
    a = access(ins)
    return bool(a and a[1] == "global" and a[2] == 16)


def access(ins: Instr) -> tuple[str, str, int] | None:
    """(kind, space, bytes) of a memory access: kind load/store; space global (LDG/STG), generic
    (LD/ST), local (LDL/STL); None for others (shared, constant, ...)."""
    m = re.match(r"^(LDG|STG|LDL|STL|LD|ST)\.", ins.op + ".")
    if not m:
        return None
    kind = "load" if m.group(1).startswith("LD") else "store"
    space = {"LDG": "global", "STG": "global", "LDL": "local", "STL": "local", "LD": "generic", "ST": "generic"}[m.group(1)]
    parts = ins.op.split(".")
    width = 4
    for p in parts:
        if p in ("128", "64"):
            width = int(p) // 8
        elif p in ("U8", "S8"):
            width = 1
        elif p in ("U16", "S16"):
            width = 2
    return kind, space, width


# the CUDA sources, longest name first (lamb16 before lamb): a kernel's file names its op
CUDA_SOURCES = sorted((f.stem for f in (ROOT / "csrc" / "cuda").glob("*.cu")), key=len, reverse=True)


def demangle(name: str) -> str:
    """``lamb16.pass2<bf16, master>`` from a mangled chunk kernel name."""
    op = re.search(rf"_({'|'.join(CUDA_SOURCES)})_cu_", name)
    fn = re.search(r"(pass1|pass2|norms|update|grad_sumsq)I", name)
    var = re.search(r"ParamI(f|6__half|13__nv_bfloat16)Lb([01])", name)
    dtype = {"f": "fp32", "6__half": "fp16", "13__nv_bfloat16": "bf16"}[var.group(1)] if var else "?"
    return (f"{op.group(1) if op else '?'}.{fn.group(1) if fn else '?'}<{dtype}"
            f"{', master' if var and var.group(2) == '1' else ''}>")


def pack_elems(label: str) -> int:
    return 16 if label.startswith("lamb16.") else 4 if "<fp32" in label else 8


def occupancy(regs: int, shared: int, arch: int) -> float:
    sm = SM[arch]
    warps = BLOCK // 32
    regs_per_warp = -(-regs * 32 // 256) * 256  # (allocated per warp, in units of 256)
    by_regs = sm["regs"] // (regs_per_warp * warps) if regs else sm["blocks"]
    by_smem = sm["smem"] // shared if shared else sm["blocks"]
    blocks = min(by_regs, by_smem, sm["threads"] // BLOCK, sm["blocks"])
    return blocks * BLOCK / sm["threads"]


def analyse(module: Path, arch: int, tools: str | None) -> list[dict]:
    cuobjdump = find_tool("cuobjdump", tools)
    find_tool("nvdisasm", tools)
    tools_bin = str(Path(find_tool("nvdisasm", tools)).parent)
    sass = functions(run([cuobjdump, "-sass", "-arch", f"sm_{arch}", str(module)], tools_bin))
    usage = {m.group(1): tuple(int(x) for x in m.groups()[1:])
             for m in _RESOURCE.finditer(run([cuobjdump, "--dump-resource-usage", "-arch", f"sm_{arch}", str(module)],
                                            tools_bin))}
    rows = []
    for name, code in sorted(sass.items()):
        if "5ParamI" not in name:  # chunk kernels only (the per-tensor kernels touch no element)
            continue
        label = demangle(name)
        regs, stack, shared, local = usage.get(name, (0, 0, 0, 0))
        # (loops inside it without 16-byte accesses, such as sm_80's software float8 conversions, are
        # part of the main loop's body)
        main = innermost([s for s in loops(code) if any(vector_width(code[k]) for k in range(s[0], s[1] + 1))])
        in_main = {k for s in main for k in range(s[0], s[1] + 1)}
        counts: dict[str, int] = {}
        narrow, spilled, conversions = [], [], 0
        for k, ins in enumerate(code):
            a = access(ins)
            if a and a[1] == "local":
                spilled.append(f"{ins.op} at {ins.addr:#x}")
            if k in in_main:
                if a:
                    key = f"{a[0]} {a[1]} {a[2] * 8}-bit"
                    counts[key] = counts.get(key, 0) + 1
                    if a[1] != "local" and (a[1] != "global" or a[2] < 16):
                        narrow.append(f"{ins.op} at {ins.addr:#x}")
                if _CONVERSION.match(ins.op):
                    conversions += 1
        # packs per iteration (the compiler may unroll the loop): grads are the read-only 16-byte
        # loads, one pack's worth each (LAMB's pass 2 reads none: one pack)
        grad_vectors = sum(1 for k in in_main if vector_width(code[k]) and code[k].op.endswith(".CONSTANT"))
        per_pack = pack_elems(label) * (4 if "<fp32" in label else 2) // 16  # (grads are stored like the param)
        elems = pack_elems(label) * max(1, grad_vectors // max(1, per_pack))
        occ = occupancy(regs, shared, arch)
        problems = []
        if not main:
            problems.append("no main loop with 16-byte accesses")
        if narrow:
            problems.append(f"main loop accesses narrower than 16 bytes or not global: {', '.join(narrow[:4])}")
        if spilled or stack or local:
            problems.append(f"local memory (spills): stack {stack} B, local {local} B, {', '.join(spilled[:4])}")
        if occ < MIN_OCCUPANCY:
            problems.append(f"occupancy {occ:.0%} < {MIN_OCCUPANCY:.0%} ({regs} registers)")
        rows.append(dict(arch=arch, kernel=label, registers=regs, stack=stack, local=local, shared=shared,
                         occupancy=occ, main_loops=len(main), accesses=counts,
                         fp8_per_element=conversions / elems if elems and label.startswith("lamb16") else None,
                         problems=problems))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| arch | kernel | regs | occupancy | spills | main loop: global loads | global stores | "
             "float8 conversions / element | check |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loads = ", ".join(f"{n} x {k.split()[2]}" for k, n in sorted(r["accesses"].items()) if k.startswith("load"))
        stores = ", ".join(f"{n} x {k.split()[2]}" for k, n in sorted(r["accesses"].items()) if k.startswith("store"))
        conv = "" if r["fp8_per_element"] is None else f"{r['fp8_per_element']:.2f}"
        spills = "none" if not (r["stack"] or r["local"]) else f"{r['stack']} B"
        lines.append(f"| sm_{r['arch']} | {r['kernel']} | {r['registers']} | {r['occupancy']:.0%} | {spills} | {loads} | "
                     f"{stores} | {conv} | {'ok' if not r['problems'] else 'FAIL'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", type=Path, default=None, help="the built extension (default: inductor_lamb/_C*.so)")
    ap.add_argument("--arch", type=int, nargs="+", default=None, help="architectures (default: every one built)")
    ap.add_argument("--tools", default=None, help="folder of cuobjdump / nvdisasm (a pip --target folder)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    module = args.module or default_module()
    listed = run([find_tool("cuobjdump", args.tools), "--list-elf", str(module)],
                 str(Path(find_tool("nvdisasm", args.tools)).parent))
    built = sorted({int(a) for a in re.findall(r"sm_(\d+)", listed)})
    archs = args.arch or [a for a in built if a in SM]
    missing = [a for a in archs if a not in built]
    if not built:
        print(f"{module}: no CUDA kernels (a CPU build)", file=sys.stderr)
        return 2
    rows = [r for arch in archs if arch not in missing for r in analyse(module, arch, args.tools)]
    print(f"{module.name}: cubins for sm_{', sm_'.join(map(str, built))}; block {BLOCK} threads")
    print(table(rows))
    failed = [r for r in rows if r["problems"]]
    for r in failed:
        print(f"FAIL sm_{r['arch']} {r['kernel']}: {'; '.join(r['problems'])}", file=sys.stderr)
    if missing:
        print(f"FAIL: no cubin for sm_{', sm_'.join(map(str, missing))}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
