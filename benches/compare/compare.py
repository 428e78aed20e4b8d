#!/usr/bin/env python3
"""Side by side: gdn-wgpu (`gdn bench --json`) against FLA's Triton kernels on the same shapes.

Run by run.sh on the GPU machine; see README.md beside this file. Subcommands:

  fla     --ours OURS.json --out FLA.json
          Times FLA's chunk_gated_delta_rule (forward) and fused_recurrent_gated_delta_rule
          (decode) on every shape of OURS.json, bf16 and fp32 inputs, with CUDA-graph replay
          (triton.testing.do_bench_cudagraph, median), rotating among as many input copies as our
          bench did (`input_sets`), so both sides are timed cache-cold alike. Needs torch + FLA.
  xcheck-inputs --dir DIR
          Writes identical fp32 inputs as safetensors (DIR/in_<case>.safetensors), FLA's fp32
          outputs (DIR/fla_<case>.safetensors) and an f64 PyTorch reference of the recurrence
          (DIR/ref_<case>.safetensors). run.sh then runs `gdn run forward|decode` on each input.
          Needs torch + FLA.
  report  --ours OURS.json [MORE.json] --fla FLA.json [--xcheck DIR] [--out-md PATH] [--out-json PATH]
          Prints one table (ours, FLA, ratio) and the numerics cross-check. Pure Python.

Only the Python standard library is needed for `report`; safetensors files are read and written
here directly (no safetensors package needed).
"""
import argparse
import array
import json
import math
import os
import struct
import sys
import time

# ---------------------------------------------------------------------------------------------
# safetensors, minimal (F32, F64, I64), no dependencies.

_ST_CODES = {"F32": "f", "F64": "d", "I64": "q"}


def st_write(path, tensors):
    """tensors: {name: (dtype, shape, bytes)} in order."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def st_read(path):
    """{name: (dtype, shape, array)} with array.array values (F32, F64, I64)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        a = array.array(_ST_CODES[info["dtype"]])
        a.frombytes(raw[8 + n + start:8 + n + end])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = (info["dtype"], info["shape"], a)
    return out


def rel_l2(got, want):
    if len(got) != len(want):
        raise ValueError(f"lengths differ: {len(got)} vs {len(want)}")
    try:
        import numpy as np
        a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if not np.isfinite(a).all():
            return float("nan")
        den = float(np.dot(b, b))
        num = float(np.dot(a - b, a - b))
        return math.sqrt(num / den) if den > 0 else math.sqrt(num)
    except ImportError:
        pass
    num = den = 0.0
    for a, b in zip(got, want):
        d = a - b
        num += d * d
        den += b * b
    if any(math.isnan(a) or math.isinf(a) for a in got):
        return float("nan")
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


# ---------------------------------------------------------------------------------------------
# Shapes, as our JSON describes them.


def seq_lens(rec):
    """Sequence lengths of a record's shape (decode: one token per sequence)."""
    s = rec["shape"]
    if rec["op"] == "decode":
        return [1] * s["sequences"]
    seqs = s["seqs"]
    if "+" in seqs:
        return [int(x) for x in seqs.split("+")]
    a, b = (int(x) for x in seqs.lower().split("x"))
    return [b] if a == 1 else [a] * b


def case_key(rec):
    s = rec["shape"]
    return f'{rec["op"]} {s["heads_qk"]}/{s["heads_v"]} {s["seqs"]} K{s["key_dim"]} V{s["value_dim"]}'


# ---------------------------------------------------------------------------------------------
# FLA timing (torch + FLA).


def _torch():
    os.environ.setdefault("FLA_FLASH_QLA", "0")  # time FLA's own Triton kernels
    import torch  # noqa: F401
    return torch


def make_inputs(torch, lens, H, HV, K, V, dtype, dense_batch, seed, cu=None):
    """Our bench's distributions: q ~ N(0,1), unit-norm k, v ~ N(0,1), g = logsigmoid(N(0,1)),
    beta ~ U(0,1), h0 ~ 0.5·N(0,1) (fp32); q, k, v in `dtype`. Uniform sets are a dense batch,
    mixed lengths are packed (B = 1, cu_seqlens; pass `cu` to share one cu_seqlens tensor among
    copies: FLA caches what it derives from cu_seqlens by tensor identity, and a cache miss
    inside CUDA-graph capture would need a host sync)."""
    import torch.nn.functional as F
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    if dense_batch:
        B, T, cu = len(lens), lens[0], None
    else:
        B, T = 1, sum(lens)
        if cu is None:
            cu = torch.tensor([0] + list(_cumsum(lens)), dtype=torch.long, device=dev)
    N = len(lens)
    q = torch.randn(B, T, H, K, device=dev, generator=gen).to(dtype)
    k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, device=dev, generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, HV, device=dev, generator=gen))
    beta = torch.rand(B, T, HV, device=dev, generator=gen)
    h0 = 0.5 * torch.randn(N, HV, K, V, device=dev, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu)


