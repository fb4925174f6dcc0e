//! The `ebpf-proxy` binary as a child process whose JSON log lines the test
//! reads, to wait for "applied" and to check what it reported.
use std::{
    ffi::OsStr,
    io::{self, BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

pub struct AgentProcess {
    child: Child,
    log: Arc<(Mutex<Vec<Value>>, Condvar)>,
}

impl AgentProcess {
    /// Starts `BIN run ARGS --log-format json` logging at info level.
    pub fn start<I, S>(bin: &Path, args: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::start_with_filter(bin, args, "info")
    }

    /// Like `start`, with `RUST_LOG=filter`.
    pub fn start_with_filter<I, S>(bin: &Path, args: I, filter: &str) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::start_with_env(bin, args, filter, &[])
    }

    /// Like `start_with_filter`, with extra environment variables.
    pub fn start_with_env<I, S>(bin: &Path, args: I, filter: &str, envs: &[(&str, &str)]) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::spawn(Command::new(bin), args, filter, envs, true)
    }

    /// Like `start_with_filter`, without echoing the agent's log (the
    /// benchmark reads it but does not show it).
    pub fn start_quiet<I, S>(bin: &Path, args: I, filter: &str) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::spawn(Command::new(bin), args, filter, &[], false)
    }

    /// Like `start`, inside network namespace `ns` (as an agent on a node
    /// of a multi-node test runs in its node's namespace).
    pub fn start_in<I, S>(ns: &ebpf_proxy::sandbox::NetNs, bin: &Path, args: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::start_in_with_filter(ns, bin, args, "info", true)
    }

    /// Like `start_in`, with `RUST_LOG=filter`, showing the log only when
    /// `echo` (the benchmark's agents on its nodes).
    pub fn start_in_with_filter<I, S>(
        ns: &ebpf_proxy::sandbox::NetNs,
        bin: &Path,
        args: I,
        filter: &str,
        echo: bool,
    ) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let cmd = ebpf_proxy::sandbox::spawn_in(ns, None, &bin.to_string_lossy())?;
        Self::spawn(cmd, args, filter, &[], echo)
    }

    /// Like `start`, through `cmd` (a wrapper that execs the agent, which
    /// gets `--log-format json run ARGS` appended).
    pub fn start_command<I, S>(cmd: Command, args: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::spawn(cmd, args, "info", &[], true)
    }

    /// Starts `bin ARGS` with no subcommand: kube-proxy's command line, as
    /// kubeadm's DaemonSet runs it (`--log-format json` still comes first).
    pub fn start_as_kube_proxy<I, S>(bin: &Path, args: I) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(bin);
        cmd.arg("--log-format").arg("json").args(args);
        Self::spawn_command(cmd, "info", &[], true)
    }

    fn spawn<I, S>(mut cmd: Command, args: I, filter: &str, envs: &[(&str, &str)], echo: bool) -> io::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd.arg("--log-format").arg("json").arg("run").args(args);
        Self::spawn_command(cmd, filter, envs, echo)
    }

    fn spawn_command(mut cmd: Command, filter: &str, envs: &[(&str, &str)], echo: bool) -> io::Result<Self> {
        // No explain socket unless a test asks for one (its own
        // `--explain-socket`, which beats the variable): test agents never
        // create the machine's default /run/ebpf-proxy/agent.sock.
        let mut child = cmd
            .env("EBPF_PROXY_EXPLAIN_SOCKET", "none")
            .env("RUST_LOG", filter)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("piped");
        let log: Arc<(Mutex<Vec<Value>>, Condvar)> = Arc::default();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if echo {
                    eprintln!("agent: {line}");
                }
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                sink.0.lock().expect("log lock").push(value);
                sink.1.notify_all();
            }
        });
        Ok(Self { child, log })
    }

    /// Every log record so far.
    #[must_use]
    pub fn records(&self) -> Vec<Value> {
        self.log.0.lock().expect("log lock").clone()
    }

    /// Waits for a record that satisfies `pred` among those after the first
    /// `skip`, returning it.
    pub fn wait_for(&self, skip: usize, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Value, String> {
        let at = self.wait_for_position(skip, timeout, pred)?;
        Ok(self.log.0.lock().expect("log lock")[at].clone())
    }

    /// `wait_for`, returning the record's position (`at + 1` is a mark to
    /// wait after it) without copying the log.
    pub fn wait_for_position(
        &self,
        skip: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<usize, String> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.log;
        let mut records = lock.lock().expect("log lock");
        // Each record is looked at once (a sync may log thousands).
        let mut checked = skip;
        loop {
            if let Some(i) = records.iter().skip(checked).position(&pred) {
                return Ok(checked + i);
            }
            checked = checked.max(records.len());
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no matching agent log record within {timeout:?}; saw {} records", records.len()));
            }
            records = cv.wait_timeout(records, deadline - now).expect("log lock").0;
        }
    }

    /// Waits for the next `ebpf_proxy::agent::APPLIED` record after the first
    /// `skip` records, returning it.
    #[must_use]
    pub fn wait_applied(&self, skip: usize) -> Value {
        self.wait_for(skip, Duration::from_secs(20), |r| message(r) == Some(ebpf_proxy::agent::APPLIED))
            .unwrap_or_else(|e| panic!("agent did not apply the services file: {e}"))
    }

    /// Number of records so far (a mark to wait after).
    #[must_use]
    pub fn mark(&self) -> usize {
        self.log.0.lock().expect("log lock").len()
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the agent with SIGTERM (SIGKILL after 10 s) and waits for it.
    pub fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `message` of a JSON log record.
#[must_use]
pub fn message(record: &Value) -> Option<&str> {
    record.get("fields")?.get("message")?.as_str()
}

/// A field of a JSON log record.
#[must_use]
pub fn field<'a>(record: &'a Value, name: &str) -> Option<&'a Value> {
    record.get("fields")?.get(name)
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
