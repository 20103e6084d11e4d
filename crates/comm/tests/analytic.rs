//! terse-comm's analytic volumes (the expectations of `reproduce
//! comm-volume`) are the traffic meter's collectives: the fp32 allreduce,
//! the 1-bit allreduce's all-to-all + all-gather, SLAMB's allreduce of the
//! selected values.

use terse_comm::analytic::{fp32_allreduce_bytes, onebit_allreduce_bytes, sparse_allreduce_bytes};
use terse_comm::traffic::{Collective, volume};

#[test]
fn the_formulas_are_the_meters_collectives() {
    for ranks in [2, 4, 8] {
        let d = 8 * 1024 * ranks;
        let sent = |kind, bytes| volume(kind, ranks, 0, 0, bytes).0 as f64;
        assert_eq!(
            fp32_allreduce_bytes(d as f64, ranks),
            sent(Collective::Allreduce, 4 * d)
        );
        // Worker: all-to-all of d/8 bytes of signs; server: all-gather
        // of its 1/n share of them.
        let onebit = sent(Collective::AllToAll, d / 8) + sent(Collective::AllGather, d / 8 / ranks);
        assert_eq!(onebit_allreduce_bytes(d as f64, ranks), onebit);
        let (k, small) = (0.125, 1024);
        let selected = (k * (d - small) as f64) as usize + small;
        assert_eq!(
            sparse_allreduce_bytes(d as f64, ranks, k, small as f64),
            sent(Collective::Allreduce, 4 * selected)
        );
    }
}
