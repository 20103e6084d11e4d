//! The shaped network: N host namespaces, each with one interface `lab0`
//! joined by a veth pair to a bridge in a switch namespace, every link
//! rate-limited in both directions by a token bucket.
//!
//! Everything netlab creates lives inside namespaces whose names start with
//! [`PREFIX`]: the veth pairs are created directly inside them and the bridge
//! and the qdiscs sit on their interfaces, so deleting those namespaces
//! removes all of it and nothing of the machine's own network is touched.
//! The host namespaces have only `lo` and `lab0` and one route, the lab's
//! subnet, so a process started in one of them cannot reach any other
//! address.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use super::rate::Rate;

/// The prefix of every namespace netlab creates (and the only ones `down`
/// removes).
pub const PREFIX: &str = "terse-netlab-";
/// The namespace that holds the bridge.
const SWITCH: &str = "terse-netlab-switch";
/// The bridge in [`SWITCH`].
const BRIDGE: &str = "br0";
/// Each host's interface.
pub const INTERFACE: &str = "lab0";
/// The lab's subnet: host i is 10.213.0.(i + 1). Private, and only ever
/// configured inside the lab's namespaces.
pub const SUBNET: &str = "10.213.0.0/24";
/// Jumbo frames, as on cluster networks: headers are then under 1% of the
/// bytes on the wire, which lets measured and analytic volumes be compared.
const MTU: &str = "9000";
/// The most hosts one /24 and the naming allow.
pub const MAX_HOSTS: usize = 64;

/// The shape of every link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Rate of each direction of each link.
    pub rate: Rate,
    /// One-way delay added on each host's outgoing link (needs sch_netem).
    pub delay_ms: Option<f64>,
}

impl Shape {
    /// Links at `rate` with no added delay.
    pub fn at(rate: Rate) -> Self {
        Self {
            rate,
            delay_ms: None,
        }
    }
}

/// Host `i`'s namespace.
pub fn host_namespace(i: usize) -> String {
    format!("{PREFIX}h{i}")
}

/// Host `i`'s address.
pub fn host_address(i: usize) -> String {
    format!("10.213.0.{}", i + 1)
}

/// The host index of a lab address, `None` for any other string.
pub fn host_of_address(address: &str) -> Option<usize> {
    let last = address.strip_prefix("10.213.0.")?;
    let i: usize = last.parse().ok()?;
    (1..=MAX_HOSTS).contains(&i).then(|| i - 1)
}

/// Runs `ip`/`tc` with `args`, failing with the command and its stderr.
fn sh(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program).args(args).output().with_context(|| {
        format!("cannot run `{program}`: netlab needs iproute2 (apt-get install iproute2)")
    })?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `program args…` inside namespace `ns`.
fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    sh("ip", &all)
}

/// The netlab namespaces that exist now.
pub fn namespaces() -> Result<Vec<String>> {
    Ok(sh("ip", &["netns", "list"])?
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(PREFIX))
        .map(str::to_string)
        .collect())
}

/// The number of hosts of the lab that is up, 0 when none is.
pub fn hosts_up() -> Result<usize> {
    Ok(namespaces()?
        .iter()
        .filter(|ns| ns.as_str() != SWITCH)
        .count())
}

/// Creates a lab of `hosts` hosts with every link shaped by `shape`,
/// removing any earlier lab first. On failure whatever was created is
/// removed again.
pub fn up(hosts: usize, shape: Shape) -> Result<()> {
    if !(1..=MAX_HOSTS).contains(&hosts) {
        bail!("--hosts {hosts}: netlab makes 1 to {MAX_HOSTS} hosts");
    }
    require_root()?;
    down()?;
    let built = build(hosts, shape);
    if built.is_err() {
        down()?;
    }
    built
}

fn require_root() -> Result<()> {
    let uid = sh("id", &["-u"])?;
    if uid.trim() != "0" {
        bail!(
            "netlab creates network namespaces, veth pairs and qdiscs: it needs root \
             (CAP_NET_ADMIN); run it as root or with sudo"
        );
    }
    Ok(())
}

