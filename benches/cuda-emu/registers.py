#!/usr/bin/env python3
"""Registers, spills and shared memory of every kernel of one CUDA source, from ptxas through
NVRTC (no GPU, no toolkit: the PyPI wheels of ../shared/tools/cuda/fetch-nvrtc.sh).

The text is assembled as src/cuda_backend/kernels.rs's `Source::full_text` does it: the prelude
common.cuh, the headers in order, then the pass, each after a `#line` (the headers a pass
takes are listed in kernels.rs; pass them after the source):

    python3 registers.py chunked.cu chunk.cuh                      # sm_90a
    python3 registers.py --arch sm_80 chunk_bwd_grad.cu chunk.cuh
    python3 registers.py chunk_bwd_chain_bf16.cu chunk.cuh chunk_bwd_chain.cuh

Prints one line per kernel: name, registers, spill stores / loads (bytes), static shared
memory, stack frame; sorted by name, so two runs diff line by line. `--cubin FILE` also writes
the cubin, for a disassembler (nvdisasm from the PyPI wheel `nvidia-cuda-nvdisasm` reads it:
`nvdisasm -c FILE` prints the SASS, so two versions' instruction mixes can be compared here;
with `--lineinfo`, `nvdisasm -c -g FILE` names each instruction's source line).
`-D NAME=VALUE` (repeatable) compiles a variant, as `GDN_CUDA_DEFINES` does (GDN_PREP_BLOCKS=3).
"""
import argparse
import ctypes
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# GDN_CUDA_SRC: another folder of the sources (an older version, for an A/B).
CUDA_DIR = os.environ.get("GDN_CUDA_SRC", os.path.join(HERE, "..", "..", "shaders", "cuda"))
NVRTC_DIR = os.environ.get("GDN_NVRTC_DIR", os.path.expanduser("~/.cache/gdn-nvrtc"))


def full_text(source, headers):
    read = lambda name: open(os.path.join(CUDA_DIR, name)).read()
    text = read("common.cuh") + "\n"
    for h in headers:
        text += f'#line 1 "{h}"\n{read(h)}\n'
    return text + f'#line 1 "{source}"\n{read(source)}'


def ptxas_log(source, headers, arch, cubin=None, lineinfo=False, defines=()):
    lib = ctypes.CDLL(os.path.join(NVRTC_DIR, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    prog = ctypes.c_void_p()
    src = full_text(source, headers).encode()
    check = lambda rc, what: rc == 0 or sys.exit(f"NVRTC {what} failed ({rc})")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, source.encode(), 0, None, None), "create")
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v",
            "--include-path=" + os.path.join(NVRTC_DIR, "nvidia", "cuda_runtime", "include")]
    if lineinfo:
        opts.append("--generate-line-info")
    opts += [f"--define-macro={d}" for d in defines]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc == 0 and cubin:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        data = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, data), "cubin")
        open(cubin, "wb").write(data.raw)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace")
    if rc != 0:
        sys.exit(text)
    return text


def report(log):
    rows, name, cur = {}, None, {}
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or re.search(r"Function properties for (\w+)", line)
        if m:
            name = m.group(1)
            cur = rows.setdefault(name, {})
        if name is None:
            continue
        if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            cur.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        if m := re.search(r"Used (\d+) registers", line):
            cur["regs"] = int(m.group(1))
        if m := re.search(r"(\d+) bytes smem", line):
            cur["smem"] = int(m.group(1))
    for n in sorted(rows):
        r = rows[n]
        if "regs" in r:
            print(f"{n}: {r['regs']} registers, spills {r.get('spill_st', 0)}/{r.get('spill_ld', 0)} B, "
                  f"static smem {r.get('smem', 0)} B, stack {r.get('stack', 0)} B")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--cubin", help="write the cubin here")
    ap.add_argument("--define", "-D", action="append", default=[],
                    help="NAME[=VALUE], as GDN_CUDA_DEFINES gives it to NVRTC (repeatable)")
    ap.add_argument("--lineinfo", action="store_true",
                    help="with line info (as GDN_CUDA_LINEINFO=1), so that `nvdisasm -g` names each instruction's line")
    ap.add_argument("source")
    ap.add_argument("headers", nargs="*")
    a = ap.parse_args()
    report(ptxas_log(a.source, a.headers, a.arch, a.cubin, a.lineinfo, a.define))
