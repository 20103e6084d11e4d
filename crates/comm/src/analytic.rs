//! The analytic bytes one rank sends per optimizer step, by ALGORITHMS.md's
//! volumes: what `cargo xtask reproduce comm-volume` expects the traffic
//! meter and the wire to show. Plain functions of sizes with no imports, so
//! xtask (which links no workspace crate) compiles this same file by path
//! (so it may hold no tests or imports); crates/comm/tests/analytic.rs
//! ties them to the traffic meter's per-collective volumes.

/// The share of a buffer each rank sends in a bandwidth-optimal allreduce
/// (reduce-scatter + all-gather) on `ranks` ranks: `2(n-1)/n`.
pub fn allreduce_share(ranks: usize) -> f64 {
    let n = ranks as f64;
    2.0 * (n - 1.0) / n
}

/// An fp32 allreduce of `elements`: `2(n-1)/n·4d`.
pub fn fp32_allreduce_bytes(elements: f64, ranks: usize) -> f64 {
    allreduce_share(ranks) * 4.0 * elements
}

/// The 1-bit compressed allreduce of `elements` (all-to-all of the packed
/// signs, then all-gather of the server's recompressed chunk):
/// `2(n-1)/n·d/8`, the per-chunk scales left out (bytes, not per element).
pub fn onebit_allreduce_bytes(elements: f64, ranks: usize) -> f64 {
    allreduce_share(ranks) * elements / 8.0
}

/// SLAMB's sparse allreduce: a fraction `k` of the hashed elements plus
/// every always-synchronised one, as fp32 values: `2(n-1)/n·4·(k·(d -
/// d_small) + d_small)`.
pub fn sparse_allreduce_bytes(elements: f64, ranks: usize, k: f64, always_synced: f64) -> f64 {
    allreduce_share(ranks) * 4.0 * (k * (elements - always_synced) + always_synced)
}
