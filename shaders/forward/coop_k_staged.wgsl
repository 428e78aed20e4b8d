// The K operand of the cooperative-matrix scans staged through workgroup memory
// (`GDN_COOP_STAGE=on`): each chunk's 64 × 128 f16 rows of this workgroup's qk head are read
// from storage with 16-byte loads (8 per invocation), issued one phase ahead by k_fetch and
// written to `k_stage` by k_store, and the K and Kᵀ tiles are cooperative loads from
// workgroup memory. Same API as coop_k_direct.wgsl (there, storage loads and no-ops); here
// k_rows/k_cols read the chunk last stored, whatever `start` says: the pass calls k_store
// between barriers, after its last tile read of the current chunk and before the first of
// the next.

alias K16 = vec4<u32>;      // eight f16
const K_STAGED: bool = true;

const KP: u32 = 136u;       // row pitch of k_stage (f16): 272-byte rows, so that eight rows of 16 B span all banks

var<workgroup> k_stage: array<f16, 64u * KP>;
var<private> k_head: u32;   // this workgroup's qk-head offset in a token row of k16, in 16-byte words

fn k_begin(hqk: u32) {
    k_head = hqk * (KD / 8u);
}

fn k_rows(start: u32, row: u32, key: u32) -> coop_mat16x16<f16, A> {
    let i = row * KP + key;
    return coopLoadT<coop_mat16x16<f16, A>>(&k_stage[i], KP);
}

fn k_cols(start: u32, row: u32, key: u32) -> coop_mat16x16<f16, A> {
    let i = row * KP + key;
    return coopLoad<coop_mat16x16<f16, A>>(&k_stage[i], KP);
}

// The chunk's K in flight: word n of invocation t is row (t + 128 n) / 16, keys 8 ((t + 128 n) % 16) ...
struct KWords {
    w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>,
    w4: vec4<u32>, w5: vec4<u32>, w6: vec4<u32>, w7: vec4<u32>,
}

fn k_word(t: u32, n: u32, start: u32) -> vec4<u32> {
    let w = t + WG * n;
    return k16[(start + w / 16u) * heads_qk_count() * (KD / 8u) + k_head + w % 16u];
}

fn k_fetch(t: u32, start: u32) -> KWords {
    return KWords(k_word(t, 0u, start), k_word(t, 1u, start), k_word(t, 2u, start),
                  k_word(t, 3u, start), k_word(t, 4u, start), k_word(t, 5u, start),
                  k_word(t, 6u, start), k_word(t, 7u, start));
}

// Word n of this invocation into k_stage (f16 pairs through f32: exact; naga has no
// bitcast from u32 to vec2<f16>).
fn k_put(t: u32, n: u32, x: vec4<u32>) {
    let w = t + WG * n;
    let i = (w / 16u) * KP + 8u * (w % 16u);
    let a = vec2<f16>(unpack2x16float(x.x));
    let b = vec2<f16>(unpack2x16float(x.y));
    let c = vec2<f16>(unpack2x16float(x.z));
    let d = vec2<f16>(unpack2x16float(x.w));
    k_stage[i] = a.x;
    k_stage[i + 1u] = a.y;
    k_stage[i + 2u] = b.x;
    k_stage[i + 3u] = b.y;
    k_stage[i + 4u] = c.x;
    k_stage[i + 5u] = c.y;
    k_stage[i + 6u] = d.x;
    k_stage[i + 7u] = d.y;
}

fn k_store(t: u32, k: KWords) {
    k_put(t, 0u, k.w0);
    k_put(t, 1u, k.w1);
    k_put(t, 2u, k.w2);
    k_put(t, 3u, k.w3);
    k_put(t, 4u, k.w4);
    k_put(t, 5u, k.w5);
    k_put(t, 6u, k.w6);
    k_put(t, 7u, k.w7);
}
