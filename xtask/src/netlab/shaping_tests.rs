//! netlab on the real kernel (needs root, like netlab itself): a link
//! carries what its rate allows, a host reaches nothing outside the lab,
//! and nothing is left behind, also when the code inside the lab panics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use super::lab::{self, Lab, Shape};

/// Moves the calling thread into namespace `ns` (network namespaces are
/// per thread).
fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("the namespace exists");
    // SAFETY: setns on a valid namespace fd; it changes only this thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns({ns}): {}", std::io::Error::last_os_error());
}

/// Sends `bytes` from host 0 to host 1 over TCP; returns goodput in bit/s.
fn goodput(bytes: usize) -> f64 {
    let receiver = std::thread::spawn(move || {
        enter(&lab::host_namespace(1));
        let listener = TcpListener::bind((lab::host_address(1).as_str(), 5201)).unwrap();
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let (mut got, start) = (0, Instant::now());
        while got < bytes {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed after {got} bytes");
            got += n;
        }
        8.0 * got as f64 / start.elapsed().as_secs_f64()
    });
    std::thread::spawn(move || {
        enter(&lab::host_namespace(0));
        let to: SocketAddr = format!("{}:5201", lab::host_address(1)).parse().unwrap();
        let mut stream = loop {
            match TcpStream::connect(to) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let chunk = vec![7u8; 1 << 16];
        let mut sent = 0;
        while sent < bytes {
            stream.write_all(&chunk).unwrap();
            sent += chunk.len();
        }
    })
    .join()
    .unwrap();
    receiver.join().unwrap()
}

/// The names of this machine's (root namespace's) links.
fn root_links() -> String {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn links_carry_their_rate_reach_only_the_lab_and_leave_nothing_behind() {
    let links_before = root_links();
    let shape = |rate: &str| Shape::at(rate.parse().unwrap());
    {
        let lab = Lab::up(2, shape("100mbit")).expect("netlab needs root and iproute2");
        // 100 Mbit/s: 12.5 MB take a second; TCP over 9000-byte frames
        // keeps ~99% of it, and the token bucket's burst adds a little.
        let slow = goodput(12_500_000);
        assert!(
            (85e6..=104e6).contains(&slow),
            "100mbit link carried {slow:.3e} bit/s"
        );
        lab.reshape(shape("400mbit")).unwrap();
        let fast = goodput(25_000_000);
        assert!(
            (340e6..=416e6).contains(&fast),
            "400mbit link carried {fast:.3e} bit/s"
        );

        // Outside the lab's subnet there is no route: nothing can leave.
        let escaped = std::thread::spawn(|| {
            enter(&lab::host_namespace(0));
            TcpStream::connect_timeout(&"10.0.0.1:80".parse().unwrap(), Duration::from_secs(1))
        })
        .join()
        .unwrap();
        let err = escaped.expect_err("a lab host reached an address outside the lab");
        assert_eq!(err.kind(), std::io::ErrorKind::NetworkUnreachable, "{err}");
    }
    assert!(lab::namespaces().unwrap().is_empty(), "namespaces left");
    assert_eq!(root_links(), links_before, "links changed outside the lab");

    // A run that fails inside the lab still takes it down.
    let panicked = std::panic::catch_unwind(|| {
        let _lab = Lab::up(3, shape("1gbit")).unwrap();
        assert_eq!(lab::hosts_up().unwrap(), 3);
        panic!("the run failed");
    });
    assert!(panicked.is_err());
    assert!(
        lab::namespaces().unwrap().is_empty(),
        "namespaces left after a panic"
    );
    assert_eq!(root_links(), links_before, "links left after a panic");
}
