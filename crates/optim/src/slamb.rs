//! SLAMB (ALGORITHMS.md "SLAMB"; Xu et al., Algorithm 1 with Appendix E):
//! every step only a masked subset of the momentum is averaged (the mask is a
//! function of the seed and the step, so no indices travel); elements not
//! synchronised recently are stepped with a smaller rate and their own trust
//! ratio, and the parameters are averaged every H steps.

use std::ops::Range;
use std::time::{Duration, Instant};

use cubecl::prelude::*;
use cubecl::server::Handle;
use serde::{Deserialize, Serialize};
use terse_comm::{SparseAllreduce, SparseValues};
use terse_kernels::device::optim::DeviceChunks;
use terse_kernels::device::slamb_trust::SlambTrust;
use terse_kernels::device::{self, DeviceSelection, with_cuda_addresses};
use terse_kernels::half_mean::{HalfExchange, HalfSlices};
use terse_kernels::mask::{Mask, SparseBuffer};
use terse_kernels::resident::filled;

use crate::config_check::{NoOtherFields, check_clip, check_unit, invalid};
use crate::device_flat::{chunk_table, read_f32, summed_on_gpu, upload_f32};
use crate::eps_mode::check_has_compression_stage;
use crate::moments::Moments;
use crate::pass::lamb::trust_coefficient;
use crate::pass::{
    self, Direction,
    slamb::{Norms, SegmentTrust, Selected, SlambOn, SlambStep},
};
use crate::step::{CommTime, FlatOptimizer, StepContext, allreduce_mean};
use crate::{Flat, FlatMut, MomentConfig, OptimError, ParamLayout, Segment, Stage, WithMoments};

/// SLAMB's mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskKind {
    /// A counter-based hash of (seed, t, j) below k (default).
    #[default]
    Hash,
    /// A fixed permutation cut into 1/k chunks, chunk `t mod 1/k` (authors' v1).
    Cyclic,
}

/// Whose SLAMB: the paper's Algorithm 1 or the authors' code, which
/// differ in where the trust ratios are clipped, how 1-D parameters are
/// treated and on which steps the model is averaged (ALGORITHMS.md
/// "The authors' `Slamb`").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlambCompat {
    /// The paper: φ_max and φ_min each clipped to `[phi_min, phi_max]`
    /// before the blend, every segment alike; the model averaged after
    /// steps H, 2H, … and after the last.
    #[default]
    Paper,
    /// The authors' `Slamb` (hangxu0304/SLAMB, replayed in
    /// `tests/slamb_authors_replay.rs`): the blend clipped, not the ratios;
    /// 1-D parameters always synchronised with LAMB's plain, unclipped
    /// ratio; the model averaged after steps 1, H + 1, 2H + 1, ….
    Authors,
}

/// `slamb`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlambConfig {
    /// β1, β2, ε, its placement and the weight decay λ.
    #[serde(flatten)]
    pub moments: MomentConfig,
    /// Bias correction (on by default for SLAMB).
    pub bias_correction: bool,
    /// Fraction of the elements synchronised per step.
    pub k: f64,
    /// Decay of the per-element freshness c.
    pub beta_3: f64,
    /// Average the parameters every `sync_every` steps (H).
    pub sync_every: u64,
    /// Lower clip `a` of the trust ratios.
    pub phi_min: f64,
    /// Upper clip `b` of the trust ratios.
    pub phi_max: f64,
    /// Which mask.
    pub mask: MaskKind,
    /// The mask's seed (the same on every rank).
    pub mask_seed: u64,
    /// Segments with fewer elements are synchronised every step.
    pub always_sync_below: usize,
    /// The precision the synchronised momentum values travel in (`f16`
    /// halves the sparse phase's bytes).
    pub values: SparseValues,
    /// The paper's rules or the authors' code's.
    pub compat: SlambCompat,
    /// Refuses keys no field claims (must stay last).
    #[serde(flatten, skip_serializing)]
    pub no_other_fields: NoOtherFields,
}

impl Default for SlambConfig {
    fn default() -> Self {
        Self {
            moments: MomentConfig::default(),
            bias_correction: true,
            k: 0.1,
            beta_3: 0.93,
            sync_every: 100,
            phi_min: 0.01,
            phi_max: 0.4,
            mask: MaskKind::Hash,
            mask_seed: 0,
            always_sync_below: 9000,
            values: SparseValues::F32,
            compat: SlambCompat::Paper,
            no_other_fields: NoOtherFields,
        }
    }
}

