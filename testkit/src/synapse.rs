//! A real Matrix homeserver for tests: Synapse (the reference homeserver, from PyPI) started
//! in a temporary directory on a free 127.0.0.1 port, with a SQLite database and a
//! registration shared secret, once per test process ([`TestSynapse::shared`]) or per test
//! ([`TestSynapse::dedicated`], which can be stopped and started again).
//!
//! Synapse comes from `XAGENT_SYNAPSE_PYTHON` (a Python that imports `synapse`) or from a
//! virtual environment this module creates once under the workspace's `target/synapse-venv`
//! (`python3 -m venv`, then `pip install matrix-synapse==SYNAPSE_VERSION`; about a minute,
//! guarded by a file lock so parallel test processes install it once). Users are registered
//! with Synapse's own `register_new_matrix_user` through the shared secret. The server is
//! killed and its directory removed when the test process ends, however it ends (a
//! watchdog on its pid file).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::postgres::tail;
use crate::watchdog::Watchdog;

/// The Synapse release the tests install (pinned: a newer one may change defaults).
pub const SYNAPSE_VERSION: &str = "1.163.2";

/// A Python interpreter that already imports `synapse`; when set nothing is installed.
pub const SYNAPSE_PYTHON_ENV: &str = "XAGENT_SYNAPSE_PYTHON";

/// The homeserver's name (`@user:localhost`).
pub const SERVER_NAME: &str = "localhost";

/// Why no test homeserver could be had.
#[derive(Clone, Debug, thiserror::Error)]
#[error("no Synapse for the tests: {0}")]
pub struct TestSynapseError(String);

/// A registered account on the test homeserver.
#[derive(Clone, Debug)]
pub struct TestUser {
    /// `@name:localhost`.
    pub user_id: String,
    /// The local part.
    pub localpart: String,
    /// Its password.
    pub password: String,
}

/// A running Synapse.
#[derive(Debug)]
pub struct TestSynapse {
    python: PathBuf,
    dir: PathBuf,
    port: u16,
    process: Mutex<Option<std::process::Child>>,
    watchdog: Mutex<Option<Watchdog>>,
}

static SHARED: OnceLock<Result<TestSynapse, TestSynapseError>> = OnceLock::new();
static USERS: AtomicU64 = AtomicU64::new(0);

impl TestSynapse {
    /// The homeserver of this test process, started by the first caller; panics with what is
    /// missing when none can be had.
    pub async fn shared() -> &'static TestSynapse {
        let shared = tokio::task::spawn_blocking(|| SHARED.get_or_init(Self::start_new))
            .await
            .unwrap_or_else(|e| panic!("the Synapse starting thread failed: {e}"));
        match shared {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// A homeserver of the caller's own, killed when dropped (for tests that stop it).
    pub async fn dedicated() -> Result<TestSynapse, TestSynapseError> {
        tokio::task::spawn_blocking(Self::start_new)
            .await
            .map_err(|e| TestSynapseError(format!("the starting thread failed: {e}")))?
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's log so far (its last 20,000 bytes), for failure messages.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("homeserver.log")).unwrap_or_default();
        tail(&text, 20_000).to_string()
    }

    /// Registers a new ordinary user whose local part starts with `prefix` (made unique).
    pub async fn register(&self, prefix: &str) -> TestUser {
        let n = USERS.fetch_add(1, Ordering::Relaxed);
        let localpart = format!("{prefix}{}x{n}", std::process::id());
        let password = format!("pw-{localpart}-{:x}", rand_u64());
        let mut cmd = Command::new(&self.python);
        cmd.arg("-m")
            .arg("synapse._scripts.register_new_matrix_user")
            .arg("-c")
            .arg(self.dir.join("homeserver.yaml"))
            .args(["-u", &localpart, "-p", &password, "--no-admin"])
            .arg(self.url());
        let result = tokio::task::spawn_blocking(move || run(cmd, "register_new_matrix_user"))
            .await
            .unwrap_or_else(|e| Err(TestSynapseError(e.to_string())));
        if let Err(e) = result {
            panic!("{e}\n{}", self.log());
        }
        TestUser { user_id: format!("@{localpart}:{SERVER_NAME}"), localpart, password }
    }

    /// Kills the server (SIGKILL: like a crash or a cut network); [`TestSynapse::start`]
    /// brings it back on the same port and database.
    pub async fn stop(&self) {
        let child = self.process.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = tokio::task::spawn_blocking(move || child.wait()).await;
        }
    }

