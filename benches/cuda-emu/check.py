# Compares emu's dump with float64 BPTT on the same rounded inputs (dq, dk per q/k head, summed
# over the GVA group; dg, dβ per v-head w.r.t. the activated gates), relative L2.
import os, numpy as np, sys
d = np.fromfile(os.environ.get('EMU_DUMP', 'dump.bin'), dtype=np.uint8)
hdr = d[:32].view(np.int32); H, HV, K, V, N, TT, flags, hd = [int(x) for x in hdr]
off = 32
cu = d[off:off + 4 * (N + 1)].view(np.int32); off += 4 * (N + 1)
def take(n, shape):
    global off
    x = d[off:off + 4 * n].view(np.float32).astype(np.float64).reshape(shape); off += 4 * n; return x
q = take(TT*H*K, (TT, H, K)); k = take(TT*H*K, (TT, H, K)); v = take(TT*HV*V, (TT, HV, V))
g = take(TT*HV, (TT, HV)); b = take(TT*HV, (TT, HV)); h0 = take(N*HV*K*V, (N, HV, K*V))
dO = take(TT*HV*V, (TT, HV, V)); dht = take(N*HV*K*V, (N, HV, K*V))
dq = take(TT*H*K, (TT, H, K)); dk = take(TT*H*K, (TT, H, K)); dv = take(TT*HV*V, (TT, HV, V))
dg = take(TT*HV, (TT, HV)); db = take(TT*HV, (TT, HV)); dh0 = take(N*HV*K*V, (N, HV, K*V))
vf = flags & 16; has_h0 = hd & 1; has_dht = hd & 2
sc = K ** -0.5
def user(x):  # user layout -> K x V
    return x.reshape(V, K).T if vf else x.reshape(K, V)
R = {n: np.zeros_like(x) for n, x in [('dq', np.zeros((TT, HV, K))), ('dk', np.zeros((TT, HV, K))), ('dv', dv), ('dg', dg), ('db', db), ('dh0', dh0)]}
for n in range(N):
    s0, s1 = cu[n], cu[n + 1]
    for hv in range(HV):
        h = hv // (HV // H)
        S = [user(h0[n, hv]) if has_h0 else np.zeros((K, V))]
        for t in range(s0, s1):
            Sa = np.exp(g[t, hv]) * S[-1]; u = b[t, hv] * (v[t, hv] - Sa.T @ k[t, h]); S.append(Sa + np.outer(k[t, h], u))
        dS = user(dht[n, hv]) if has_dht else np.zeros((K, V))
        for t in reversed(range(s0, s1)):
            i = t - s0; a = np.exp(g[t, hv]); Sa = a * S[i]; err = v[t, hv] - Sa.T @ k[t, h]; u = b[t, hv] * err
            R['dq'][t, hv] = sc * S[i + 1] @ dO[t, hv]; dS = dS + sc * np.outer(q[t, h], dO[t, hv])
            du = dS.T @ k[t, h]; dkt = dS @ u; R['db'][t, hv] = du @ err; R['dv'][t, hv] = b[t, hv] * du; dp = -b[t, hv] * du
            dkt += Sa @ dp; R['dk'][t, hv] = dkt; dS = dS + np.outer(k[t, h], dp)
            R['dg'][t, hv] = a * (dS * S[i]).sum(); dS = a * dS
        R['dh0'][n, hv] = (dS.T if vf else dS).reshape(-1)
G = HV // H
for n in ('dq', 'dk'):
    R[n] = R[n].reshape(TT, H, G, K).sum(2)
got = {'dq': dq, 'dk': dk, 'dv': dv, 'dg': dg, 'db': db, 'dh0': dh0}
for name in ['dq', 'dk', 'dv', 'dg', 'db'] + (['dh0'] if has_h0 else []):
    a, r = got[name], R[name]
    e = np.linalg.norm(a - r) / np.linalg.norm(r)
    print(f'{name}: rel-L2 {e:.2e}  nan {np.isnan(a).sum()}')
# dA_log-like sums per v-head: Σ_t dg_t·g_t (what gate_finish reduces), and Σ_t dg_t
for nm, w in [('sum dg*g', g), ('sum dg', np.ones_like(g))]:
    a = (dg * w).sum(0); r = (R['dg'] * w).sum(0)
    print(f'{nm}: rel-L2 {np.linalg.norm(a - r) / np.linalg.norm(r):.2e}')
