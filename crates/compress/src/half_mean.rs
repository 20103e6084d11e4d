//! The layout of SLAMB's fp16 mean over ranks (`SparseValues::F16` in
//! terse-comm), shared by its host loop and its device kernels so both cut
//! the values into the same slices: `count` values rounded to fp16 and
//! padded to `world` slices of `part` halves; rank `r` receives slice `r`
//! of every rank (an all-to-all), sums it in fp32 in rank order, scales the
//! sum and rounds it to fp16 (its own slice of the mean), and the owned
//! slices are all-gathered, so every rank holds the same values.

/// `count` values cut into `world` slices of fp16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HalfSlices {
    /// How many values are averaged.
    pub count: usize,
    /// How many ranks average them.
    pub world: usize,
}

impl HalfSlices {
    /// Halves per slice (the last slices padded with zeros).
    pub fn part(&self) -> usize {
        self.count.div_ceil(self.world)
    }

    /// Halves in all slices: what each rank sends in the all-to-all and
    /// receives in both exchanges.
    pub fn all_halves(&self) -> usize {
        self.world * self.part()
    }
}

/// Which of the fp16 mean's two exchanges a call makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfExchange {
    /// Every rank's `world` slices to their owners: sends and receives
    /// [`HalfSlices::all_halves`] halves.
    AllToAll,
    /// Each owner's mean of its slice to every rank: sends
    /// [`HalfSlices::part`] halves and receives [`HalfSlices::all_halves`].
    AllGather,
}

impl HalfExchange {
    /// Bytes sent and received by this exchange.
    pub fn bytes(self, slices: HalfSlices) -> (usize, usize) {
        let all = 2 * slices.all_halves();
        match self {
            HalfExchange::AllToAll => (all, all),
            HalfExchange::AllGather => (2 * slices.part(), all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_pad_the_last_ranks() {
        let slices = HalfSlices {
            count: 10,
            world: 4,
        };
        assert_eq!((slices.part(), slices.all_halves()), (3, 12));
        assert_eq!(HalfExchange::AllToAll.bytes(slices), (24, 24));
        assert_eq!(HalfExchange::AllGather.bytes(slices), (6, 24));
        let none = HalfSlices { count: 0, world: 3 };
        assert_eq!(HalfExchange::AllGather.bytes(none), (0, 0));
    }
}
