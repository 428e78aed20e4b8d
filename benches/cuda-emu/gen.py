# Builds kernels.inc: common.cuh, chunk.cuh and the chunked backward's passes with every
# inline-PTX helper (ldmatrix, mma.sync, cp.async, cvta) replaced by shim.h's emulation.
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
    ('__device__ __forceinline__ void cp_async_wait() {', '{}'),
    ('__device__ __forceinline__ void cp_async_commit() {', '{}'),
    ('template <int N> __device__ __forceinline__ void cp_async_wait_group() {', '{}'),
]:
    common = replace_body(common, h, b)
chunk = open(root + 'chunk.cuh').read()
for h, b in [
    ('__device__ __forceinline__ void ldsm_x4(unsigned* x, const void* p) {', '{ emu::ldsm(x, emu::smem_addr(p), TRANS); }'),
    ('template <> struct MmaOp<__half> {', '{ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) { emu::mma<__half>(d, a, b0, b1); } }'),
    ('template <> struct MmaOp<__nv_bfloat16> {', '{ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) { emu::mma<__nv_bfloat16>(d, a, b0, b1); } }'),
    ('__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool valid) {', '{ emu::cp_async(dst, src, valid ? 16 : 0); }'),
    ('__device__ __forceinline__ void ldsm4(unsigned (&x)[4], unsigned addr) {', '{ emu::ldsm(x, addr, false); }'),
    ('__device__ __forceinline__ void ldsm4_t(unsigned (&x)[4], unsigned addr) {', '{ emu::ldsm(x, addr, true); }'),
]:
    chunk = replace_body(chunk, h, b)
out = '#include "shim.h"\n' + common + '\n' + chunk + '\n'
for f in ['chunk_bwd_chain.cu', 'chunk_bwd_grad.cu']:
    t = open(root + f).read()
    out += '\n// ' + f + '\n' + t
out = out.replace('extern __shared__ __align__(128) unsigned char smem[];', 'unsigned char* smem = emu::blk->smem;')
assert 'asm' not in re.sub(r'//.*', '', out), [l for l in out.split('\n') if 'asm' in l and not l.strip().startswith('//')][:5]
open(os.path.join(here, 'kernels.inc'), 'w').write(out)