fn build(hosts: usize, shape: Shape) -> Result<()> {
    sh("ip", &["netns", "add", SWITCH])?;
    sh("ip", &["-n", SWITCH, "link", "set", "lo", "up"])?;
    sh(
        "ip",
        &["-n", SWITCH, "link", "add", BRIDGE, "type", "bridge"],
    )?;
    sh("ip", &["-n", SWITCH, "link", "set", BRIDGE, "up"])?;
    for i in 0..hosts {
        let ns = host_namespace(i);
        let port = format!("h{i}");
        sh("ip", &["netns", "add", &ns])?;
        sh(
            "ip",
            &[
                "link", "add", &port, "netns", SWITCH, "type", "veth", "peer", "name", INTERFACE,
                "netns", &ns,
            ],
        )?;
        sh(
            "ip",
            &["-n", SWITCH, "link", "set", &port, "master", BRIDGE],
        )?;
        sh("ip", &["-n", SWITCH, "link", "set", &port, "up"])?;
        let address = format!("{}/24", host_address(i));
        sh(
            "ip",
            &["-n", &ns, "addr", "add", &address, "dev", INTERFACE],
        )?;
        for (namespace, device) in [(ns.as_str(), INTERFACE), (SWITCH, port.as_str())] {
            sh("ip", &["-n", namespace, "link", "set", device, "mtu", MTU])?;
        }
        sh("ip", &["-n", &ns, "link", "set", INTERFACE, "up"])?;
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
    }
    reshape(hosts, shape)
}

/// Sets every link of a lab of `hosts` hosts to `shape`: the host's
/// outgoing side (its `lab0`) and the switch's side towards it, so each
/// direction of each link carries at most `shape.rate`.
pub fn reshape(hosts: usize, shape: Shape) -> Result<()> {
    let bucket = shape.rate.token_bucket();
    for i in 0..hosts {
        let ns = host_namespace(i);
        let port = format!("h{i}");
        for (namespace, device) in [(ns.as_str(), INTERFACE), (SWITCH, port.as_str())] {
            let mut args = vec!["qdisc", "replace", "dev", device, "root", "handle", "1:"];
            args.extend(bucket.iter().map(String::as_str));
            in_ns(namespace, "tc", &args)?;
        }
        if let Some(delay) = shape.delay_ms {
            let delay = format!("{delay}ms");
            in_ns(
                &ns,
                "tc",
                &[
                    "qdisc", "replace", "dev", INTERFACE, "parent", "1:1", "handle", "10:",
                    "netem", "delay", &delay,
                ],
            )
            .context(
                "--delay needs the kernel's sch_netem module (`tc qdisc … netem`), which this \
                 kernel does not have; leave --delay out",
            )?;
        }
    }
    Ok(())
}

/// Removes every netlab namespace (and with them their veth pairs, the
/// bridge and the qdiscs). Returns the names removed.
pub fn down() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for ns in namespaces()? {
        sh("ip", &["netns", "del", &ns])?;
        removed.push(ns);
    }
    let left = namespaces()?;
    if !left.is_empty() {
        bail!(
            "netlab namespaces still present after removal: {}",
            left.join(", ")
        );
    }
    Ok(removed)
}

/// A lab that is taken down when dropped, also when the run inside it failed.
#[derive(Debug)]
pub struct Lab {
    hosts: usize,
}

impl Lab {
    /// Brings up a lab of `hosts` hosts shaped by `shape`.
    pub fn up(hosts: usize, shape: Shape) -> Result<Self> {
        up(hosts, shape)?;
        Ok(Self { hosts })
    }

    /// The number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Changes every link's shape.
    pub fn reshape(&self, shape: Shape) -> Result<()> {
        reshape(self.hosts, shape)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(err) = down() {
            eprintln!("netlab: taking the lab down failed: {err:#}");
        }
    }
}

/// One line per link direction: namespace, device and its root qdisc.
pub fn describe() -> Result<String> {
    let hosts = hosts_up()?;
    if hosts == 0 {
        return Ok("netlab: no lab is up\n".into());
    }
    let mut out = format!("netlab: {hosts} host(s) on {SUBNET}\n");
    for i in 0..hosts {
        let qdisc = in_ns(
            &host_namespace(i),
            "tc",
            &["qdisc", "show", "dev", INTERFACE],
        )?;
        out.push_str(&format!(
            "  {} {} {INTERFACE}: {}\n",
            host_namespace(i),
            host_address(i),
            qdisc.lines().next().unwrap_or("").trim()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_map_back_to_their_hosts_and_nothing_else_does() {
        for i in [0, 1, 3, 63] {
            assert_eq!(host_of_address(&host_address(i)), Some(i));
        }
        for other in [
            "10.213.0.0",
            "10.213.0.65",
            "10.213.1.1",
            "127.0.0.1",
            "localhost",
        ] {
            assert_eq!(host_of_address(other), None, "{other}");
        }
    }
}