impl SlambConfig {
    pub(crate) fn validate(&self, name: &str) -> Result<(), OptimError> {
        self.moments.validate(name)?;
        check_has_compression_stage(format!("{name}.eps_mode"), self.moments.eps_mode)?;
        if !(self.k > 0.0 && self.k <= 1.0) {
            return Err(invalid(
                format!("{name}.k"),
                self.k.to_string(),
                "needs 0 < k <= 1",
            ));
        }
        check_unit(format!("{name}.beta_3"), self.beta_3)?;
        if self.sync_every == 0 {
            return Err(invalid(
                format!("{name}.sync_every"),
                "0".into(),
                "needs H >= 1",
            ));
        }
        check_clip(
            format!("{name}.phi_min"),
            "phi_max",
            (self.phi_min, self.phi_max),
            "needs 0 < phi_min <= phi_max < inf",
        )
    }

    /// Whether the model is averaged after step `t`.
    fn syncs_model_at(&self, t: u64) -> bool {
        match self.compat {
            SlambCompat::Paper => t.is_multiple_of(self.sync_every),
            SlambCompat::Authors => t % self.sync_every == 1 % self.sync_every,
        }
    }

    /// Whether a segment is synchronised at every step.
    fn always_syncs(&self, segment: &Segment) -> bool {
        segment.len < self.always_sync_below
            || (self.compat == SlambCompat::Authors && segment.shape.len() == 1)
    }

    /// The mask over a buffer of `len` elements.
    pub(crate) fn mask(&self, len: usize) -> Mask {
        match self.mask {
            MaskKind::Hash => Mask::Hash {
                seed: self.mask_seed,
                k: self.k,
            },
            MaskKind::Cyclic => Mask::Cyclic {
                seed: self.mask_seed,
                k: self.k,
                len,
            },
        }
    }
}

crate::config_check::flattens!(SlambConfig {
    moments: MomentConfig => WithMoments, moments_mut;
});

/// SLAMB's state: local m and v, the per-element freshness c, and the
/// per-step selection flags (scratch).
pub struct Slamb {
    config: SlambConfig,
    m: Flat,
    v: Flat,
    /// Freshness: 1 where synchronised this step, decaying by β3 otherwise.
    /// Starts at 1: every rank starts from the same parameters.
    freshness: Flat,
    selected: Vec<u8>,
    sparse: SparseAllreduce,
    world_size: usize,
    /// The device kernels' chunk table (device runs).
    chunks: Option<DeviceChunks>,
    /// The always-synchronised ranges (`sparse.always()`) as selection
    /// bits on the device.
    device_always: Option<Handle>,
}

impl Slamb {
    /// Zeroed moments for `layout`, on `comm`'s world.
    pub fn new(
        config: SlambConfig,
        layout: &ParamLayout,
        comm: &dyn terse_comm::Communicator,
    ) -> Self {
        let d = layout.len();
        let always: Vec<Range<usize>> = layout
            .segments()
            .iter()
            .filter(|s| config.always_syncs(s))
            .map(|s| s.range())
            .collect();
        Self {
            sparse: SparseAllreduce::with_precision(config.mask(d), always, config.values),
            chunks: None,
            device_always: None,
            m: Flat::zeros(d),
            v: Flat::zeros(d),
            freshness: Flat::from_vec(vec![1.0; d]),
            // Resident now, not in the compression stage's first step.
            selected: filled(d, 0),
            world_size: comm.world_size(),
            config,
        }
    }
}

