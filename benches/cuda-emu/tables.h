// The chunk and unit tables the launchers build (ChunkedScratch, ChunkPlan; the unit cut is
// src/cuda_backend/chunked.rs's UnitTable::cut): per sequence, (token, length) per 64-token
// chunk, and units of `seg` chunks (0: whole sequences) as (first, end, sequence, flags
// 1 = first | 2 = last); seq_units: each sequence's first unit, then the count.
#pragma once
#include <algorithm>
#include <vector>

inline void chunk_tables(const std::vector<int>& cu, int N, int seg, std::vector<int>& chunks,
                         std::vector<int>& units, std::vector<int>& seq_units) {
    seq_units.assign(1, 0);
    for (int n = 0; n < N; ++n) {
        const int first = chunks.size() / 2;
        for (int c = cu[n]; c < cu[n + 1]; c += 64) { chunks.push_back(c); chunks.push_back(std::min(c + 64, cu[n + 1]) - c); }
        const int end = chunks.size() / 2, per = seg > 0 ? seg : 1 << 30;
        for (int a = first;;) {
            const int b = std::min(a + per, end);
            units.insert(units.end(), {a, b, n, (a == first ? 1 : 0) | (b == end ? 2 : 0)});
            if (b == end) break;
            a = b;
        }
        seq_units.push_back(units.size() / 4);
    }
}

// The prep's grid y (src/cuda_backend/chunked.rs prep_grid): each q/k head's GVA group in
// parts of at most 4 v-heads (chunk.cuh PREP_GROUP), a block per part; EMU_PREP_GROUP caps
// the v-heads per block as GDN_CUDA_PREP_GROUP does.
#include <cstdlib>
inline unsigned prep_grid_y(int H, int HV) {
    const int group = HV / H;
    int cap = 4;
    if (const char* e = std::getenv("EMU_PREP_GROUP")) cap = std::max(1, std::min(4, atoi(e)));
    int per = 1;
    for (int d = std::min(cap, group); d >= 1; --d) if (group % d == 0) { per = d; break; }
    return (unsigned)(H * (group / per));
}
// chunked.rs prep_smem: three tiles, then the gates of up to 4 v-heads.
constexpr size_t PREP_SMEM = 3 * 2 * 64 * 136 + 4 * 2 * 64 * 4;