    /// Starts a stopped server again.
    pub async fn start(&self) -> Result<(), TestSynapseError> {
        let python = self.python.clone();
        let dir = self.dir.clone();
        let port = self.port;
        let child = tokio::task::spawn_blocking(move || launch(&python, &dir, port))
            .await
            .map_err(|e| TestSynapseError(e.to_string()))??;
        *self.process.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        Ok(())
    }

    fn start_new() -> Result<TestSynapse, TestSynapseError> {
        let python = python()?;
        let dir = tempfile::Builder::new()
            .prefix("xagent-synapse-")
            .tempdir()
            .map_err(|e| TestSynapseError(format!("create a temporary directory: {e}")))?
            .keep();
        // Kills whatever pid the file names (it changes when the server is restarted).
        let mut cleanup = Command::new("sh");
        cleanup.arg("-c").arg(format!(
            "kill -9 \"$(cat '{}/homeserver.pid' 2>/dev/null)\" 2>/dev/null; true",
            dir.display()
        ));
        let watchdog = Watchdog::arm(&cleanup, Some(&dir))
            .map_err(|e| TestSynapseError(format!("arm the cleanup: {e}")))?;
        let mut generate = Command::new(&python);
        generate
            .args(["-m", "synapse.app.homeserver", "--server-name", SERVER_NAME])
            .arg("--config-path")
            .arg(dir.join("generated.yaml"))
            .arg("--data-directory")
            .arg(&dir)
            .args(["--generate-config", "--report-stats=no"])
            .current_dir(&dir);
        run(generate, "synapse --generate-config")?;
        let mut last = String::new();
        for _ in 0..5 {
            let port = crate::postgres::free_port()
                .map_err(|e| TestSynapseError(format!("find a free port: {e}")))?;
            write_config(&dir, port)?;
            match launch(&python, &dir, port) {
                Ok(child) => {
                    return Ok(TestSynapse {
                        python,
                        dir,
                        port,
                        process: Mutex::new(Some(child)),
                        watchdog: Mutex::new(Some(watchdog)),
                    });
                }
                Err(e) => last = e.to_string(),
            }
        }
        watchdog.fire();
        Err(TestSynapseError(format!("the server did not start: {last}")))
    }
}

impl Drop for TestSynapse {
    fn drop(&mut self) {
        if let Some(mut child) = self.process.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(watchdog) = self.watchdog.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            watchdog.fire();
        }
    }
}

/// Our configuration over the generated one (whose secrets and signing key are kept): one
/// client listener on `port`, no federation, no outside key servers, authenticated media,
/// and message rates a chatty test needs (the defaults allow one message per 5 s).
fn write_config(dir: &Path, port: u16) -> Result<(), TestSynapseError> {
    let generated = std::fs::read_to_string(dir.join("generated.yaml"))
        .map_err(|e| TestSynapseError(format!("read the generated configuration: {e}")))?;
    let secret = |name: &str| {
        generated
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .map(str::to_string)
            .ok_or_else(|| TestSynapseError(format!("the generated configuration has no {name}")))
    };
    let d = dir.display();
    let config = format!(
        "server_name: \"{SERVER_NAME}\"\n\
         pid_file: {d}/homeserver.pid\n\
         listeners:\n  - port: {port}\n    bind_addresses: ['127.0.0.1']\n    type: http\n    \
         tls: false\n    x_forwarded: false\n    resources:\n      - names: [client]\n        \
         compress: false\n\
         database:\n  name: sqlite3\n  args:\n    database: {d}/homeserver.db\n\
         log_config: {d}/log.config\n\
         media_store_path: {d}/media_store\n\
         registration_shared_secret: {}\n\
         macaroon_secret_key: {}\n\
         form_secret: {}\n\
         signing_key_path: {d}/{SERVER_NAME}.signing.key\n\
         report_stats: false\n\
         trusted_key_servers: []\n\
         suppress_key_server_warning: true\n\
         enable_authenticated_media: true\n\
         rc_message:\n  per_second: 50\n  burst_count: 200\n\
         rc_login:\n  address:\n    per_second: 50\n    burst_count: 200\n  account:\n    \
         per_second: 50\n    burst_count: 200\n  failed_attempts:\n    per_second: 50\n    \
         burst_count: 200\n\
         rc_joins:\n  local:\n    per_second: 50\n    burst_count: 200\n\
         rc_invites:\n  per_room:\n    per_second: 50\n    burst_count: 200\n  per_user:\n    \
         per_second: 50\n    burst_count: 200\n\
         rc_room_creation:\n  per_second: 50\n  burst_count: 200\n",
        secret("registration_shared_secret")?,
        secret("macaroon_secret_key")?,
        secret("form_secret")?,
    );
    let log_config = format!(
        "version: 1\nformatters:\n  plain:\n    format: '%(asctime)s %(levelname)s %(name)s %(message)s'\n\
         handlers:\n  file:\n    class: logging.FileHandler\n    filename: {d}/homeserver.log\n    \
         formatter: plain\nroot:\n  level: INFO\n  handlers: [file]\ndisable_existing_loggers: false\n"
    );
    std::fs::write(dir.join("homeserver.yaml"), config)
        .and_then(|()| std::fs::write(dir.join("log.config"), log_config))
        .map_err(|e| TestSynapseError(format!("write the configuration: {e}")))
}