/// A segment's trust ratios: the selected elements' (φ_max) and the
/// others' (φ_min); a ratio with a zero norm is 1.
/// - paper: each clipped to `[phi_min, phi_max]`; a segment with only one
///   kind uses that kind's for both;
/// - authors: unclipped, their per-element blend clipped instead; a 1-D
///   segment (always selected) takes LAMB's plain ratio, unclipped.
fn trust_ratios(n: &Norms, segment: &Segment, c: &SlambConfig) -> SegmentTrust {
    let trust = |(phi_max, phi_min): (f64, f64), (lo, hi): (f64, f64)| SegmentTrust {
        phi_max: phi_max as f32,
        phi_min: phi_min as f32,
        bounds: (lo as f32, hi as f32),
    };
    // Bounds no blend of non-negative ratios reaches: no clipping.
    let unbounded = (0.0, f64::from(f32::MAX));
    match c.compat {
        SlambCompat::Paper => {
            let ratio =
                |x: f64, u: f64| trust_coefficient(x.sqrt(), u.sqrt(), c.phi_min, c.phi_max);
            let phi_sel = ratio(n.x_sel, n.u_sel);
            let phi_rest = ratio(n.x_rest, n.u_rest);
            let phi = match (n.selected, n.rest) {
                (_, 0) => (phi_sel, phi_sel),
                (0, _) => (phi_rest, phi_rest),
                _ => (phi_sel, phi_rest),
            };
            trust(phi, unbounded)
        }
        SlambCompat::Authors => {
            let ratio = |x: f64, u: f64| trust_coefficient(x.sqrt(), u.sqrt(), 0.0, f64::INFINITY);
            if segment.shape.len() == 1 {
                let phi = ratio(n.x_sel + n.x_rest, n.u_sel + n.u_rest);
                trust((phi, phi), unbounded)
            } else {
                let phi = (ratio(n.x_sel, n.u_sel), ratio(n.x_rest, n.u_rest));
                trust(phi, (c.phi_min, c.phi_max))
            }
        }
    }
}

impl FlatOptimizer for Slamb {
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let Slamb {
            config: c,
            m,
            v,
            freshness,
            selected,
            sparse,
            world_size,
            chunks,
            device_always,
        } = self;
        let client = x.device().map(|x| x.client().clone());
        let on = match (x.device(), &client) {
            (Some(dx), Some(client)) => SlambOn::Device {
                client,
                chunks: chunk_table(chunks, dx, ctx.layout, c.moments.weight_decay),
            },
            _ => SlambOn::Host,
        };
        let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
        pass::slamb::moments(&on, &moments, (m, v), g);

        // The step's selection, and the selected momentum averaged.
        let start = Instant::now();
        let on_device = match &on {
            SlambOn::Host => {
                let selection = sparse.allreduce_mean(ctx.comm, ctx.t, m.host_mut())?;
                selected.fill(0);
                for j in selection.indices() {
                    selected[j] = 1;
                }
                None
            }
            SlambOn::Device { client, .. } => {
                let words = device_always.get_or_insert_with(|| {
                    let bits = device::always_bitmap(m.len(), sparse.always());
                    client.create_from_slice(u32::as_bytes(if bits.is_empty() {
                        &[0]
                    } else {
                        &bits
                    }))
                });
                Some(select_on_device(sparse, ctx, client, words, m)?)
            }
        };
        let mut comm_time = start.elapsed();
        let selection = match &on_device {
            None => Selected::Host(selected),
            Some(selection) => Selected::Device(&selection.words),
        };
        pass::slamb::freshness(&on, freshness, &selection, c.beta_3 as f32);

        let step = SlambStep {
            layout: ctx.layout,
            direction: Direction {
                moments: &moments,
                eps_mode: c.moments.eps_mode,
                weight_decay: c.moments.weight_decay as f32,
            },
        };
        let one_dimensional: Vec<bool> = ctx
            .layout
            .segments()
            .iter()
            .map(|s| s.shape.len() == 1)
            .collect();
        let device_rule = SlambTrust {
            authors: c.compat == SlambCompat::Authors,
            phi_min: c.phi_min as f32,
            phi_max: c.phi_max as f32,
            one_dimensional: &one_dimensional,
        };
        let host_ratios = |n: &Norms, segment: &Segment| trust_ratios(n, segment, c);
        let phi = step.trust(&on, x, (m, v), &selection, host_ratios, &device_rule);
        let stale_lr = ctx.lr / (*world_size as f64).sqrt();
        let rates = (ctx.lr as f32, stale_lr as f32);
        step.apply(&on, x, (m, v, freshness), &phi, rates);
        if c.syncs_model_at(ctx.t) {
            // The model sync: the parameters averaged.
            comm_time += allreduce_mean(ctx.comm, x)?;
        }
        Ok(comm_time)
    }

    fn finish(&mut self, ctx: &StepContext, x: &mut FlatMut) -> CommTime {
        if self.config.syncs_model_at(ctx.t) {
            return Ok(Duration::ZERO);
        }
        allreduce_mean(ctx.comm, x)
    }

    fn state(&mut self) -> Vec<(&'static str, &mut Flat)> {
        vec![
            ("m", &mut self.m),
            ("v", &mut self.v),
            ("freshness", &mut self.freshness),
        ]
    }

    fn stage(&self, _t: u64) -> Stage {
        Stage::Sparse
    }
}