def _cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t


def cmd_fla(args):
    torch = _torch()
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    import fla
    ours = load_ours(args.ours)
    versions = dict(torch=torch.__version__, triton=triton.__version__, fla=getattr(fla, "__version__", "?"),
                    device=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    print("FLA side:", versions, flush=True)
    # FLA_DTYPES (e.g. "bf16") narrows the timed dtypes: each one's first calls autotune for
    # minutes on an empty Triton cache.
    wanted = os.environ.get("FLA_DTYPES", "bf16,fp32").split(",")
    dtypes = [d for d in [("bf16", torch.bfloat16), ("fp32", torch.float32)] if d[0] in wanted]
    rows, seen = [], set()
    t_start = time.time()
    for rec in ours["records"]:
        if rec["op"] not in ("forward", "decode") or case_key(rec) in seen:
            continue
        seen.add(case_key(rec))
        s = rec["shape"]
        H, HV, K, V = s["heads_qk"], s["heads_v"], s["key_dim"], s["value_dim"]
        lens = seq_lens(rec)
        # As ours: LENxCOUNT is a dense batch, L1+L2 is packed with cu_seqlens even when equal.
        dense = rec["op"] == "decode" or "+" not in s["seqs"]
        sets = max(1, int(rec.get("input_sets") or 1))
        row = dict(key=case_key(rec), op=rec["op"], input_sets=sets)
        for name, dt in dtypes:
            try:
                cu = None if dense else torch.tensor([0] + list(_cumsum(lens)), dtype=torch.long, device="cuda")
                copies = [make_inputs(torch, lens, H, HV, K, V, dt, dense, seed=17 + i, cu=cu) for i in range(sets)]
                state = {"i": 0}
                if rec["op"] == "forward":
                    def f():
                        x = copies[state["i"] % sets]
                        state["i"] += 1
                        return chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                                      output_final_state=True, cu_seqlens=x["cu_seqlens"])
                else:
                    def f():
                        x = copies[state["i"] % sets]
                        state["i"] += 1
                        return fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                                initial_state=x["initial_state"], output_final_state=True)
                with torch.no_grad():
                    for _ in range(sets):
                        f()  # compiles/autotunes; caches cu_seqlens-derived indices before capture
                    torch.cuda.synchronize()
                    try:
                        ms = triton.testing.do_bench_cudagraph(f, rep=100, return_mode="median")
                        how = "graph"
                    except Exception as e:  # a capture failure: fall back to eager timing
                        print(f"  {row['key']} {name}: CUDA graph failed ({type(e).__name__}: {e}); eager timing", flush=True)
                        torch.cuda.synchronize()
                        ms = triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
                        how = "eager"
                row[name] = dict(ms=ms, timing=how)
            except Exception as e:
                row[name] = dict(ms=None, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            finally:
                copies = None
                torch.cuda.empty_cache()
            print(f"  {row['key']} {name}: {row[name]}", flush=True)
        rows.append(row)
    print(f"FLA side: {len(rows)} shapes in {time.time() - t_start:.0f} s", flush=True)
    json.dump(dict(versions=versions, rows=rows), open(args.out, "w"), indent=1)


# ---------------------------------------------------------------------------------------------
# Numerics cross-check inputs (torch + FLA).

XCHECK = [
    # name, kind, lens, H, HV, K, V; dense = all lengths equal (a batch), else packed
    ("fwd_dense", "forward", [1000, 1000], 2, 8, 128, 128),
    ("fwd_packed", "forward", [300, 700, 1048], 4, 16, 128, 128),
    ("decode", "decode", [64, 64, 64, 64], 2, 8, 128, 128),
]


def _bytes(torch, t):
    t = t.detach().to("cpu").contiguous()
    try:
        return t.numpy().tobytes()
    except Exception:  # no numpy: through Python lists
        code = {torch.float32: "f", torch.float64: "d", torch.int64: "q"}[t.dtype]
        return array.array(code, t.flatten().tolist()).tobytes()


def _st_tensor(torch, t):
    name = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}[t.dtype]
    return (name, list(t.shape), _bytes(torch, t))


