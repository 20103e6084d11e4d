//! Link rates as `tc` spells them (`50mbit`, `1gbit`, `10gbit`).

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

/// The slowest rate a link may have: 1 kbit/s (below it `tc` rounds whole
/// kbit values down to a rate of zero).
const MIN_BPS: f64 = 1e3;
/// The fastest: 400 Gbit/s, beyond any link a veth pair can carry here.
const MAX_BPS: f64 = 400e9;

/// A link rate in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate {
    bits_per_s: f64,
}

impl Rate {
    /// A rate of `bits_per_s`.
    pub fn bits_per_s(bits_per_s: f64) -> Self {
        Self { bits_per_s }
    }

    /// Bits per second.
    pub fn bps(self) -> f64 {
        self.bits_per_s
    }

    /// `tbf` arguments for this rate. The bucket holds at least 1 ms of
    /// traffic and at least 128 KiB: veth hands the qdisc GSO packets of up
    /// to 64 KiB, and a bucket smaller than a packet stalls the link. The
    /// queue holds 100 ms, enough that TCP is not starved by drops.
    pub fn token_bucket(self) -> Vec<String> {
        let burst = (self.bits_per_s / 8.0 / 1000.0).max(128.0 * 1024.0).ceil() as u64;
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.bits_per_s as u64),
            "burst".into(),
            burst.to_string(),
            "latency".into(),
            "100ms".into(),
        ]
    }
}

/// Parses each of `rates` (`tc` spelling), in order.
pub fn parse_all(rates: &[&str]) -> Result<Vec<Rate>> {
    rates.iter().map(|r| r.parse()).collect()
}

impl FromStr for Rate {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        let (number, unit) = match lower.find(|c: char| c.is_ascii_alphabetic()) {
            Some(at) => lower.split_at(at),
            None => bail!("rate {s:?} has no unit: write e.g. 50mbit, 1gbit, 10gbit"),
        };
        let scale = match unit {
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            _ => bail!("rate {s:?}: unknown unit {unit:?} (kbit, mbit or gbit)"),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| anyhow::anyhow!("rate {s:?}: {number:?} is not a number"))?;
        if !(value > 0.0 && value.is_finite()) {
            bail!("rate {s:?} must be positive");
        }
        let rate = Self::bits_per_s(value * scale);
        if !(MIN_BPS..=MAX_BPS).contains(&rate.bits_per_s) {
            bail!(
                "rate {s:?} is outside {}–{} (tc's token bucket would round it, \
                 e.g. to 0bit, or shape nothing)",
                Self::bits_per_s(MIN_BPS),
                Self::bits_per_s(MAX_BPS)
            );
        }
        Ok(rate)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        if b >= 1e9 {
            write!(f, "{}gbit", b / 1e9)
        } else if b >= 1e6 {
            write!(f, "{}mbit", b / 1e6)
        } else {
            write!(f, "{}kbit", b / 1e3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tc_units_and_prints_them_back() {
        for (text, bps) in [
            ("50mbit", 50e6),
            ("1gbit", 1e9),
            ("10Gbit", 10e9),
            ("2.5gbit", 2.5e9),
            ("800kbit", 800e3),
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.bps(), bps, "{text}");
            assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate);
        }
        for bad in [
            "1g", "fast", "0mbit", "-1gbit", "1 gbps", "nankbit", "infgbit",
        ] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
        // Bounded: the smallest and largest allowed, and one step outside each.
        assert!("1kbit".parse::<Rate>().is_ok());
        assert!("400gbit".parse::<Rate>().is_ok());
        let tiny = "0.000001kbit".parse::<Rate>().unwrap_err().to_string();
        assert!(tiny.contains("outside 1kbit–400gbit"), "{tiny}");
        assert!("401gbit".parse::<Rate>().is_err());
    }

    #[test]
    fn bucket_holds_a_millisecond_and_never_less_than_a_gso_packet() {
        let burst = |r: &str| r.parse::<Rate>().unwrap().token_bucket()[4].clone();
        assert_eq!(burst("50mbit"), "131072");
        assert_eq!(burst("10gbit"), "1250000");
        assert_eq!(
            "1gbit".parse::<Rate>().unwrap().token_bucket()[2],
            "1000000000bit"
        );
    }
}
