//! `onceflow probe`: asks a running job's `/healthz` (or any path of its HTTP endpoint) and
//! exits 0 on a 200: the image's HEALTHCHECK, without an HTTP client in the image.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// The job's metrics address (its `run --metrics-addr`).
    #[arg(long, alias = "addr", default_value = "127.0.0.1:9090")]
    metrics_addr: SocketAddr,
    /// The path to ask.
    #[arg(long, default_value = "/healthz")]
    path: String,
}

pub fn run(args: &ProbeArgs) -> anyhow::Result<bool> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&args.metrics_addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {} HTTP/1.0\r\nHost: {}\r\n\r\n",
        args.path, args.metrics_addr
    )?;
    let mut head = [0u8; 32];
    let n = stream.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    let ok = line.split_whitespace().nth(1) == Some("200");
    if !ok {
        eprintln!(
            "{}{}: {}",
            args.metrics_addr,
            args.path,
            line.lines().next().unwrap_or("no answer")
        );
    }
    Ok(ok)
}