def reference_f64(torch, x, lens, H, HV):
    """The recurrence token by token in f64: S ← exp(g)S; u = β(v − Sᵀk); S ← S + k uᵀ;
    o = scale·Sᵀq (per v-head, q/k head hv // (HV/H))."""
    d = lambda t: t.to(torch.float64)
    q, k, v, g, beta, h0 = (d(x[n]) for n in ("q", "k", "v", "g", "beta", "initial_state"))
    B, T = q.shape[0], q.shape[1]
    K = q.shape[-1]
    group = HV // H
    idx = torch.arange(HV, device=q.device) // group
    scale = K ** -0.5
    o = torch.zeros_like(v)
    finals = []
    dense = x["cu_seqlens"] is None
    bounds = [(b, 0, T) for b in range(B)] if dense else [(0, s, e) for s, e in zip([0] + list(_cumsum(lens))[:-1], _cumsum(lens))]
    for n, (b, s, e) in enumerate(bounds):
        S = h0[n].clone()  # [HV, K, V]
        for t in range(s, e):
            qt, kt = q[b, t, idx], k[b, t, idx]  # [HV, K]
            S = S * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, kt))
            S = S + torch.einsum("hk,hv->hkv", kt, u)
            o[b, t] = scale * torch.einsum("hkv,hk->hv", S, qt)
        finals.append(S)
    return o, torch.stack(finals)


def cmd_xcheck_inputs(args):
    torch = _torch()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    os.makedirs(args.dir, exist_ok=True)
    for name, kind, lens, H, HV, K, V in XCHECK:
        dense = len(set(lens)) == 1
        x = make_inputs(torch, lens, H, HV, K, V, torch.float32, dense, seed=1234)
        names = ["q", "k", "v", "g", "beta", "initial_state"] + ([] if dense else ["cu_seqlens"])
        st_write(os.path.join(args.dir, f"in_{name}.safetensors"), {n: _st_tensor(torch, x[n]) for n in names})
        o_ref, s_ref = reference_f64(torch, x, lens, H, HV)
        st_write(os.path.join(args.dir, f"ref_{name}.safetensors"), {"o": _st_tensor(torch, o_ref), "final_state": _st_tensor(torch, s_ref)})
        meta = dict(kind=kind, lens=lens, H=H, HV=HV, K=K, V=V)
        try:
            with torch.no_grad():
                if kind == "forward":
                    o, s = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                                  output_final_state=True, cu_seqlens=x["cu_seqlens"])
                else:
                    o, s = fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                            initial_state=x["initial_state"], output_final_state=True)
            st_write(os.path.join(args.dir, f"fla_{name}.safetensors"),
                     {"o": _st_tensor(torch, o.float()), "final_state": _st_tensor(torch, s.float())})
        except Exception as e:
            meta["fla_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"  FLA fp32 {name}: {meta['fla_error']}", flush=True)
        json.dump(meta, open(os.path.join(args.dir, f"meta_{name}.json"), "w"))
        print(f"  wrote xcheck case {name} ({kind}, lens {lens}, H/HV {H}/{HV})", flush=True)


# ---------------------------------------------------------------------------------------------
# Report (pure Python).

# FlashQLA's published H200 tables (bf16, ms; FlashQLA's benchmark_results_H200.txt, quoted in
# shared/docs/gdn-algorithm.md §8.2), for reference: (op, heads, seqs) -> (FlashQLA, FLA).
PUBLISHED = {
    ("forward", "2/8", "1x32768"): (0.320, 0.902), ("forward", "2/8", "1x8192"): (0.119, 0.234),
    ("forward", "2/8", "4096x8"): (0.203, 0.471), ("forward", "2/8", "1024x8"): (0.061, 0.131),
    ("forward", "4/16", "1x32768"): (0.496, 1.241), ("forward", "16/32", "1x32768"): (0.877, 1.890),
    ("forward", "16/32", "4096x8"): (0.619, 1.914), ("forward", "16/64", "1x32768"): (1.521, 3.331),
    ("forward", "16/64", "1x8192"): (0.397, 0.814), ("forward", "16/64", "4096x8"): (1.217, 3.390),
    ("backward", "16/32", "1x8192"): (0.789, 1.444), ("backward", "16/32", "1x32768"): (2.515, 5.697),
}


def fmt(x, digits=3):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.{digits}f}"
    return f"{x:.4f}"


