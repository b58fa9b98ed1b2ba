//! Child processes of the replicated tests (etcd, Garage, haproxy, stowage replicas): their output
//! kept in a bounded log, killed on drop, and the log shown when a test fails.
//! `STOWAGE_TEST_LOGS=DIR` also writes each process's whole output to a file in DIR, for
//! looking into a failure the shown tail does not explain.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{terminate_child, wait_until};

/// The log keeps at most this much (the newest part).
const LOG_CAP: usize = 2 << 20;
/// What a failing test prints of each process's log.
const LOG_SHOWN: usize = 48 << 10;

/// A free loopback port below the kernel's ephemeral range, so that no outgoing connection takes it
/// while a replica that owns it is down and restarting (a port from `:0` could be).
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let span = u64::from(low.saturating_sub(10_000).max(1));
    for _ in 0..1000 {
        let port = 10_000 + (uuid::Uuid::new_v4().as_u128() as u64 % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between 10000 and {low}")
}

/// Runs a command to completion; its stdout, or a panic with both outputs.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    stdout.into_owned()
}

/// The file `STOWAGE_TEST_LOGS` names for a process's whole output (appended to, so a restarted
/// replica's starts follow each other), if set.
fn whole_log(name: &str) -> Option<Arc<std::fs::File>> {
    let dir = std::path::PathBuf::from(std::env::var_os("STOWAGE_TEST_LOGS")?);
    std::fs::create_dir_all(&dir).ok()?;
    let file: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let path = dir.join(format!("{file}.log"));
    std::fs::OpenOptions::new().create(true).append(true).open(path).ok().map(Arc::new)
}

/// A running child process and everything it printed.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: Arc<Mutex<String>>,
    lines: Option<Mutex<mpsc::Receiver<String>>>,
    quiet: bool,
}

impl Proc {
    /// Spawns `cmd` with both pipes drained into the log for the life of the process.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        let mut child =
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| {
                panic!("{name}: spawn {cmd:?}: {e} (is it installed? scripts/test.sh installs it)")
            });
        let log = Arc::new(Mutex::new(String::new()));
        let whole = whole_log(name);
        let (tx, rx) = mpsc::channel::<String>();
        let pipes: [Box<dyn Read + Send>; 2] =
            [Box::new(child.stdout.take().unwrap()), Box::new(child.stderr.take().unwrap())];
        for pipe in pipes {
            let (tx, log, whole) = (tx.clone(), log.clone(), whole.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(pipe);
                let mut buf = Vec::new();
                while let Ok(n) = reader.read_until(b'\n', &mut buf) {
                    if n == 0 {
                        break;
                    }
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    append(&log, &line);
                    if let Some(file) = &whole {
                        let _ = std::io::Write::write_all(&mut &**file, line.as_bytes());
                    }
                    let _ = tx.send(line);
                    buf.clear();
                }
            });
        }
        Proc { name: name.to_owned(), child: Some(child), log, lines: Some(Mutex::new(rx)), quiet: false }
    }

    /// Waits for a line containing `needle`; returns it. Lines are no longer queued afterwards
    /// (the log keeps them), so a long-running process does not fill memory.
    pub fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        let rx = self.lines.take().unwrap_or_else(|| panic!("{}: lines already consumed", self.name));
        let rx = rx.into_inner().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{}: no line with {needle:?} within {timeout:?}; log:\n{}", self.name, self.tail())
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.as_mut().map(|c| c.wait());
                    panic!("{}: exited ({status:?}) before printing {needle:?}; log:\n{}", self.name, self.tail())
                }
            }
        }
    }

    /// Waits until `addr` accepts TCP connections, failing early if the process exits.
    pub fn wait_listening(&mut self, addr: SocketAddr, timeout: Duration) {
        let what = format!("{}: listening on {addr}", self.name);
        wait_until(timeout, Duration::from_millis(50), &what, || {
            if let Some(status) = self.exited() {
                panic!("{}: exited ({status}) before listening on {addr}; log:\n{}", self.name, self.tail());
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                .map(drop)
                .map_err(|e| format!("{e}; log:\n{}", self.tail()))
        });
    }

    /// Freezes the process (SIGSTOP): its sockets stay open, nothing answers.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().unwrap_or_else(|| panic!("{} is not running", self.name));
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill only sends a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to {}", self.name);
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (at most `limit`, then SIGKILL) for the exit; how long it took, or
    /// `None` when it had to be killed.
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        terminate_child(&mut child, limit)
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Ends the process and returns its whole log, which its drop then no longer prints.
    pub fn into_log(mut self) -> String {
        self.kill9();
        self.quiet = true;
        self.log()
    }

    /// The newest part of the log.
    pub fn tail(&self) -> String {
        let log = self.log.lock().unwrap();
        let mut cut = log.len().saturating_sub(LOG_SHOWN);
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        log[cut..].to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() && !self.quiet {
            eprintln!(
                "======== {} log (newest {} KiB) ========\n{}\n======== end of {} log ========",
                self.name,
                LOG_SHOWN >> 10,
                self.tail(),
                self.name
            );
        }
    }
}

fn append(log: &Mutex<String>, line: &str) {
    let mut log = log.lock().unwrap();
    log.push_str(line);
    if !line.ends_with('\n') {
        log.push('\n');
    }
    if log.len() > LOG_CAP {
        let mut cut = log.len() - LOG_CAP / 2;
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        log.replace_range(..cut, "[… earlier log dropped …]\n");
    }
}
