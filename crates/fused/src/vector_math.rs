//! exp, erf and the exact GELU in a form LLVM vectorises: straight-line
//! f32 arithmetic, clamps instead of branches, rounding by the 1.5·2²³
//! trick, the power of two built from its bits. The libm functions burn
//! calls per element (`expf`, `erff`) are scalar calls that no loop around
//! them can vectorise.

/// `eˣ` to ~2 ulp (Cephes' `expf`: range reduction by ln 2 in two parts, a
/// degree-6 polynomial); 0 below -87.3, saturating at `e^88.7`.
#[inline(always)]
// Cephes' constants as published (some round to the same f32).
#[allow(clippy::excessive_precision)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let below = x < -87.3;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    if below {
        0.0
    } else {
        y * pow2_of_rounded(shifted)
    }
}

/// 1.5·2²³: adding and subtracting it rounds an f32 to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// 2ⁿ for `shifted = v + ROUND`, n = `shifted − ROUND` (|n| ≤ 127), from
/// the integer n held in the low mantissa bits of `shifted`: integer
/// operations only. `n as i32` is a saturating conversion, which kept every
/// loop calling [`exp`] scalar (5× slower).
#[inline(always)]
fn pow2_of_rounded(shifted: f32) -> f32 {
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// The error function to ≤ 1e-7 absolute: a rational minimax fit on
/// [-4, 4] (Eigen's and XLA's f32 `erf`; beyond ±4, erf is ±1 to within
/// 1.6e-8), evaluated in f64: in f32 arithmetic the fit's own rounding
/// reaches 3.2e-7 near |x| = 3.2, in f64 the total stays below 1e-7.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = f64::from(x.clamp(-4.0, 4.0));
    let x2 = x * x;
    let mut p = -2.726_142_258_013_06e-10_f64;
    p = p * x2 + 2.770_681_424_959_02e-8;
    p = p * x2 - 2.101_024_020_825_08e-6;
    p = p * x2 - 5.692_506_394_623_46e-5;
    p = p * x2 - 7.349_906_303_268_55e-4;
    p = p * x2 - 2.954_599_808_540_25e-3;
    p = p * x2 - 1.609_603_332_624_15e-2;
    let mut q = -1.456_607_184_649_96e-5_f64;
    q = q * x2 - 2.133_740_552_789_05e-4;
    q = q * x2 - 1.682_826_974_382_03e-3;
    q = q * x2 - 7.373_329_167_204_68e-3;
    q = q * x2 - 1.426_473_905_141_89e-2;
    (x * p / q) as f32
}

/// Exact (erf) GELU: `x·Φ(x) = ½x(1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `d gelu / dx = Φ(x) + x·φ(x)`, φ the standard normal density.
#[inline(always)]
pub fn gelu_derivative(x: f32) -> f32 {
    // 1/√(2π)
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let cdf = 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    cdf + x * INV_SQRT_2PI * exp(-0.5 * x * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 (Abramowitz–Stegun 7.1.26 is too coarse; this is the
    /// series/continued-fraction pair, exact to ~1e-15 on the range).
    fn erf64(x: f64) -> f64 {
        if x.abs() < 3.0 {
            // Maclaurin series: 2/√π Σ (-1)ⁿ x^(2n+1) / (n! (2n+1)).
            let mut term = x;
            let mut sum = x;
            for n in 1..200 {
                term *= -x * x / n as f64;
                let add = term / (2 * n + 1) as f64;
                sum += add;
                if add.abs() < 1e-17 {
                    break;
                }
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc continued fraction (Lentz), erf = 1 − erfc.
            let z = x.abs();
            let mut f = z;
            let mut c = z;
            let mut d = 0.0;
            for n in 1..200 {
                let a = n as f64 / 2.0;
                d = 1.0 / (z + a * d);
                c = z + a / c;
                f *= c * d;
            }
            let erfc = (-z * z).exp() / (f * std::f64::consts::PI.sqrt());
            (1.0 - erfc).copysign(x)
        }
    }

    #[test]
    fn erf_within_1e_7_absolute() {
        let mut worst = 0.0f64;
        for i in -70_000..=70_000 {
            let x = i as f32 * 1e-4;
            worst = worst.max((erf(x) as f64 - erf64(x as f64)).abs());
        }
        assert!(worst <= 1e-7, "worst |erf - erf64| = {worst:e}");
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(-9.0), -erf(9.0));
    }

    #[test]
    fn exp_within_3e_7_relative() {
        let mut worst = 0.0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).exp();
            worst = worst.max(((exp(x) as f64 - want) / want).abs());
        }
        assert!(worst <= 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
    }

    #[test]
    fn gelu_derivative_matches_a_central_difference() {
        for i in -80..=80 {
            let x = i as f64 * 0.1;
            let g = |x: f64| 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let h = 1e-5;
            let want = (g(x + h) - g(x - h)) / (2.0 * h);
            let got = gelu_derivative(x as f32) as f64;
            assert!((got - want).abs() < 2e-6, "x={x} got {got} want {want}");
            assert!((gelu(x as f32) as f64 - g(x)).abs() < 1e-6 * (1.0 + x.abs()));
        }
    }

    /// The widest vectors change the speed, never a bit: GELU, its
    /// derivative, exp and erf over [-12, 12] (and the clamps' edges) give
    /// the same bits in every tier the CPU has as in portable code.
    #[test]
    fn every_tier_gives_the_same_bits() {
        use terse_compress::simd::{SimdTier, with_tier};
        let mut xs: Vec<f32> = (-(1 << 17)..(1 << 17))
            .map(|i| i as f32 * (12.0 / (1 << 17) as f32))
            .collect();
        xs.extend([
            -87.3,
            -87.4,
            88.7,
            88.8,
            -4.0,
            4.0,
            0.0,
            -0.0,
            f32::MIN,
            f32::MAX,
        ]);
        let eval = |tier| {
            with_tier(tier, || {
                xs.iter()
                    .map(|&x| {
                        let bits = [gelu(x), gelu_derivative(x), exp(x), erf(x)];
                        bits.map(f32::to_bits)
                    })
                    .collect::<Vec<_>>()
            })
        };
        let portable = eval(SimdTier::Portable);
        let tiers = SimdTier::available();
        assert!(tiers.len() > 1 || !cfg!(target_arch = "x86_64"));
        for tier in tiers {
            assert_eq!(eval(tier), portable, "{tier:?}");
        }
    }

    /// `exp` builds 2ⁿ from the bits of the rounded sum instead of a
    /// float-to-int conversion (which kept loops scalar): the same power
    /// of two as through `n as i32` for every n `exp` can meet, so every
    /// result is the same bits as before.
    #[test]
    fn the_power_of_two_is_the_one_a_conversion_gives() {
        let lowest = (-87.3f32 * std::f32::consts::LOG2_E).round() as i32 - 1;
        let highest = (88.7f32 * std::f32::consts::LOG2_E).round() as i32 + 1;
        for n in lowest..=highest {
            let shifted = n as f32 + ROUND;
            let n = shifted - ROUND;
            let by_conversion = f32::from_bits(((n as i32 + 127) as u32) << 23);
            assert_eq!(
                pow2_of_rounded(shifted).to_bits(),
                by_conversion.to_bits(),
                "n = {n}"
            );
        }
    }
}