/// Starts the server and waits (up to 60 s) until its client API answers.
fn launch(python: &Path, dir: &Path, port: u16) -> Result<std::process::Child, TestSynapseError> {
    let stderr = std::fs::File::create(dir.join("stderr.log"))
        .map_err(|e| TestSynapseError(format!("create stderr.log: {e}")))?;
    let mut child = Command::new(python)
        .args(["-m", "synapse.app.homeserver", "-c"])
        .arg(dir.join("homeserver.yaml"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| TestSynapseError(format!("start synapse: {e}")))?;
    // The watchdog kills the pid this file names. Synapse writes its `pid_file` only when it
    // daemonizes, so without this line every shared server outlived its test process.
    if let Err(e) = std::fs::write(dir.join("homeserver.pid"), child.id().to_string()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(TestSynapseError(format!("write homeserver.pid: {e}")));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let probe = format!("GET /_matrix/client/versions HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
            return Err(TestSynapseError(format!(
                "synapse exited ({status}): {}",
                tail(&log, 3000)
            )));
        }
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            if stream.write_all(probe.as_bytes()).is_ok() {
                let mut answer = String::new();
                let _ = std::io::Read::read_to_string(&mut stream, &mut answer);
                if answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
                    return Ok(child);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(TestSynapseError("synapse did not answer within 60 s".into()))
}

/// The Python that runs Synapse: `XAGENT_SYNAPSE_PYTHON`, or the workspace's venv (created
/// and filled on first use, under a file lock).
fn python() -> Result<PathBuf, TestSynapseError> {
    if let Some(python) = std::env::var_os(SYNAPSE_PYTHON_ENV) {
        return Ok(PathBuf::from(python));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("target")
    });
    std::fs::create_dir_all(&target)
        .map_err(|e| TestSynapseError(format!("create {}: {e}", target.display())))?;
    let venv = target.join("synapse-venv");
    let python = venv.join("bin").join("python");
    let stamp = venv.join(format!("installed-{SYNAPSE_VERSION}"));
    let lock = std::fs::File::create(target.join("synapse-venv.lock"))
        .map_err(|e| TestSynapseError(format!("create the install lock: {e}")))?;
    lock.lock().map_err(|e| TestSynapseError(format!("take the install lock: {e}")))?;
    if !stamp.exists() {
        let mut create = Command::new("python3");
        create.args(["-m", "venv"]).arg(&venv);
        run(create, "python3 -m venv (install python3-venv)")?;
        let mut install = Command::new(&python);
        install
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("matrix-synapse=={SYNAPSE_VERSION}"));
        run(install, "pip install matrix-synapse")?;
        std::fs::write(&stamp, b"")
            .map_err(|e| TestSynapseError(format!("write {}: {e}", stamp.display())))?;
    }
    Ok(python)
}

fn run(cmd: Command, what: &str) -> Result<(), TestSynapseError> {
    crate::postgres::run_command(cmd, what).map_err(TestSynapseError)
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish()
}
