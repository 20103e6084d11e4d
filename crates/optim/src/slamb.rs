//! SLAMB (ALGORITHMS.md "SLAMB"; Xu et al., Algorithm 1 with Appendix E):
//! every step only a masked subset of the momentum is averaged (the mask is a
//! function of the seed and the step, so no indices travel); elements not
//! synchronised recently are stepped with a smaller rate and their own trust
//! ratio, and the parameters are averaged every H steps.

use std::ops::Range;
use std::time::{Duration, Instant};

use cubecl::prelude::*;
use cubecl::server::Handle;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use terse_comm::{ReduceOp, SparseAllreduce, SparseValues};
use terse_kernels::device::slamb::SplitNorms;
use terse_kernels::mask::{Mask, Selection};
use terse_kernels::resident::filled;

use crate::config_check::{NoOtherFields, check_clip, check_unit, invalid};
use crate::device_flat::{chunk_table, read_f32, upload_f32};
use crate::eps_mode::check_has_compression_stage;
use crate::lamb::trust_coefficient;
use crate::moments::{Moments, with_eps_mode};
use crate::parallel::{CHUNK, split_segments, split_segments_mut, with_avx};
use crate::step::CommTime;
use crate::step::{FlatOptimizer, StepContext, allreduce_mean};
use crate::{
    DeviceFlat, EpsMode, Flat, FlatMut, MomentConfig, OptimError, ParamLayout, Stage, WithMoments,
};
use terse_kernels::device::optim::DeviceChunks;

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

