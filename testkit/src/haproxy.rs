//! A real load balancer for tests: Debian's HAProxy (`/usr/sbin/haproxy -f CFG -db`) in front
//! of the given backends, its configuration written by the test: a frontend on a free
//! 127.0.0.1 port, `roundrobin` or `leastconn`, HTTP health checks (`GET /health` every
//! second, down after 2 failures, up after 1 success by default), WebSocket-friendly
//! timeouts (`timeout tunnel`), and an admin socket from which [`TestHaproxy`] reads which
//! backends are up. The process is killed when the handle drops or the test process ends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::watchdog::Watchdog;

/// Where Debian's package puts the binary.
pub const HAPROXY_BIN: &str = "/usr/sbin/haproxy";

/// How HAProxy picks a backend for a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Balance {
    /// In turn.
    #[default]
    RoundRobin,
    /// The backend with the fewest open connections (suits long-lived WebSockets).
    LeastConn,
}

impl Balance {
    fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "roundrobin",
            Self::LeastConn => "leastconn",
        }
    }
}

/// Settings of the generated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HaproxyOptions {
    /// Balancing algorithm.
    pub balance: Balance,
    /// Path of the HTTP health check (`GET`, 200 means up).
    pub health_path: String,
    /// Time between health checks of one backend (`inter`).
    pub check_interval: Duration,
    /// Failed checks in a row that take a backend out (`fall`).
    pub fall: u32,
    /// Passed checks in a row that bring it back (`rise`).
    pub rise: u32,
    /// Idle limit of an upgraded (WebSocket) or long-polling connection (`timeout tunnel`).
    pub tunnel_timeout: Duration,
    /// Idle limit of client and server sides of plain HTTP (`timeout client` / `server`).
    pub idle_timeout: Duration,
    /// Longest time to connect to a backend (`timeout connect`).
    pub connect_timeout: Duration,
}

impl Default for HaproxyOptions {
    fn default() -> Self {
        Self {
            balance: Balance::RoundRobin,
            health_path: "/health".into(),
            check_interval: Duration::from_secs(1),
            fall: 2,
            rise: 1,
            tunnel_timeout: Duration::from_secs(3600),
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

impl HaproxyOptions {
    /// Sets [`HaproxyOptions::balance`].
    #[must_use]
    pub fn with_balance(mut self, balance: Balance) -> Self {
        self.balance = balance;
        self
    }

    /// Sets the health check's timing (`inter`, `fall`, `rise`).
    #[must_use]
    pub fn with_checks(mut self, interval: Duration, fall: u32, rise: u32) -> Self {
        self.check_interval = interval;
        self.fall = fall.max(1);
        self.rise = rise.max(1);
        self
    }

    /// Sets [`HaproxyOptions::health_path`].
    #[must_use]
    pub fn with_health_path(mut self, path: impl Into<String>) -> Self {
        self.health_path = path.into();
        self
    }

    /// Sets [`HaproxyOptions::idle_timeout`].
    #[must_use]
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets [`HaproxyOptions::tunnel_timeout`].
    #[must_use]
    pub fn with_tunnel_timeout(mut self, timeout: Duration) -> Self {
        self.tunnel_timeout = timeout;
        self
    }
}

/// Why HAProxy could not be started or asked.
#[derive(Debug, thiserror::Error)]
#[error("HAProxy for the tests: {0}")]
pub struct TestHaproxyError(String);

/// What HAProxy's health checks say about one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendStatus {
    /// The backend's address.
    pub addr: SocketAddr,
    /// Whether it takes traffic (HAProxy's status starts with `UP`).
    pub up: bool,
    /// HAProxy's own status text (`UP`, `DOWN`, `UP 1/2`, `no check`, ...).
    pub status: String,
}

/// A running HAProxy; killed when dropped.
#[derive(Debug)]
pub struct TestHaproxy {
    addr: SocketAddr,
    backends: Vec<SocketAddr>,
    dir: tempfile::TempDir,
    child: Child,
    watchdog: Option<Watchdog>,
}

/// Name of the backend section and of its servers (`b0`, `b1`, ...).
const BACKEND: &str = "replicas";

impl TestHaproxy {
    /// Writes the configuration, starts HAProxy and waits until its frontend accepts
    /// connections (the backends' health is not awaited: see
    /// [`TestHaproxy::wait_backend_state`]).
    pub async fn start(
        backends: &[SocketAddr],
        options: HaproxyOptions,
    ) -> Result<TestHaproxy, TestHaproxyError> {
        let fail = |what: &str, e: &dyn std::fmt::Display| TestHaproxyError(format!("{what}: {e}"));
        if !Path::new(HAPROXY_BIN).exists() {
            return Err(TestHaproxyError(format!(
                "{HAPROXY_BIN} is missing: install Debian's haproxy package (apt-get install \
                 haproxy)"
            )));
        }
        if backends.is_empty() {
            return Err(TestHaproxyError("no backends given".into()));
        }
        if !options.health_path.starts_with('/')
            || options.health_path.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(TestHaproxyError("the health path is a plain absolute path".into()));
        }
        let dir = tempfile::Builder::new()
            .prefix("xagent-haproxy-")
            .tempdir()
            .map_err(|e| fail("create a temporary directory", &e))?;
        let port = crate::postgres::free_port().map_err(|e| fail("find a free port", &e))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let config = render_config(addr, backends, &options, &socket_path(dir.path()));
        let config_path = dir.path().join("haproxy.cfg");
        std::fs::write(&config_path, config).map_err(|e| fail("write haproxy.cfg", &e))?;
        let log = std::fs::File::create(dir.path().join("haproxy.log"))
            .map_err(|e| fail("create haproxy.log", &e))?;
        let log_err = log.try_clone().map_err(|e| fail("open haproxy.log", &e))?;
        let child = Command::new(HAPROXY_BIN)
            .arg("-f")
            .arg(&config_path)
            .arg("-db")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| fail("start haproxy", &e))?;
        let mut kill = Command::new("kill");
        kill.args(["-9", &child.id().to_string()]);
        let watchdog = Watchdog::arm(&kill, None).map_err(|e| fail("start the watchdog", &e))?;
        let mut proxy =
            TestHaproxy { addr, backends: backends.to_vec(), dir, child, watchdog: Some(watchdog) };
        proxy.wait_listening(Duration::from_secs(10)).await?;
        Ok(proxy)
    }

