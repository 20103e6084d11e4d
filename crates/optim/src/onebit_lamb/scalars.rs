//! 1-bit LAMB's per-segment scalars: the running trust average `c_avg`,
//! the momentum scales `k` and the last variance ratios `r_prev`, in f64
//! on the host. A device step keeps `c_avg` and `r_prev` on the device
//! instead (f32, one buffer), where its kernels update them, so that the
//! step never waits to read them: the host's copies are refreshed only
//! where the host needs them (a checkpoint, the freeze, a host step, the
//! ratio's decay blend). `k` changes only at the freeze and is uploaded
//! with each step that reads it.

use cubecl::server::Handle;

use super::OneBitLambConfig;
use crate::pass::lamb::Trust;
use crate::{DeviceFlat, Flat, ParamLayout};

pub(super) struct SegmentScalars {
    c_avg: Vec<f64>,
    pub(super) k: Vec<f64>,
    r_prev: Vec<f64>,
    /// `c_avg` then `r_prev` as f32 on the parameters' device; while here
    /// these are the values and the host's two vectors are stale.
    device: Option<Flat>,
}

impl SegmentScalars {
    /// `p` segments: no trust averaged yet, unit scales and ratios.
    pub(super) fn new(p: usize) -> Self {
        Self {
            c_avg: vec![0.0; p],
            k: vec![1.0; p],
            r_prev: vec![1.0; p],
            device: None,
        }
    }

    /// Keeps `c_avg` and `r_prev` beside the step's parameters: uploaded
    /// to `device` (nothing when already there), or with `None` read back
    /// to the host (nothing when already there).
    pub(super) fn follow(&mut self, device: Option<&DeviceFlat>) {
        match (device, &mut self.device) {
            (Some(like), None) => {
                let values: Vec<f32> = self
                    .c_avg
                    .iter()
                    .chain(&self.r_prev)
                    .map(|&v| v as f32)
                    .collect();
                let mut flat = Flat::from_vec(values);
                flat.move_to_device(like);
                self.device = Some(flat);
            }
            (None, Some(_)) => {
                let (c_avg, r_prev) = self.values();
                (self.c_avg, self.r_prev) = (c_avg, r_prev);
                self.device = None;
            }
            _ => {}
        }
    }

    /// The device buffer of `c_avg` then `r_prev`.
    ///
    /// # Panics
    /// When they are on the host ([`SegmentScalars::follow`] moves them).
    pub(super) fn on_device(&self) -> &Handle {
        self.device
            .as_ref()
            .expect("1-bit LAMB's scalars on the device")
            .handle()
    }

    /// `c_avg` and `r_prev`, read from the device where they are there.
    pub(super) fn values(&self) -> (Vec<f64>, Vec<f64>) {
        match &self.device {
            None => (self.c_avg.clone(), self.r_prev.clone()),
            Some(flat) => {
                let values: Vec<f64> = flat.read().iter().map(|&v| f64::from(v)).collect();
                let (c_avg, r_prev) = values.split_at(self.k.len());
                (c_avg.to_vec(), r_prev.to_vec())
            }
        }
    }

    /// The host's `c_avg`, `k` and `r_prev` to set (a checkpoint's): the
    /// device's values are read back first, so a role not set keeps its.
    pub(super) fn host_mut(&mut self) -> [&mut Vec<f64>; 3] {
        self.follow(None);
        [&mut self.c_avg, &mut self.k, &mut self.r_prev]
    }

    /// The host's `c_avg` (a host step's or the basic ablation's).
    ///
    /// # Panics
    /// When it is on the device.
    pub(super) fn c_avg(&self) -> &[f64] {
        assert!(self.device.is_none(), "1-bit LAMB's c_avg is on the device");
        &self.c_avg
    }

    /// The momentum scales from each segment's `Σm²` at the freeze: the
    /// mean RMS over segments with a nonzero one, divided by the segment's.
    pub(super) fn set_scales(&mut self, layout: &ParamLayout, squares: &[f64]) {
        self.follow(None);
        let s: Vec<f64> = layout
            .segments()
            .iter()
            .zip(squares)
            .map(|(seg, &sq)| (sq / seg.len.max(1) as f64).sqrt())
            .collect();
        let positive: Vec<f64> = s.iter().copied().filter(|&s| s > 0.0).collect();
        let mean = positive.iter().sum::<f64>() / positive.len().max(1) as f64;
        self.k = s
            .iter()
            .map(|&s| if s > 0.0 { mean / s } else { 1.0 })
            .collect();
        self.r_prev.fill(1.0);
    }

    /// Each segment's largest variance ratio clipped to within
    /// `r_threshold` of the last one, then to `[r_min, r_max]`; kept as the
    /// next step's last one (on the host; the device's rule:
    /// terse-kernels' `fresh_variance_update`).
    pub(super) fn clip_ratios(&mut self, c: &OneBitLambConfig, raw: &[f64]) -> Vec<f64> {
        assert!(
            self.device.is_none(),
            "1-bit LAMB's ratios are on the device"
        );
        let ratios: Vec<f64> = raw
            .iter()
            .zip(&self.r_prev)
            .map(|(&r, &prev)| {
                let r = r.clamp((1.0 - c.r_threshold) * prev, (1.0 + c.r_threshold) * prev);
                r.clamp(c.r_min, c.r_max)
            })
            .collect();
        self.r_prev.clone_from(&ratios);
        ratios
    }

    /// `c_avg = β3·c_avg + (1-β3)·c` for each segment whose coefficient was
    /// not degenerate (a norm of zero), on the host.
    pub(super) fn average_trust(&mut self, beta_3: f64, trusts: &[Trust]) {
        assert!(self.device.is_none(), "1-bit LAMB's c_avg is on the device");
        for (c_avg, trust) in self.c_avg.iter_mut().zip(trusts) {
            if !trust.degenerate {
                *c_avg = beta_3 * *c_avg + (1.0 - beta_3) * trust.coefficient;
            }
        }
    }
}
