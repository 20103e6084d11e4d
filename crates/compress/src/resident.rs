//! Buffers whose pages are resident from the moment they are made.
//!
//! `vec![0.0; n]` takes zeroed memory from the allocator, which fresh pages
//! are without being touched: the kernel maps each page at its first use.
//! Optimizer state was made that way at start-up and touched late: local
//! ranks that share cores split the warmup's update, so each rank wrote
//! only its quarter of m and v until the freeze step gathered the rest,
//! and the compression stage's buffers (error feedback, the fresh
//! variance) waited for that stage's first step. Those steps then faulted
//! ~600 MB in across 4 rank threads, page by page; a read before the
//! first write maps the shared zero page, so the write after it faults
//! again and shoots down the other threads' TLB entries. BERT-mini on 4
//! local ranks: steps 12 and 13 ran at 33 and 12 samples/s against ~55.
//! Writing each buffer once when it is made moves the cost to set-up,
//! which pays it once either way; peak memory is unchanged (the run uses
//! every page of these buffers).

/// A vector of `len` copies of `value`, every page written (so resident).
pub fn filled<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut buffer = Vec::with_capacity(len);
    // `resize` writes every element into memory the allocator did not
    // promise to be zero, so nothing turns it back into a lazy zeroed
    // allocation (as `vec![0; len]` is).
    buffer.resize(len, value);
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_len_copies() {
        assert_eq!(filled(5, 1.5f32), vec![1.5; 5]);
        assert!(filled::<u32>(0, 7).is_empty());
    }
}
