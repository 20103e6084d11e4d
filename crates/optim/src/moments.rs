//! Adam's moment update and direction, shared by Adam and LAMB.
//!
//! ```text
//! m = β1·m + (1-β1)·g          v = β2·v + (1-β2)·g²
//! u = m̂ / (sqrt(v̂) + ε)        (eps_mode = outside)
//! u = m̂ / sqrt(v̂ + ε)          (eps_mode = inside, or inside_compressed
//!                               in the compression stage)
//! u += wd·x                     (decay group)
//! ```
//! with `m̂ = m/(1-β1^t)`, `v̂ = v/(1-β2^t)` when bias correction is on.
//! Coefficients are f32 so the per-element loop vectorises; the reference
//! tests bound the rounding this costs against a float64 implementation.

use crate::MomentConfig;

/// The per-step constants of the moment update.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moments {
    beta_1: f32,
    beta_2: f32,
    one_minus_beta_1: f32,
    one_minus_beta_2: f32,
    inv_bias_1: f32,
    inv_bias_2: f32,
    eps: f32,
    /// Multiplies g before it enters the moments (LAMB's grad_prenorm).
    pub(crate) grad_scale: f32,
}

impl Moments {
    pub(crate) fn new(config: &MomentConfig, bias_correction: bool, t: u64) -> Self {
        let (beta_1, beta_2, eps) = (config.beta_1, config.beta_2, config.eps);
        let (inv_bias_1, inv_bias_2) = if bias_correction {
            let t = i32::try_from(t).unwrap_or(i32::MAX);
            (1.0 / (1.0 - beta_1.powi(t)), 1.0 / (1.0 - beta_2.powi(t)))
        } else {
            (1.0, 1.0)
        };
        Self {
            beta_1: beta_1 as f32,
            beta_2: beta_2 as f32,
            one_minus_beta_1: (1.0 - beta_1) as f32,
            one_minus_beta_2: (1.0 - beta_2) as f32,
            inv_bias_1: inv_bias_1 as f32,
            inv_bias_2: inv_bias_2 as f32,
            eps: eps as f32,
            grad_scale: 1.0,
        }
    }

    /// The constants of a compression-stage step `t` with v frozen at the
    /// end of step `t_w`: m̂ corrected for `t`, the frozen v̂ for `t_w`.
    pub(crate) fn frozen(config: &MomentConfig, bias_correction: bool, t: u64, t_w: u64) -> Self {
        let mut moments = Self::new(config, bias_correction, t);
        moments.inv_bias_2 = Self::new(config, bias_correction, t_w).inv_bias_2;
        moments
    }

    /// m's bias correction `1/(1−β1^t)` (1 without correction), in f64 as
    /// computed (0/1 Adam divides its re-estimated momentum by it).
    pub(crate) fn inv_bias_1(&self) -> f64 {
        f64::from(self.inv_bias_1)
    }

    /// The same constants for the device kernels.
    pub(crate) fn coefficients(&self) -> terse_kernels::device::optim::MomentCoefficients {
        terse_kernels::device::optim::MomentCoefficients {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            one_minus_beta_1: self.one_minus_beta_1,
            one_minus_beta_2: self.one_minus_beta_2,
            inv_bias_1: self.inv_bias_1,
            inv_bias_2: self.inv_bias_2,
            eps: self.eps,
            grad_scale: self.grad_scale,
        }
    }

    /// The denominator for a variance `v` (bias-corrected here).
    #[inline(always)]
    pub(crate) fn denominator<const INSIDE: bool>(&self, v: f32) -> f32 {
        let v_hat = v * self.inv_bias_2;
        if INSIDE {
            (v_hat + self.eps).sqrt()
        } else {
            v_hat.sqrt() + self.eps
        }
    }

    /// Updates `m` and `v` with gradient `g` in place.
    #[inline(always)]
    pub(crate) fn accumulate(&self, m: &mut f32, v: &mut f32, g: f32) {
        let g = g * self.grad_scale;
        *m = self.beta_1 * *m + self.one_minus_beta_1 * g;
        *v = self.beta_2 * *v + self.one_minus_beta_2 * g * g;
    }

    /// Updates the momentum `m` alone with gradient `g` (the compression
    /// stage, v frozen).
    #[inline(always)]
    pub(crate) fn momentum(&self, m: &mut f32, g: f32) {
        *m = self.beta_1 * *m + self.one_minus_beta_1 * g;
    }

    /// The update direction `u` from the (already updated) moments.
    #[inline(always)]
    pub(crate) fn direction<const INSIDE: bool>(&self, m: f32, v: f32, x: f32, wd: f32) -> f32 {
        let m_hat = m * self.inv_bias_1;
        let v_hat = v * self.inv_bias_2;
        let denom = if INSIDE {
            (v_hat + self.eps).sqrt()
        } else {
            v_hat.sqrt() + self.eps
        };
        m_hat / denom + wd * x
    }
}

/// Calls `$body` with a `const INSIDE: bool` matching `$mode`, so the loop
/// inside is compiled once per mode with no branch per element. Callers
/// resolve `inside_compressed` for their stage first (`EpsMode::in_stage`);
/// unresolved, it is the warmup's placement, outside.
macro_rules! with_eps_mode {
    ($mode:expr, $inside:ident => $body:expr) => {
        match $mode {
            $crate::EpsMode::Inside => {
                const $inside: bool = true;
                $body
            }
            $crate::EpsMode::Outside | $crate::EpsMode::InsideCompressed => {
                const $inside: bool = false;
                $body
            }
        }
    };
}
pub(crate) use with_eps_mode;
