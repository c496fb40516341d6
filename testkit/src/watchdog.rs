//! Cleanup that outlives the test process: a small shell in its own session waits for the
//! end of a pipe only this process holds (closed at exit, panic abort or kill -9 alike),
//! then runs a command (stop a server, kill a process) and removes a directory.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// A pending cleanup; see the module docs.
#[derive(Debug)]
pub(crate) struct Watchdog {
    pipe: Option<ChildStdin>,
    child: Child,
}

impl Watchdog {
    /// Arms a cleanup that runs `cleanup` and then removes `remove` (if given) once this
    /// process ends or [`Watchdog::fire`] is called.
    pub(crate) fn arm(cleanup: &Command, remove: Option<&Path>) -> std::io::Result<Self> {
        let mut cmd = if Path::new("/usr/bin/setsid").exists() {
            // Its own session: a Ctrl-C to the test's process group does not end it early.
            let mut cmd = Command::new("/usr/bin/setsid");
            cmd.arg("sh");
            cmd
        } else {
            Command::new("sh")
        };
        cmd.arg("-c")
            .arg(
                "cat > /dev/null; \"$@\" > /dev/null 2>&1; \
                 if [ -n \"$XAGENT_WATCHDOG_REMOVE\" ]; then rm -rf \"$XAGENT_WATCHDOG_REMOVE\"; fi",
            )
            .arg("xagent-testkit-watchdog")
            .arg(cleanup.get_program())
            .args(cleanup.get_args())
            .env("XAGENT_WATCHDOG_REMOVE", remove.map(PathBuf::from).unwrap_or_default())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn()?;
        let pipe = child.stdin.take();
        Ok(Self { pipe, child })
    }

    /// Runs the cleanup now and waits for it.
    pub(crate) fn fire(mut self) {
        drop(self.pipe.take());
        let _ = self.child.wait();
    }

    /// Cancels the cleanup (what it would clean is gone already).
    pub(crate) fn disarm(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.pipe.take());
    }
}
