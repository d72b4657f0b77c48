#!/usr/bin/env python3
"""Whether a refactor of CUDA kernels left their code unchanged: compiles the kernel files of a
git revision and of the working tree to PTX (sm_90a, the build's flags) and compares every
kernel and device function, up to branch-label numbers, the anonymous namespace's per-file name
and `.visible` (a kernel moved between files or out of an anonymous namespace). Identical PTX
means identical machine code, so a pure refactor needs no GPU run to prove its bits; anything
else is listed. Needs nvcc; no GPU.

Usage: scripts/dev/ptx_same.py [--base REV] [--rename OLD=NEW ...] FILE.cu [FILE.cu ...]
  The listed files of the working tree are compiled as one set against its headers, those of REV
  (default HEAD) that exist there as the other against REV's: moving a kernel between listed
  files is fine, and a header's change shows in the kernels that use it. --rename maps a
  namespace (as it appears in a mangled name, e.g. 3mla) onto another before comparing.
Exit status: 0 when every kernel of REV's files is present and identical, 1 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
FLAGS = ["-DDEEPINFER_HAVE_CUDA", "-DFMT_SHARED", "-DFMT_CONSTEVAL=", "-gencode=arch=compute_90a,code=sm_90a",
         "--expt-relaxed-constexpr", "-O3", "-DNDEBUG", "-std=c++20", "-ptx"]
# An anonymous namespace's mangled name carries the file's name and a hash.
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]{8}_\d+_[A-Za-z0-9_]+?_cu_[0-9a-f]{8}")
HEADER = re.compile(r"(?:\.visible |\.weak |\.extern )?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z0-9_$]+)")


def normalize(text, renames):
    text = ANON.sub("ANON", text)
    for old, new in renames:
        text = text.replace(old, new)
    text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)  # label numbers count across a file's functions
    text = re.sub(r"// \.globl\s+\S+", "", text)
    text = re.sub(r"^\.visible ", "", text, flags=re.M)
    return text


def functions(ptx, renames):
    out = {}
    for block in re.split(r"\n(?=(?:\.visible |\.weak |\.extern )?\.(?:entry|func) )", normalize(ptx, renames)):
        m = HEADER.match(block)
        if m:
            out[m.group(1)] = re.sub(r"\s+", " ", block).strip()
    return out


def compile_set(root, rels, workdir, tag, renames):
    """Compiles root/rel for each rel that exists, against root/src's headers."""
    found = {}
    for rel in rels:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        ptx = os.path.join(workdir, tag + "_" + os.path.basename(rel) + ".ptx")
        r = subprocess.run([NVCC] + FLAGS + ["-I" + os.path.join(root, "src"), path, "-o", ptx],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"ptx_same: nvcc failed on {tag}:{rel}:\n{r.stderr[-3000:]}")
        with open(ptx) as f:
            found.update(functions(f.read(), renames))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rename", action="append", default=[], help="OLD=NEW in mangled names")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    rels = [os.path.relpath(os.path.abspath(f), ROOT) for f in args.files]
    with tempfile.TemporaryDirectory() as tmp:
        base_root = os.path.join(tmp, "base")
        os.makedirs(base_root)
        archive = subprocess.run(["git", "-C", ROOT, "archive", args.base, "src"], capture_output=True)
        if archive.returncode != 0:
            sys.exit(f"ptx_same: git archive {args.base} failed: {archive.stderr.decode()[-500:]}")
        subprocess.run(["tar", "-x", "-C", base_root], input=archive.stdout, check=True)
        a = compile_set(base_root, rels, tmp, "base", renames)
        b = compile_set(ROOT, rels, tmp, "now", renames)
    ok = True
    for name, body in sorted(a.items()):
        if name not in b:
            print(f"MISSING {name}")
            ok = False
        elif body != b[name]:
            print(f"DIFF    {name}")
            ok = False
        else:
            print(f"same    {name}")
    for name in sorted(set(b) - set(a)):
        print(f"NEW     {name}")
    print(f"{'identical' if ok else 'different'}: {len(a)} functions at {args.base}, {len(b)} now")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
