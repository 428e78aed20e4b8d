# Builds kernels.inc: common.cuh, chunk.cuh and the chunked backward's passes (and the combine) with every
# inline-PTX helper (ldmatrix, mma.sync, cp.async, cvta, named barriers) replaced by shim.h's
# emulation. `gen.py fwd [chunked.cu]` builds fwd_kernels.inc from the chunked forward and the
# combine step instead (chunked.cu from another path: an older version, for an A/B);
# `gen.py finish` builds finish_kernels.inc from backward.cu's finishing kernels.
import os, re, sys
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, '..', '..', 'shaders', 'cuda') + '/'
def body_span(s, start):
    # index of the '{' after start, and the index after its matching '}', skipping strings
    i = s.index('{', start)
    depth = 0; j = i
    while True:
        c = s[j]
        if c == '"':
            j += 1
            while s[j] != '"':
                if s[j] == '\\': j += 1
                j += 1
        elif c == "'":
            j += 1
            while s[j] != "'":
                if s[j] == '\\': j += 1
                j += 1
        elif c == '{': depth += 1
        elif c == '}':
            depth -= 1
            if depth == 0: return i, j + 1
        j += 1
def replace_body(s, header, new_body):
    k = s.index(header)
    i, j = body_span(s, k + len(header) - 1 if header.endswith('{') else k)
    return s[:i] + new_body + s[j:]
common = open(root + 'common.cuh').read()
common = common.replace('#include <cuda_fp16.h>', '').replace('#include <cuda_bf16.h>', '')
for h, b in [
    ('__device__ __forceinline__ unsigned smem_addr(const void* p) {', '{ return emu::smem_addr(p); }'),
    ('__device__ __forceinline__ void cp_async16(void* dst, const void* src) {', '{ emu::cp_async(emu::smem_addr(dst), src, 16); }'),
    ('__device__ __forceinline__ void cp_async_wait() {', '{ emu::cp_wait(-1); }'),
    ('__device__ __forceinline__ void cp_async_commit() {', '{ emu::cp_commit(); }'),
    ('template <int N> __device__ __forceinline__ void cp_async_wait_group() {', '{ emu::cp_wait(N); }'),
    ('__device__ __forceinline__ int opaque(int x) {', '{ return x; }'),
]:
    common = replace_body(common, h, b)
chunk = open(root + 'chunk.cuh').read()
for h, b in [
    ('template <> struct MmaOp<__half> {', '{ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) { emu::mma<__half>(d, a, b0, b1); } }'),
    ('template <> struct MmaOp<__nv_bfloat16> {', '{ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) { emu::mma<__nv_bfloat16>(d, a, b0, b1); } }'),
    ('__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool valid) {', '{ emu::cp_async(dst, src, valid ? 16 : 0); }'),
    ('__device__ __forceinline__ void ldsm4(unsigned (&x)[4], unsigned addr) {', '{ emu::ldsm(x, addr, false); }'),
    ('__device__ __forceinline__ void ldsm4_t(unsigned (&x)[4], unsigned addr) {', '{ emu::ldsm(x, addr, true); }'),
    ('__device__ __forceinline__ void stsm4_t(unsigned addr, const unsigned (&x)[4]) {', '{ emu::stsm(addr, x, true); }'),
    ('__device__ __forceinline__ void named_barrier(int id, int count) {', '{ emu::named_barrier(id, count); }'),
    ('__device__ __forceinline__ unsigned to_tf32(float x) {', '{ return emu::to_tf32(x); }'),
    ('__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {', '{ emu::mma_tf32(d, a, b0, b1); }'),
]:
    chunk = replace_body(chunk, h, b)
if len(sys.argv) > 1 and sys.argv[1] == 'finish':
    # backward.cu's finishing kernels (BackwardParams and the kernels after the exact pass)
    b = open(root + 'backward.cu').read()
    head = b[b.index('namespace gdn {'):b.index('__device__ __forceinline__ size_t bwd_state_offset')]
    body = b[b.index('// Per (token, q/k head) row, a warp each'):b.index('}  // namespace gdn')]
    out = '#include "shim.h"\n#define __shared__ static\n' + common + '\n' + head + '\n' + body + '\n}  // namespace gdn\n'
    open(os.path.join(here, 'finish_kernels.inc'), 'w').write(out)
    sys.exit(0)
out = '#include "shim.h"\n' + common + '\n' + chunk + '\n'
fwd = len(sys.argv) > 1 and sys.argv[1] == 'fwd'
files = [root + 'chunk_bwd_chain.cuh', root + 'chunk_bwd_grad.cu', root + 'chunk_combine.cu']
if fwd:
    files = [sys.argv[2] if len(sys.argv) > 2 else root + 'chunked.cu', root + 'chunk_combine.cu']
for f in files:
    t = open(f).read()
    if 'void named_barrier(int id, int count) {' in t:
        t = replace_body(t, '__device__ __forceinline__ void named_barrier(int id, int count) {', '{ emu::named_barrier(id, count); }')
    if 'void named_arrive(int id, int count) {' in t:
        t = replace_body(t, '__device__ __forceinline__ void named_arrive(int id, int count) {', '{ emu::named_arrive(id, count); }')
    # extern "C" kernels: plain host functions here (the templates are what the harness calls)
    t = re.sub(r'#define GDN_[A-Z_]+\(.*?(?<!\\)\n(?=\S|\n)', '', t, flags=re.S)
    t = re.sub(r'^GDN_[A-Z_]+\(.*\)\s*$', '', t, flags=re.M)
    out += '\n// ' + os.path.basename(f) + '\n' + t
out = out.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = emu::blk->smem;')
out = out.replace('extern __shared__ __align__(16) float smem[];', 'float* smem = reinterpret_cast<float*>(emu::blk->smem);')
assert 'asm' not in re.sub(r'//.*', '', out), [l for l in out.split('\n') if 'asm' in l and not l.strip().startswith('//')][:5]
open(os.path.join(here, 'fwd_kernels.inc' if fwd else 'kernels.inc'), 'w').write(out)