impl WithMoments for SlambConfig {
    fn moments_mut(&mut self) -> &mut MomentConfig {
        &mut self.moments
    }
}

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
    /// The always-synchronised ranges as selection bits on the device.
    device_always: Option<Handle>,
    /// The ranges themselves (for the device's bitmap).
    always: Vec<Range<usize>>,
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
            .filter(|s| s.len < config.always_sync_below)
            .map(|s| s.range())
            .collect();
        Self {
            sparse: SparseAllreduce::with_precision(config.mask(d), always.clone(), config.values),
            chunks: None,
            device_always: None,
            always,
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

/// Per-chunk sums of squares split by selection: (x·M, u·M, x·¬M, u·¬M),
/// and the number of unselected elements.
#[derive(Debug, Clone, Copy, Default)]
struct Norms {
    x_sel: f64,
    u_sel: f64,
    x_rest: f64,
    u_rest: f64,
    selected: usize,
    rest: usize,
}

impl From<&SplitNorms> for Norms {
    fn from(n: &SplitNorms) -> Norms {
        Norms {
            x_sel: n.x_selected,
            u_sel: n.u_selected,
            x_rest: n.x_rest,
            u_rest: n.u_rest,
            selected: n.selected,
            rest: n.rest,
        }
    }
}

impl Norms {
    /// The segment's trust ratios `(φ_max, φ_min)`: the selected elements'
    /// and the others', each clipped to `[phi_min, phi_max]`; a segment
    /// with only one kind uses that kind's for both.
    fn ratios(&self, c: &SlambConfig) -> (f64, f64) {
        let ratio = |x: f64, u: f64| trust_coefficient(x.sqrt(), u.sqrt(), c.phi_min, c.phi_max);
        let phi_sel = ratio(self.x_sel, self.u_sel);
        let phi_rest = ratio(self.x_rest, self.u_rest);
        match (self.selected, self.rest) {
            (_, 0) => (phi_sel, phi_sel),
            (0, _) => (phi_rest, phi_rest),
            _ => (phi_sel, phi_rest),
        }
    }

    fn add(self, o: Norms) -> Norms {
        Norms {
            x_sel: self.x_sel + o.x_sel,
            u_sel: self.u_sel + o.u_sel,
            x_rest: self.x_rest + o.x_rest,
            u_rest: self.u_rest + o.u_rest,
            selected: self.selected + o.selected,
            rest: self.rest + o.rest,
        }
    }
}

impl FlatOptimizer for Slamb {
    /// The selection and the sparse allreduce differ between host and
    /// device (a host selection list against a device bitmap), so the two
    /// steps are written apart until the sparse allreduce runs on device
    /// buffers itself.
    fn step(&mut self, ctx: &StepContext, x: &mut FlatMut, g: &mut FlatMut) -> CommTime {
        let mut comm_time = match (&mut *x, g) {
            (FlatMut::Host(x), FlatMut::Host(g)) => self.host_step(ctx, x, g)?,
            (FlatMut::Device(x), FlatMut::Device(g)) => self.device_step(ctx, x, g)?,
            _ => unreachable!("the driver passes both buffers from one place"),
        };
        if ctx.t.is_multiple_of(self.config.sync_every) {
            // The model sync: the parameters averaged.
            comm_time += allreduce_mean(ctx.comm, x)?;
        }
        Ok(comm_time)
    }

    fn finish(&mut self, ctx: &StepContext, x: &mut FlatMut) -> CommTime {
        if ctx.t.is_multiple_of(self.config.sync_every) {
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

impl Slamb {
    /// The step on host buffers, before the model sync.
    fn host_step(&mut self, ctx: &StepContext, x: &mut [f32], g: &mut [f32]) -> CommTime {
        let c = self.config.clone();
        let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
        self.m
            .host_mut()
            .par_chunks_mut(CHUNK)
            .zip(self.v.host_mut().par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|((m, v), g)| {
                with_avx(|| {
                    for ((m, v), &g) in m.iter_mut().zip(v).zip(g) {
                        moments.accumulate(m, v, g);
                    }
                })
            });
        let start = Instant::now();
        let selection = self
            .sparse
            .allreduce_mean(ctx.comm, ctx.t, self.m.host_mut())?;
        let comm_time = start.elapsed();
        self.selected.fill(0);
        for j in selection.indices() {
            self.selected[j] = 1;
        }
        let beta_3 = c.beta_3 as f32;
        self.freshness
            .host_mut()
            .par_chunks_mut(CHUNK)
            .zip(self.selected.par_chunks(CHUNK))
            .for_each(|(f, s)| {
                for (f, &s) in f.iter_mut().zip(s) {
                    *f = if s == 1 { 1.0 } else { beta_3 * *f };
                }
            });

        let lr = ctx.lr;
        let stale_lr = lr / (self.world_size as f64).sqrt();
        let weight_decay = c.moments.weight_decay as f32;
        let layout = ctx.layout;
        let xs = split_segments_mut(layout, x);
        let ms = split_segments(layout, self.m.host());
        let vs = split_segments(layout, self.v.host());
        let fs = split_segments(layout, self.freshness.host());
        let ss = split_segments(layout, &self.selected);
        with_eps_mode!(c.moments.eps_mode, INSIDE => {
            layout.segments().par_iter().zip(xs).zip(ms).zip(vs).zip(fs).zip(ss).for_each(
                |(((((segment, x), m), v), f), s)| {
                    let wd = if segment.decay { weight_decay } else { 0.0 };
                    let norms = x
                        .par_chunks(CHUNK)
                        .zip(m.par_chunks(CHUNK))
                        .zip(v.par_chunks(CHUNK))
                        .zip(s.par_chunks(CHUNK))
                        .map(|(((x, m), v), s)| {
                            let mut n = Norms::default();
                            for (((&x, &m), &v), &s) in x.iter().zip(m).zip(v).zip(s) {
                                let u = f64::from(moments.direction::<INSIDE>(m, v, x, wd));
                                let x = f64::from(x);
                                if s == 1 {
                                    n.x_sel += x * x;
                                    n.u_sel += u * u;
                                    n.selected += 1;
                                } else {
                                    n.x_rest += x * x;
                                    n.u_rest += u * u;
                                    n.rest += 1;
                                }
                            }
                            n
                        })
                        .collect::<Vec<_>>()
                        .into_iter()
                        .fold(Norms::default(), Norms::add);
                    let (phi_max, phi_min) = norms.ratios(&c);
                    let (phi_max, phi_min) = (phi_max as f32, phi_min as f32);
                    let (lr, stale_lr) = (lr as f32, stale_lr as f32);
                    x.par_chunks_mut(CHUNK)
                        .zip(m.par_chunks(CHUNK))
                        .zip(v.par_chunks(CHUNK))
                        .zip(f.par_chunks(CHUNK))
                        .for_each(|(((x, m), v), f)| {
                            for (((x, &m), &v), &f) in x.iter_mut().zip(m).zip(v).zip(f) {
                                let u = moments.direction::<INSIDE>(m, v, *x, wd);
                                let phi = phi_max * f + phi_min * (1.0 - f);
                                let eta = lr * f + stale_lr * (1.0 - f);
                                *x -= eta * phi * u;
                            }
                        });
                },
            )
        });
        Ok(comm_time)
    }

    /// The step on device buffers, before the model sync.
    fn device_step(
        &mut self,
        ctx: &StepContext,
        x: &mut DeviceFlat,
        g: &mut DeviceFlat,
    ) -> CommTime {
        use terse_kernels::device::{self as kernels, slamb};
        let c = self.config.clone();
        let len = ctx.layout.len();
        let chunks = chunk_table(&mut self.chunks, x, ctx.layout, c.moments.weight_decay);
        let client = x.client().clone();
        let always = self.device_always.get_or_insert_with(|| {
            let words = kernels::always_bitmap(len, &self.always);
            client.create_from_slice(u32::as_bytes(if words.is_empty() { &[0] } else { &words }))
        });
        let moments = Moments::new(&c.moments, c.bias_correction, ctx.t);
        let coefficients = moments.coefficients();
        let [m, v, f] = [&self.m, &self.v, &self.freshness].map(Flat::handle);
        slamb::moments(&client, chunks, m, v, g.handle(), &coefficients);

        // The step's selection, and the selected momentum averaged: only the
        // selected values reach the host.
        let start = Instant::now();
        let mask = c.mask(len);
        let selection = match mask {
            Mask::Hash { .. } => kernels::select(&client, &mask, ctx.t, len, always),
            // A permutation: selected on the host, moved on the device.
            Mask::Cyclic { .. } => kernels::select_from_host(
                &client,
                &Selection::new(&mask, ctx.t, len, &self.always),
                len,
            ),
        };
        if self.world_size > 1 {
            let values = client.empty(selection.count.max(1) * size_of::<f32>());
            selection.gather(&client, m, &values);
            let mut host = read_f32(&client, &values, selection.count);
            match c.values {
                SparseValues::F32 => ctx.comm.allreduce_f32(&mut host, ReduceOp::Mean)?,
                SparseValues::F16 => terse_comm::allreduce_mean_f16(ctx.comm, &mut host)?,
            }
            let values = upload_f32(&client, &host);
            selection.scatter(&client, &values, m);
        }
        let comm_time = start.elapsed();
        slamb::freshness(&client, f, &selection.words, len, c.beta_3 as f32);

        let inside = c.moments.eps_mode == EpsMode::Inside;
        let norms = slamb::split_norms(
            &client,
            chunks,
            x.handle(),
            m,
            v,
            &selection.words,
            &coefficients,
            inside,
        );
        let phi: Vec<f32> = norms
            .iter()
            .flat_map(|n| {
                let (phi_max, phi_min) = Norms::from(n).ratios(&c);
                [phi_max as f32, phi_min as f32]
            })
            .collect();
        let stale_lr = ctx.lr / (self.world_size as f64).sqrt();
        slamb::apply(
            &client,
            chunks,
            x.handle(),
            m,
            v,
            f,
            &coefficients,
            &phi,
            ctx.lr as f32,
            stale_lr as f32,
            inside,
        );
        Ok(comm_time)
    }
}
