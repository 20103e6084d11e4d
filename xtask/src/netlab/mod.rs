//! `cargo xtask netlab`: a rate-limited network of N hosts on one machine.
//!
//! The papers' speed-ups come from slow links between machines. netlab
//! recreates them: Linux network namespaces as hosts, veth pairs to a bridge
//! as their cables, `tc` token buckets as the links' rates, and MPI ranks
//! started one per namespace so their traffic crosses the shaped links.
//! Needs root and iproute2.

pub mod lab;
pub mod launch;
pub mod rate;
#[cfg(test)]
mod shaping_tests;

use std::path::PathBuf;

use anyhow::{Result, bail};

use lab::Shape;
use rate::Rate;

/// Arguments of `cargo xtask netlab`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

/// What to do with the lab.
#[derive(Debug, Clone, PartialEq, clap::Subcommand)]
pub enum Action {
    /// Create N host namespaces on a bridge, every link shaped to --rate
    /// (an earlier lab is removed first)
    Up {
        /// Number of hosts (one MPI rank each)
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Rate of each direction of each link: 50mbit, 1gbit, 10gbit, …
        #[arg(long, default_value = "1gbit")]
        rate: Rate,
        /// Extra one-way delay on each host's link, e.g. 0.1ms (needs the
        /// kernel's sch_netem module)
        #[arg(long, value_parser = parse_delay_ms, value_name = "DELAY")]
        delay: Option<f64>,
    },
    /// Set every link of the lab that is up to a new rate
    Shape {
        /// The lab's hosts (as given to `up`)
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Rate of each direction of each link
        #[arg(long)]
        rate: Rate,
    },
    /// Remove every netlab namespace, veth pair, bridge and qdisc
    Down,
    /// Show the lab's hosts, addresses and link shapes
    Status,
    /// Run an MPI program with one rank per lab host
    Mpirun {
        /// Ranks (at most the lab's hosts)
        #[arg(long, short = 'n', default_value_t = 4)]
        np: usize,
        /// The program and its arguments
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// OpenMPI's launch agent (used by `netlab mpirun`, not by hand)
    #[command(hide = true)]
    Agent {
        /// The lab address to start the command on
        host: String,
        /// The command line OpenMPI passes
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

/// `0.1ms`, `2ms` or `100us` as milliseconds.
fn parse_delay_ms(text: &str) -> Result<f64> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-3)
    } else {
        bail!("delay {text:?}: write it in ms or us, e.g. 0.1ms");
    };
    match number.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v * scale),
        _ => bail!("delay {text:?}: {number:?} is not a non-negative number"),
    }
}

/// Runs `cargo xtask netlab …`.
pub fn run(args: &Args) -> Result<()> {
    match &args.action {
        Action::Up { hosts, rate, delay } => {
            lab::up(
                *hosts,
                Shape {
                    rate: *rate,
                    delay_ms: *delay,
                },
            )?;
            print!("{}", lab::describe()?);
            Ok(())
        }
        Action::Shape { hosts, rate } => {
            let up = lab::hosts_up()?;
            if up != *hosts {
                bail!("--hosts {hosts}, but the lab that is up has {up}");
            }
            lab::reshape(*hosts, Shape::at(*rate))
        }
        Action::Down => {
            let removed = lab::down()?;
            if removed.is_empty() {
                println!("netlab: nothing to remove");
            } else {
                println!("netlab: removed {}", removed.join(", "));
            }
            Ok(())
        }
        Action::Status => {
            print!("{}", lab::describe()?);
            Ok(())
        }
        Action::Mpirun { np, command } => {
            let (program, rest) = command.split_first().expect("clap requires a command");
            let status = launch::run(*np, &PathBuf::from(program), rest)?;
            if !status.success() {
                bail!("{program} on {np} lab host(s) failed ({status})");
            }
            Ok(())
        }
        Action::Agent { host, command } => launch::agent(host, command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_parse_in_milliseconds() {
        assert_eq!(parse_delay_ms("0.1ms").unwrap(), 0.1);
        assert_eq!(parse_delay_ms("250us").unwrap(), 0.25);
        assert!(parse_delay_ms("1s").is_err());
        assert!(parse_delay_ms("-1ms").is_err());
    }
}
