// The chunked backward's sequential passes (chunk_bwd_chain.cuh) for bf16 storage: a source per
// dtype, so the two compile in parallel and a bf16 backward compiles only its own.
GDN_CHUNK_BWD_CHAINS(bf16, __nv_bfloat16)