def xcheck_rows(d):
    rows = []
    for name, kind, lens, H, HV, K, V in XCHECK:
        meta_path = os.path.join(d, f"meta_{name}.json")
        if not os.path.exists(meta_path):
            rows.append(dict(case=name, error="not generated"))
            continue
        meta = json.load(open(meta_path))
        row = dict(case=name, kind=kind, shape=f"{'+'.join(map(str, lens))} tokens, H/HV {H}/{HV}, K=V={K}")
        files = {w: os.path.join(d, f"{w}_{name}.safetensors") for w in ("ours", "fla", "ref")}
        loaded = {w: st_read(p) for w, p in files.items() if os.path.exists(p)}
        if "fla_error" in meta:
            row["fla_error"] = meta["fla_error"]
        if "ours" not in loaded:
            row["error"] = "our output missing (gdn run failed; see the log)"
        for out in ("o", "final_state"):
            def get(w):
                return loaded[w][out][2] if w in loaded and out in loaded[w] else None
            ours, fla, ref = get("ours"), get("fla"), get("ref")
            if ours is not None and fla is not None:
                row[f"{out}_ours_vs_fla"] = rel_l2(ours, fla)
            if ours is not None and ref is not None:
                row[f"{out}_ours_vs_f64"] = rel_l2(ours, ref)
            if fla is not None and ref is not None:
                row[f"{out}_fla_vs_f64"] = rel_l2(fla, ref)
        rows.append(row)
    return rows


def load_ours(paths):
    """One or more `gdn bench --json` files: the first one's header, every file's records."""
    docs = [json.load(open(p)) for p in paths]
    merged = dict(docs[0])
    merged["records"] = [r for d in docs for r in d["records"]]
    return merged


