//! A real Mosquitto broker for tests (cargo feature `testing`): started from Debian's
//! `mosquitto` package on a free loopback port with its own temporary configuration (not the
//! system service), stopped when dropped.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let broker = xagent_connector_homie::testing::Mosquitto::start()?;
//! println!("broker at {}", broker.url());
//! # Ok(()) }
//! ```

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::link::MqttUrl;

/// Where the broker binary is looked for (override with `MOSQUITTO=/path/to/mosquitto`).
pub const DEFAULT_MOSQUITTO: &str = "/usr/sbin/mosquitto";

/// A running Mosquitto broker on `127.0.0.1`.
#[derive(Debug)]
pub struct Mosquitto {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    secured: bool,
}

/// Where `mosquitto_passwd` is looked for (override with `MOSQUITTO_PASSWD=/path`).
pub const DEFAULT_MOSQUITTO_PASSWD: &str = "/usr/bin/mosquitto_passwd";

fn binary() -> PathBuf {
    std::env::var_os("MOSQUITTO").map_or_else(|| PathBuf::from(DEFAULT_MOSQUITTO), PathBuf::from)
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Mosquitto {
    /// Starts a broker on a free port (a few attempts, in case another process takes the port
    /// between the probe and the broker's bind).
    pub fn start() -> io::Result<Self> {
        Self::start_in(tempfile::tempdir()?, false)
    }

    /// Starts a broker that refuses anonymous clients: only these users (name, password) may
    /// connect, and when `acl` is given (Mosquitto's `acl_file` syntax) only as it allows.
    pub fn start_secured(users: &[(&str, &str)], acl: Option<&str>) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "")?;
        let tool = std::env::var_os("MOSQUITTO_PASSWD")
            .map_or_else(|| PathBuf::from(DEFAULT_MOSQUITTO_PASSWD), PathBuf::from);
        for (user, password) in users {
            let status = Command::new(&tool)
                .arg("-b")
                .arg(&passwd)
                .args([user, password])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if !status.success() {
                return Err(io::Error::other(format!("mosquitto_passwd failed for {user}")));
            }
        }
        let mut f = std::fs::File::create(dir.path().join("auth.conf"))?;
        writeln!(f, "allow_anonymous false")?;
        writeln!(f, "password_file {}", passwd.display())?;
        if let Some(acl) = acl {
            let acl_path = dir.path().join("acl");
            std::fs::write(&acl_path, acl)?;
            writeln!(f, "acl_file {}", acl_path.display())?;
        }
        drop(f);
        Self::start_in(dir, true)
    }

    fn start_in(dir: tempfile::TempDir, secured: bool) -> io::Result<Self> {
        let mut last = io::Error::other("not started");
        for _ in 0..5 {
            let port = free_port()?;
            match Self::spawn(dir.path(), port, secured) {
                Ok(child) => return Ok(Self { child: Some(child), port, dir, secured }),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn spawn(dir: &std::path::Path, port: u16, secured: bool) -> io::Result<Child> {
        let bin = binary();
        if !bin.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} not found: install the broker (apt-get install mosquitto) or set MOSQUITTO",
                    bin.display()
                ),
            ));
        }
        let conf = dir.join("mosquitto.conf");
        let mut f = std::fs::File::create(&conf)?;
        writeln!(f, "listener {port} 127.0.0.1")?;
        writeln!(f, "persistence false")?;
        writeln!(f, "log_type all")?;
        if secured {
            f.write_all(&std::fs::read(dir.join("auth.conf"))?)?;
        } else {
            writeln!(f, "allow_anonymous true")?;
        }
        drop(f);
        let log = std::fs::File::create(dir.join("mosquitto.log"))?;
        let mut child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("mosquitto exited at start ({status})")));
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(child);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(io::Error::new(io::ErrorKind::TimedOut, "mosquitto did not listen within 10 s"))
    }

    /// The broker's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// The URL, parsed.
    pub fn mqtt_url(&self) -> MqttUrl {
        MqttUrl::new("127.0.0.1", self.port)
    }

    /// The broker's log so far (for failing tests).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Stops the broker (every client sees the connection drop; retained messages are lost,
    /// persistence is off).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker again on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.child = Some(Self::spawn(self.dir.path(), self.port, self.secured)?);
        Ok(())
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.stop();
    }
}
