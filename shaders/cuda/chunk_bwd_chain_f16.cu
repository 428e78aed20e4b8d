// The chunked backward's sequential passes (chunk_bwd_chain.cuh) for f16 storage: a source per
// dtype, so the two compile in parallel and a f16 backward compiles only its own.
GDN_CHUNK_BWD_CHAINS(f16, __half)
