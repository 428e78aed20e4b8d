// The K operand of the cooperative-matrix scans, read straight from storage (the default; see
// coop_k_staged.wgsl for the staged variant, `GDN_COOP_STAGE`). Inserted after
// coop_scan_tiles.wgsl; the pass declares `k16: array<K16>` ([rows + 64, H, K] f16) and calls
// k_begin once, then k_rows/k_cols for tiles of the chunk that starts at token `start`, and
// k_fetch/k_store where the staged variant moves the next chunk (no-ops here).

alias K16 = f16;
const K_STAGED: bool = false;

var<private> k_head: u32;   // this workgroup's qk-head offset in a token row of k16

fn k_begin(hqk: u32) {
    k_head = hqk * KD;
}

// Tile of K: tokens start + row .. + 15 (rows), keys key .. key + 15 (the A operand of K S).
fn k_rows(start: u32, row: u32, key: u32) -> coop_mat16x16<f16, A> {
    let hk = heads_qk_count() * KD;
    let i = (start + row) * hk + k_head + key;
    return coopLoadT<coop_mat16x16<f16, A>>(&k16[i], hk);
}

// Tile of Kᵀ: keys key .. key + 15 (rows), tokens start + row .. + 15 (a column-major read).
fn k_cols(start: u32, row: u32, key: u32) -> coop_mat16x16<f16, A> {
    let hk = heads_qk_count() * KD;
    let i = (start + row) * hk + k_head + key;
    return coopLoad<coop_mat16x16<f16, A>>(&k16[i], hk);
}

alias KWords = u32;

fn k_fetch(t: u32, start: u32) -> KWords {
    return 0u;
}

fn k_store(t: u32, w: KWords) {}
