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