/// SLAMB's momentum on the device for the sparse allreduce: selected by
/// the mask kernels (hash or cyclic), gathered and scattered by kernels; only the selected
/// values reach the host, and on CUDA with NCCL not even those.
struct DeviceSparse<'a> {
    client: &'a Client,
    m: &'a Flat,
    /// The always-synchronised ranges as selection bits.
    always_words: &'a Handle,
    selection: Option<DeviceSelection>,
}

impl DeviceSparse<'_> {
    fn selection(&self) -> &DeviceSelection {
        self.selection
            .as_ref()
            .expect("the sparse allreduce selects first")
    }

    /// The `count` selected values gathered into a new device buffer.
    fn gathered(&self, count: usize) -> Handle {
        let on_device = self.client.empty(count.max(1) * size_of::<f32>());
        self.selection()
            .gather(self.client, self.m.handle(), &on_device);
        on_device
    }

    /// The end of a GPU mean: the mean scattered to the selected elements;
    /// `None` (not CUDA memory) is false, the mean not taken; an error
    /// writes nothing (the exchange's caller holds it).
    fn scatter_mean(&self, mean: Option<Result<Handle, ()>>) -> bool {
        match mean {
            None => false,
            Some(Ok(mean)) => {
                self.selection()
                    .scatter(self.client, &mean, self.m.handle());
                true
            }
            Some(Err(())) => true,
        }
    }
}

impl SparseBuffer for DeviceSparse<'_> {
    /// `always` is on the device already, as `always_words`.
    fn select(&mut self, mask: &Mask, t: u64, _always: &[Range<usize>]) -> usize {
        let (client, len) = (self.client, self.m.len());
        let selection = device::select(client, mask, t, len, self.always_words);
        let count = selection.count;
        self.selection = Some(selection);
        count
    }

    fn gather(&mut self, values: &mut [f32]) {
        let on_device = self.gathered(values.len());
        values.copy_from_slice(&read_f32(self.client, &on_device, values.len()));
    }

    fn scatter(&mut self, values: &[f32]) {
        let on_device = upload_f32(self.client, values);
        self.selection()
            .scatter(self.client, &on_device, self.m.handle());
    }

    fn mean_on_gpu(
        &mut self,
        count: usize,
        scale: f32,
        sum: &mut dyn FnMut(u64, u64) -> bool,
    ) -> bool {
        let client = self.client;
        let gathered = self.gathered(count);
        let summed = summed_on_gpu(client, &gathered, count, scale, |from, into| {
            sum(from, into).then_some(()).ok_or(())
        });
        self.scatter_mean(summed)
    }

    fn mean_f16_on_gpu(
        &mut self,
        slices: HalfSlices,
        scale: f32,
        exchange: &mut dyn FnMut(HalfExchange, u64, u64) -> bool,
    ) -> bool {
        let client = self.client;
        let gathered = self.gathered(slices.count);
        let mean = device::mean_f16(client, &gathered, slices, scale, |which, send, recv| {
            with_cuda_addresses(client, &[send, recv], |at| {
                exchange(which, at[0], at[1]).then_some(()).ok_or(())
            })
        });
        self.scatter_mean(mean)
    }
}

/// The step's selection on the device and, over several ranks, the
/// selected momentum averaged there by `sparse`.
fn select_on_device(
    sparse: &mut SparseAllreduce,
    ctx: &StepContext,
    client: &Client,
    always_words: &Handle,
    m: &Flat,
) -> Result<DeviceSelection, OptimError> {
    let mut buffer = DeviceSparse {
        client,
        m,
        always_words,
        selection: None,
    };
    sparse.allreduce_mean_on(ctx.comm, ctx.t, &mut buffer)?;
    Ok(buffer
        .selection
        .expect("the sparse allreduce selects first"))
}