def cmd_report(args):
    ours = load_ours(args.ours)
    fla = json.load(open(args.fla)) if args.fla and os.path.exists(args.fla) else dict(rows=[], versions={})
    fla_rows = {r["key"]: r for r in fla["rows"]}
    adapter = ours.get("adapter") or {}
    lines = []
    say = lambda s="": (print(s), lines.append(s))
    say(f"gdn-wgpu {ours.get('version')} (commit {ours.get('commit')}) on {adapter.get('name')} ({adapter.get('backend')}, driver {adapter.get('driver_info')}), {ours.get('date_utc')}")
    if fla.get("versions"):
        v = fla["versions"]
        say(f"FLA {v.get('fla')} (Triton {v.get('triton')}, torch {v.get('torch')}, CUDA {v.get('cuda')}) on {v.get('device')}")
    # One column per (backend, storage dtype) of ours, in the order the runs were merged: e.g.
    # wgpu F32, wgpu BF16, cuda BF16. Ratios compare like with like: f32 storage with FLA fp32,
    # f16/bf16 storage with FLA bf16.
    runs, groups = [], {}
    for rec in ours["records"]:
        if rec["op"] not in ("forward", "decode", "backward"):
            continue
        run = (rec.get("backend", "wgpu"), rec.get("dtype", "F32"))
        if run not in runs:
            runs.append(run)
        groups.setdefault(case_key(rec), []).append(rec)
    say("ours: wgpu = WGSL compute (Vulkan; GPU time by timestamp queries), cuda = the CUDA kernels "
        "(CUDA-event time; per call from graph replays where the variant says so); median. "
        "FLA: Triton, CUDA-graph replay, median; both rotate the same number of input copies. "
        "ratio = ours / FLA of the same storage class (f32 vs FLA fp32, f16/bf16 vs FLA bf16; > 1: we are slower). "
        "(pub.) = FlashQLA's published H200 table (bf16), not measured here.")
    say()
    run_name = lambda r: f"{r[0]} {r[1].lower()}"
    header = ["op", "heads", "seqs", "tokens"] + [f"{run_name(r)} ms" for r in runs] + \
        ["FLA bf16 ms", "FLA fp32 ms"] + [f"ratio {run_name(r)}" for r in runs] + ["FlashQLA pub. bf16"]
    say("| " + " | ".join(header) + " |")
    say("|" + "---|" * len(header))
    table = []
    for key, recs in groups.items():
        first = recs[0]
        s = first["shape"]
        heads = f'{s["heads_qk"]}/{s["heads_v"]}'
        pub = PUBLISHED.get((first["op"], heads, s["seqs"]))
        f = fla_rows.get(key, {})
        fla_ms = {name: (f.get(name) or {}).get("ms") for name in ("bf16", "fp32")}
        if first["op"] == "backward":
            # FLA's backward refuses that machine's Triton 3.6: its published bf16 time.
            fla_ms = dict(bf16=pub[1] if pub else None, fp32=None)
        entry = dict(key=key, ours={}, fla_bf16_ms=fla_ms["bf16"], fla_fp32_ms=fla_ms["fp32"],
                     fla_published=first["op"] == "backward", ratios={})
        cells, ratios = [first["op"], heads, s["seqs"], str(s["total_tokens"])], []
        for run in runs:
            rec = next((r for r in recs if (r.get("backend", "wgpu"), r.get("dtype", "F32")) == run), None)
            t = rec and (rec.get("gpu_ms") or rec.get("wall_ms"))
            ours_ms = t["median"] if (t and rec["status"] == "ok") else None
            cells.append(fmt(ours_ms) if ours_ms is not None else (rec["status"] if rec else "—"))
            ref = fla_ms["fp32" if run[1] == "F32" else "bf16"]
            ratio = ours_ms / ref if (ours_ms and ref) else None
            ratios.append(f"{ratio:.2f}×" if ratio else "—")
            entry["ours"][run_name(run)] = ours_ms
            entry["ratios"][run_name(run)] = ratio
        for name in ("bf16", "fp32"):
            err = (f.get(name) or {}).get("error")
            if first["op"] == "backward":
                cells.append(f"{fmt(fla_ms[name])} (pub.)" if fla_ms[name] else ("n/a (Triton 3.6)" if name == "bf16" else "—"))
            else:
                cells.append(fmt(fla_ms[name]) if fla_ms[name] is not None else ("error" if err else "—"))
            if err:
                entry[f"fla_{name}_error"] = err
        cells += ratios
        cells.append(fmt(pub[0]) if pub else "—")
        say("| " + " | ".join(cells) + " |")
        table.append(entry)
    errors = {}
    for r in fla["rows"]:
        for n in ("bf16", "fp32"):
            err = (r.get(n) or {}).get("error")
            if err:
                errors.setdefault((n, err), []).append(r["key"])
    if errors:
        say()
        for (n, err), keys in sorted(errors.items()):
            say(f"FLA {n} failed on {len(keys)} shape(s) (e.g. {keys[0]}): {err}")
    xrows = xcheck_rows(args.xcheck) if args.xcheck else []
    if xrows:
        say()
        say("Numerics on identical fp32 inputs (rel-L2; f64 = a PyTorch f64 token-by-token reference):")
        say()
        say("| case | shape | o ours vs FLA fp32 | o ours vs f64 | o FLA vs f64 | state ours vs FLA | state ours vs f64 | state FLA vs f64 |")
        say("|---|---|---|---|---|---|---|---|")
        e = lambda x: "—" if x is None else f"{x:.2e}"
        for r in xrows:
            if "shape" not in r:
                say(f"| {r['case']} | {r.get('error')} |")
                continue
            say(f"| {r['case']} | {r['shape']} | " + " | ".join(e(r.get(k)) for k in (
                "o_ours_vs_fla", "o_ours_vs_f64", "o_fla_vs_f64", "final_state_ours_vs_fla", "final_state_ours_vs_f64", "final_state_fla_vs_f64")) + " |")
            for k in ("error", "fla_error"):
                if r.get(k):
                    say(f"  {r['case']}: {k}: {r[k]}")
    if args.out_md:
        open(args.out_md, "w").write("\n".join(lines) + "\n")
    if args.out_json:
        json.dump(dict(table=table, xcheck=xrows, fla_versions=fla.get("versions"), ours_commit=ours.get("commit")),
                  open(args.out_json, "w"), indent=1)
    # A numerics cross-check with our error above 1e-4 against the f64 reference is a failure.
    bad = [r for r in xrows if any((r.get(k) or 0) > 1e-4 or (r.get(k) is not None and math.isnan(r[k]))
                                   for k in ("o_ours_vs_f64", "final_state_ours_vs_f64"))]
    missing = [r for r in xrows if r.get("error")]
    if bad or missing:
        print(f"cross-check FAILED: {[r['case'] for r in bad + missing]}", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fla")
    p.add_argument("--ours", required=True, nargs="+")
    p.add_argument("--out", required=True)
    p = sub.add_parser("xcheck-inputs")
    p.add_argument("--dir", required=True)
    p = sub.add_parser("report")
    p.add_argument("--ours", required=True, nargs="+", help="gdn bench --json files (records merged)")
    p.add_argument("--fla")
    p.add_argument("--xcheck")
    p.add_argument("--out-md")
    p.add_argument("--out-json")
    args = ap.parse_args()
    if args.cmd == "fla":
        cmd_fla(args)
    elif args.cmd == "xcheck-inputs":
        cmd_xcheck_inputs(args)
    else:
        sys.exit(cmd_report(args))


if __name__ == "__main__":
    main()
