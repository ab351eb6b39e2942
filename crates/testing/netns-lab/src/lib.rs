//! A lab of network namespaces on this machine: "nodes" joined by veth pairs, processes
//! started inside them, and everything removed again when the lab is dropped, on error
//! and on Ctrl-C alike. Used by `ambit demo`, the end-to-end tests, the interop suite and
//! the benchmarks; never by the node proxy, so a build without the demo leaves it out.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod control;
pub mod jwt;
pub mod kube;
pub mod kube_control;
pub mod l7;
pub mod mesh;
pub mod pcap;
pub mod peer;
pub mod stats;
pub mod waypoint;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

#[derive(Default)]
struct Owned {
    namespaces: Vec<String>,
    children: Vec<Child>,
}

impl Owned {
    fn cleanup(&mut self) {
        for child in &mut self.children {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
        self.children.clear();
        for ns in self.namespaces.drain(..).rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Removes what a lab created; safe to call from a signal handler task.
#[derive(Clone)]
pub struct Cleanup(Arc<Mutex<Owned>>);

impl Cleanup {
    pub fn run(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).cleanup();
    }
}

pub struct Lab {
    prefix: String,
    owned: Arc<Mutex<Owned>>,
    pub dir: tempfile_dir::TempDir,
}

/// A process started in a namespace; its output goes to a log file in the lab directory.
pub struct Process {
    pub pid: u32,
    pub log: PathBuf,
}

impl Lab {
    /// Fails (never skips) when not root or when iproute2 is missing.
    pub fn new(tag: &str) -> anyhow::Result<Lab> {
        if !nix::unistd::geteuid().is_root() {
            bail!("network namespaces need root: run this as root (the test command installs what it needs when root)");
        }
        require_tool("ip", "iproute2")?;
        let prefix = format!(
            "ambit-{tag}-{}-{:04x}",
            std::process::id(),
            rand::random::<u16>()
        );
        let dir = tempfile_dir::TempDir::new(&prefix)?;
        Ok(Lab {
            prefix,
            owned: Arc::default(),
            dir,
        })
    }

    /// The unique prefix of everything this lab names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn cleanup_handle(&self) -> Cleanup {
        Cleanup(self.owned.clone())
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a network namespace with `lo` up; returns its full name.
    pub fn netns(&self, name: &str) -> anyhow::Result<String> {
        let full = format!("{}-{name}", self.prefix);
        run(Command::new("ip").args(["netns", "add", &full]))?;
        self.owned().namespaces.push(full.clone());
        self.exec(&full, &["ip", "link", "set", "lo", "up"])?;
        Ok(full)
    }

    /// Joins two namespaces with a veth pair named `dev` on both ends; `a_cidr`/`b_cidr`
    /// like `10.78.0.1/24`.
    pub fn link(
        &self,
        a: &str,
        a_cidr: &str,
        b: &str,
        b_cidr: &str,
        dev: &str,
    ) -> anyhow::Result<()> {
        run(Command::new("ip").args([
            "-n", a, "link", "add", dev, "type", "veth", "peer", "name", dev, "netns", b,
        ]))?;
        for (ns, cidr) in [(a, a_cidr), (b, b_cidr)] {
            self.exec(ns, &["ip", "addr", "add", cidr, "dev", dev])?;
            self.exec(ns, &["ip", "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Runs a command inside `ns` and returns its stdout; a failure carries stderr.
    pub fn exec(&self, ns: &str, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new("ip").args(["netns", "exec", ns]).args(args))
    }

    /// Starts a long-running process inside `ns`, killed when the lab goes away.
    pub fn spawn(
        &self,
        ns: &str,
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, String)],
    ) -> anyhow::Result<Process> {
        self.spawn_at(ns, name, program, args, env, None)
    }

    /// [`Lab::spawn`] in the working directory `cwd` (a pod's root, say, whose relative
    /// default paths the program reads).
    pub fn spawn_at(
        &self,
        ns: &str,
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, String)],
        cwd: Option<&Path>,
    ) -> anyhow::Result<Process> {
        let log = self.dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program).args(args);
        cmd.env_clear();
        cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} in {ns}", program.display()))?;
        let pid = child.id();
        self.owned().children.push(child);
        Ok(Process { pid, log })
    }

    /// Whether a started process is still running.
    pub fn is_running(&self, pid: u32) -> bool {
        let mut owned = self.owned();
        owned
            .children
            .iter_mut()
            .find(|c| c.id() == pid)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends a signal to a started process and waits up to `timeout` for it to exit.
    pub fn signal_and_wait(
        &self,
        pid: u32,
        signal: nix::sys::signal::Signal,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        self.wait_exit(pid, timeout)
    }

    /// Waits up to `timeout` for a started process to exit on its own.
    pub fn wait_exit(
        &self,
        pid: u32,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut owned = self.owned();
                let child = owned
                    .children
                    .iter_mut()
                    .find(|c| c.id() == pid)
                    .context("no such process in this lab")?;
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
            }
            if Instant::now() > deadline {
                bail!("process {pid} did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn netns_path(ns: &str) -> PathBuf {
        PathBuf::from("/var/run/netns").join(ns)
    }

    /// Runs `f` on a thread inside `ns`: sockets it creates live in that namespace.
    pub fn in_netns<T: Send>(
        ns: &str,
        f: impl FnOnce() -> std::io::Result<T> + Send,
    ) -> anyhow::Result<T> {
        let netns = ambit_zds::netns::Netns::open(Self::netns_path(ns))
            .with_context(|| format!("opening network namespace {ns}"))?;
        Ok(netns.run_in(f)?)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.owned().cleanup();
    }
}

/// A running `tcpdump`; [`PacketCapture::finish`] stops it and parses what it saw.
pub struct PacketCapture {
    proc: Process,
    file: PathBuf,
}

impl Lab {
    /// Starts `tcpdump` on `dev` inside `ns`, writing every packet as it arrives.
    pub fn capture(&self, ns: &str, dev: &str) -> anyhow::Result<PacketCapture> {
        require_tool("tcpdump", "tcpdump")?;
        let file = self
            .dir
            .path()
            .join(format!("{dev}-{}.pcap", rand::random::<u32>()));
        let file_arg = file.display().to_string();
        // -Z root: tcpdump would otherwise drop to its own user and fail to write here.
        let proc = self.spawn(
            ns,
            &format!("tcpdump-{dev}"),
            Path::new("tcpdump"),
            &[
                "-i",
                dev,
                "-n",
                "-U",
                "--immediate-mode",
                "-s",
                "0",
                "-Z",
                "root",
                "-w",
                &file_arg,
            ],
            &[],
        )?;
        wait_until(
            "tcpdump to start listening",
            Duration::from_secs(10),
            || std::fs::read_to_string(&proc.log).is_ok_and(|l| l.contains("listening on")),
        )?;
        Ok(PacketCapture { proc, file })
    }
}

impl PacketCapture {
    pub fn finish(self, lab: &Lab) -> anyhow::Result<pcap::Capture> {
        // Give the last packets a moment to be written before stopping tcpdump.
        std::thread::sleep(Duration::from_millis(200));
        lab.signal_and_wait(
            self.proc.pid,
            nix::sys::signal::Signal::SIGINT,
            Duration::from_secs(5),
        )?;
        let data = std::fs::read(&self.file).context("reading the packet capture")?;
        pcap::parse(&data)
    }
}

pub fn require_tool(tool: &str, package: &str) -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
        .unwrap_or(false);
    if !found {
        bail!("`{tool}` is not installed: install the Debian package {package}");
    }
    Ok(())
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A plain HTTP/1.1 GET from inside `ns`; returns (status, body).
pub fn http_get(ns: &str, addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let path = path.to_string();
    let raw = Lab::in_netns(ns, move || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        Ok(buf)
    })?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed HTTP response")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Connects to a TLS server at `addr` and sends a ClientHello, then waits up to 1 s for
/// its answer: what makes an HBONE server look up its certificate (it does so only for a
/// client that has started TLS, not for a bare TCP connection).
pub fn send_client_hello(addr: SocketAddr) -> std::io::Result<()> {
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let name =
        rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(std::io::Error::other)?;
    let mut hello = Vec::new();
    tls.write_tls(&mut hello)?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.write_all(&hello)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let _ = s.read(&mut [0u8; 1024]);
    Ok(())
}

/// Removes the lab's namespaces and processes on Ctrl-C or SIGTERM, then exits.
pub fn remove_on_signal(cleanup: Cleanup) {
    remove_all_on_signal(vec![cleanup]);
}

/// [`remove_on_signal`] for several labs. One process-wide handler removes every lab ever
/// registered, so a program that builds labs in phases cleans up all of them, whichever
/// phase the signal finds it in.
pub fn remove_all_on_signal(cleanups: Vec<Cleanup>) {
    use std::sync::{Mutex, OnceLock};
    static REGISTERED: OnceLock<Mutex<Vec<Cleanup>>> = OnceLock::new();
    let mut first = false;
    let registered = REGISTERED.get_or_init(|| {
        first = true;
        Mutex::new(Vec::new())
    });
    registered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(cleanups);
    if !first {
        return;
    }
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = runtime {
            rt.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
            });
            eprintln!("\ninterrupted: removing the lab's namespaces");
            for cleanup in registered.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                cleanup.run();
            }
            std::process::exit(130);
        }
    });
}