    async fn wait_listening(&mut self, timeout: Duration) -> Result<(), TestHaproxyError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(TestHaproxyError(format!("haproxy exited ({status}): {}", self.log())));
            }
            let frontend = tokio::net::TcpStream::connect(self.addr).await.is_ok();
            if frontend && self.backend_states().await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestHaproxyError(format!(
                    "haproxy did not listen on {} within {timeout:?}: {}",
                    self.addr,
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The frontend's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The HAProxy process's id (for measuring what it costs).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The frontend as a base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// HAProxy's output so far (its warnings and alerts), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }

    /// Sends one command to the admin socket (`show stat`, `disable server replicas/b0`, ...)
    /// and returns the answer.
    pub async fn admin_command(&self, command: &str) -> Result<String, TestHaproxyError> {
        let path = socket_path(self.dir.path());
        let fail = |e: std::io::Error| TestHaproxyError(format!("admin socket `{command}`: {e}"));
        let mut stream = tokio::net::UnixStream::connect(&path).await.map_err(fail)?;
        stream.write_all(format!("{}\n", command.trim()).as_bytes()).await.map_err(fail)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.map_err(fail)?;
        Ok(answer)
    }

    /// What the health checks say about every backend now.
    pub async fn backend_states(&self) -> Result<Vec<BackendStatus>, TestHaproxyError> {
        let csv = self.admin_command("show stat").await?;
        let mut header: Vec<&str> = Vec::new();
        let mut states = Vec::new();
        for line in csv.lines() {
            if let Some(names) = line.strip_prefix("# ") {
                header = names.split(',').collect();
                continue;
            }
            let column = |name: &str| header.iter().position(|h| *h == name);
            let (Some(px), Some(sv), Some(st)) =
                (column("pxname"), column("svname"), column("status"))
            else {
                continue;
            };
            let fields: Vec<&str> = line.split(',').collect();
            if fields.get(px) != Some(&BACKEND) {
                continue;
            }
            let Some(index) =
                fields.get(sv).and_then(|s| s.strip_prefix('b')?.parse::<usize>().ok())
            else {
                continue;
            };
            let (Some(addr), Some(status)) = (self.backends.get(index), fields.get(st)) else {
                continue;
            };
            states.push(BackendStatus {
                addr: *addr,
                up: status.starts_with("UP"),
                status: (*status).to_owned(),
            });
        }
        if states.len() != self.backends.len() {
            return Err(TestHaproxyError(format!("`show stat` did not list every backend: {csv}")));
        }
        Ok(states)
    }

    /// Waits until HAProxy sees the backend at `addr` up (or down), polling its admin
    /// socket; the error lists every backend's status at the deadline.
    pub async fn wait_backend_state(
        &self,
        addr: SocketAddr,
        up: bool,
        timeout: Duration,
    ) -> Result<(), TestHaproxyError> {
        if !self.backends.contains(&addr) {
            return Err(TestHaproxyError(format!("{addr} is not one of the backends")));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let states = self.backend_states().await?;
            if states.iter().any(|s| s.addr == addr && s.up == up) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let want = if up { "up" } else { "down" };
                return Err(TestHaproxyError(format!(
                    "{addr} was not {want} within {timeout:?}: {states:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestHaproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The process is gone: a later `kill` could hit another process with its id.
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
    }
}

fn socket_path(dir: &Path) -> PathBuf {
    dir.join("admin.sock")
}

fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// The configuration file for `backends` behind a frontend on `addr`.
fn render_config(
    addr: SocketAddr,
    backends: &[SocketAddr],
    options: &HaproxyOptions,
    socket: &Path,
) -> String {
    let mut config = format!(
        "global\n\
         \x20 maxconn 4096\n\
         \x20 stats socket {socket} mode 600 level admin\n\
         defaults\n\
         \x20 mode http\n\
         \x20 option redispatch\n\
         \x20 retries 2\n\
         \x20 timeout connect {connect}ms\n\
         \x20 timeout client {idle}ms\n\
         \x20 timeout server {idle}ms\n\
         \x20 timeout tunnel {tunnel}ms\n\
         \x20 timeout http-request 10s\n\
         \x20 timeout check {connect}ms\n\
         frontend front\n\
         \x20 bind {addr}\n\
         \x20 default_backend {BACKEND}\n\
         backend {BACKEND}\n\
         \x20 balance {balance}\n\
         \x20 option httpchk GET {path}\n\
         \x20 http-check expect status 200\n",
        socket = socket.display(),
        connect = millis(options.connect_timeout),
        idle = millis(options.idle_timeout),
        tunnel = millis(options.tunnel_timeout),
        balance = options.balance.as_str(),
        path = options.health_path,
    );
    for (i, backend) in backends.iter().enumerate() {
        config.push_str(&format!(
            "  server b{i} {backend} check inter {}ms fall {} rise {}\n",
            millis(options.check_interval),
            options.fall,
            options.rise
        ));
    }
    config
}
