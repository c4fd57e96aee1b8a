//! A `dlframe` subcommand (`serve`, `scheduler`, `executor`) as a real child process: its stdout
//! read line by line, every wait bounded by [`LIMIT`], and the process killed on drop unless it
//! has exited.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// The longest any step (a start, a call, a stop) may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A running `dlframe` process.
pub struct Process {
    pub child: Child,
    name: String,
    lines: Receiver<String>,
}

impl Process {
    /// Starts `dlframe ARGS...` with stdout piped (stderr goes to the test's) and no
    /// `DLFRAME_TOKEN` from the test's environment.
    pub fn start(args: &[&str]) -> Process {
        Process::start_command(Command::new(env!("CARGO_BIN_EXE_dlframe")), args)
    }

    /// As [`Process::start`], with the process's address space held to `bytes` by util-linux's
    /// `prlimit`, so that an allocation past it fails inside the process; None (with the reason
    /// printed) where `prlimit` is missing.
    pub fn start_limited(args: &[&str], bytes: u64) -> Option<Process> {
        if Command::new("prlimit").arg("--version").output().is_err() {
            println!(
                "SKIPPED: util-linux's prlimit is not installed, so the address space cannot be limited"
            );
            return None;
        }
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--as={bytes}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_dlframe"))
            // glibc reserves 64 MB of address space per arena; two keep the limit for the data.
            .env("MALLOC_ARENA_MAX", "2");
        Some(Process::start_command(command, args))
    }

    fn start_command(mut command: Command, args: &[&str]) -> Process {
        // Killed with the test, even when the test aborts (a stack overflow runs no destructor):
        // the kernel sends SIGKILL when the thread that started it ends.
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec the closure only calls prctl, which is
            // async-signal-safe, and allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = command
            .args(args)
            .env_remove("DLFRAME_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Process { child, name: format!("dlframe {}", args.first().copied().unwrap_or_default()), lines }
    }

    /// Waits (bounded) for the next stdout line that contains `text`. Kills the process and
    /// panics when none comes in time, or when the process ends first.
    pub fn line_with(&mut self, text: &str) -> String {
        let start = Instant::now();
        loop {
            let left = LIMIT.checked_sub(start.elapsed()).unwrap_or_default();
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => {
                    let _ = self.child.kill();
                    panic!("{} printed no line with {text:?} ({e})", self.name);
                }
            }
        }
    }

    /// The address after `listening on ` or `serving on ` in the next line that has one.
    pub fn address(&mut self, text: &str) -> String {
        let line = self.line_with(text);
        let rest = &line[line.find(text).unwrap() + text.len()..];
        rest.split([' ', ',']).next().unwrap().to_string()
    }

    /// Sends `signal` (`TERM`, `KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < LIMIT, "{} did not exit within {LIMIT:?}", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