/// A TCP port that a process the test starts next can bind, on every address. Chosen
/// below the kernel's ephemeral range (32768–60999 by default): a port from that range,
/// free when checked, can be taken by a connection another test opens before the process
/// binds it, and the process then fails to start. Each test process starts at its own
/// offset; a port in use is skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id().wrapping_mul(97) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free TCP port left in {LOW}..{}", LOW + SPAN);
        let port = (LOW + (start + n) % SPAN) as u16;
        let free = match std::net::TcpListener::bind(("::", port)) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => false,
            // No IPv6 here: the IPv4 wildcard then.
            Err(_) => std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
        };
        if free {
            return port;
        }
    }
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// A temporary directory removed on drop (kept when `AMBIT_KEEP_LAB_DIR` is set, to debug).
pub mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(prefix: &str) -> std::io::Result<TempDir> {
            let path = std::env::temp_dir().join(prefix);
            std::fs::create_dir_all(&path)?;
            Ok(TempDir(path))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            if std::env::var_os("AMBIT_KEEP_LAB_DIR").is_none() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}

/// `--proxy-env KEY=VALUE` (the demo's and the benchmark driver's): extra environment
/// for the node proxies.
pub fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

#[cfg(test)]
mod env_pair_tests {
    #[test]
    fn key_value_pairs() {
        let pair = |k: &str, v: &str| Ok((k.to_string(), v.to_string()));
        assert_eq!(super::parse_env_pair("A=1"), pair("A", "1"));
        assert_eq!(super::parse_env_pair("A=b=c"), pair("A", "b=c"));
        assert_eq!(super::parse_env_pair("A="), pair("A", ""));
        assert!(super::parse_env_pair("=1").is_err());
        assert!(super::parse_env_pair("A").is_err());
    }
}

#[cfg(test)]
mod free_port_tests {
    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..20).map(|_| super::free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((20_000..32_000).contains(&p), "{p}");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }
}
