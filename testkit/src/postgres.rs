//! A real PostgreSQL for tests: Debian's server binaries (`initdb`, `pg_ctl`) started in a
//! temporary directory on a free 127.0.0.1 port, once per test process, or the server named
//! by `XAGENT_TEST_DATABASE_URL` (then nothing is started). Every test takes its own empty
//! database with [`TestPostgres::fresh_database`].
//!
//! As root the server runs as `nobody` (PostgreSQL refuses root) through `runuser`. The
//! server stops when the test process ends, however it ends: a watchdog process (in its own
//! session) waits for the end of a pipe that only this process holds open, then runs
//! `pg_ctl stop -m immediate` and removes the directory. `fsync` stays on (benchmarks need
//! real commits); only `initdb` runs with `--no-sync`.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use xagent_storage_postgres::{DatabaseUrl, PoolOptions, connect_unpooled};

use crate::watchdog::Watchdog;

/// The environment variable naming an existing server for the tests (a URL whose user may
/// create databases); when set, no server is started.
pub const DATABASE_URL_ENV: &str = "XAGENT_TEST_DATABASE_URL";

/// Connections the test server accepts (many pools of many tests at once).
const MAX_CONNECTIONS: u32 = 300;

/// Why no test server could be had.
#[derive(Clone, Debug, thiserror::Error)]
#[error("no PostgreSQL for the tests: {0}")]
pub struct TestPostgresError(String);

/// A PostgreSQL server the tests may create databases on.
#[derive(Debug)]
pub struct TestPostgres {
    admin: DatabaseUrl,
    server: Option<Server>,
}

static SHARED: OnceLock<Result<TestPostgres, TestPostgresError>> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(0);

impl TestPostgres {
    /// The server of this test process, started by the first caller (about 4 s); every
    /// thread and runtime of the process shares it. Panics with what to install when there
    /// is none (use [`TestPostgres::try_shared`] to handle that).
    pub async fn shared() -> &'static TestPostgres {
        match Self::try_shared().await {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`TestPostgres::shared`], with the reason when no server can be had.
    pub async fn try_shared() -> Result<&'static TestPostgres, TestPostgresError> {
        // Started on a blocking thread: the first caller's runtime keeps running, and
        // callers on other threads wait in `get_or_init` until it is up.
        let shared = tokio::task::spawn_blocking(|| SHARED.get_or_init(Self::from_env_or_start))
            .await
            .map_err(|e| TestPostgresError(format!("the starting thread failed: {e}")))?;
        shared.as_ref().map_err(Clone::clone)
    }

    /// A server of the caller's own (not shared), stopped when dropped: for tests that stop
    /// or restart the database ([`TestPostgres::stop`], [`TestPostgres::start`]). Ignores
    /// `XAGENT_TEST_DATABASE_URL`.
    pub async fn dedicated() -> Result<TestPostgres, TestPostgresError> {
        tokio::task::spawn_blocking(|| Self::start_server(false))
            .await
            .map_err(|e| TestPostgresError(format!("the starting thread failed: {e}")))?
    }

    /// A dedicated server that also accepts TLS, with a certificate for `127.0.0.1` and
    /// `localhost` signed by a CA made for it ([`TestPostgres::tls_root_cert`]); plain
    /// connections are still accepted. Needs the `openssl` command.
    pub async fn dedicated_with_tls() -> Result<TestPostgres, TestPostgresError> {
        tokio::task::spawn_blocking(|| Self::start_server(true))
            .await
            .map_err(|e| TestPostgresError(format!("the starting thread failed: {e}")))?
    }

    /// The PEM file of the CA that signed the server's certificate (a TLS server only).
    pub fn tls_root_cert(&self) -> Option<PathBuf> {
        self.server.as_ref().filter(|s| s.tls).map(|s| s.dir.join("ca.pem"))
    }

    fn from_env_or_start() -> Result<TestPostgres, TestPostgresError> {
        match std::env::var(DATABASE_URL_ENV) {
            Ok(text) if !text.trim().is_empty() => {
                let admin = DatabaseUrl::parse(&text)
                    .map_err(|e| TestPostgresError(format!("{DATABASE_URL_ENV}: {e}")))?;
                Ok(TestPostgres { admin, server: None })
            }
            _ => Self::start_server(false),
        }
    }

    fn start_server(tls: bool) -> Result<TestPostgres, TestPostgresError> {
        let server = Server::start(tls)?;
        let admin =
            DatabaseUrl::parse(&format!("postgres://postgres@127.0.0.1:{}/postgres", server.port))
                .map_err(|e| TestPostgresError(e.to_string()))?;
        Ok(TestPostgres { admin, server: Some(server) })
    }

    /// The URL of the server's maintenance database (`postgres`), as superuser.
    pub fn admin_url(&self) -> &DatabaseUrl {
        &self.admin
    }

    /// Whether this server was started here (not `XAGENT_TEST_DATABASE_URL`'s).
    pub fn is_local(&self) -> bool {
        self.server.is_some()
    }

    /// Creates a new empty database with a unique name and returns its URL.
    pub async fn fresh_database(&self) -> DatabaseUrl {
        match self.try_fresh_database().await {
            Ok(url) => url,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`TestPostgres::fresh_database`], with the reason when it cannot be created.
    pub async fn try_fresh_database(&self) -> Result<DatabaseUrl, TestPostgresError> {
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let name = format!(
            "xagent_test_{}_{}_{}",
            std::process::id(),
            stamp.as_millis() % 1_000_000_000,
            DATABASES.fetch_add(1, Ordering::Relaxed)
        );
        let fail = |e: &dyn std::fmt::Display| TestPostgresError(format!("create {name}: {e}"));
        let (client, connection) =
            connect_unpooled(&self.admin, &PoolOptions::default()).await.map_err(|e| fail(&e))?;
        let driver = tokio::spawn(connection.run());
        // template0: no session is ever connected to it, so creations never collide.
        let created = client
            .batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0"))
            .await
            .map_err(|e| fail(&self.admin.scrub(&e.to_string())));
        drop(client);
        let _ = driver.await;
        created?;
        self.admin.with_database(&name).map_err(|e| fail(&e))
    }

    /// Stops a server started here at once (`pg_ctl stop -m immediate`): connections break,
    /// new ones are refused, until [`TestPostgres::start`]. Not for the shared server.
    pub async fn stop(&self) -> Result<(), TestPostgresError> {
        let server = self.own_server("stop")?;
        let cmd = server.pg_ctl(&["stop", "-m", "immediate", "-w"]);
        tokio::task::spawn_blocking(move || run(cmd, "pg_ctl stop"))
            .await
            .map_err(|e| TestPostgresError(e.to_string()))?
    }

    /// Starts a stopped server again on the same port and data.
    pub async fn start(&self) -> Result<(), TestPostgresError> {
        let server = self.own_server("start")?;
        let cmd = server.pg_ctl_start();
        tokio::task::spawn_blocking(move || run(cmd, "pg_ctl start"))
            .await
            .map_err(|e| TestPostgresError(e.to_string()))?
    }

    fn own_server(&self, what: &str) -> Result<&Server, TestPostgresError> {
        let server = self
            .server
            .as_ref()
            .ok_or_else(|| TestPostgresError(format!("cannot {what} a server not started here")))?;
        if SHARED.get().and_then(|s| s.as_ref().ok()).is_some_and(|s| std::ptr::eq(s, self)) {
            return Err(TestPostgresError(format!(
                "cannot {what} the shared server: take TestPostgres::dedicated()"
            )));
        }
        Ok(server)
    }
}

/// A server started from Debian's binaries.
#[derive(Debug)]
struct Server {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Run the binaries as `nobody` (this process is root).
    as_nobody: bool,
    /// Whether the server also accepts TLS (certificates in `dir`).
    tls: bool,
    /// Stops the server and removes `dir` when this process ends.
    watchdog: Option<Watchdog>,
}

impl Server {
    fn start(tls: bool) -> Result<Server, TestPostgresError> {
        let bin = find_bin_dir()?;
        let fail =
            |what: &str, e: &dyn std::fmt::Display| TestPostgresError(format!("{what}: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("xagent-pg-")
            .tempdir()
            .map_err(|e| fail("create a temporary directory", &e))?
            .keep();
        let as_nobody =
            std::fs::metadata(&dir).map_err(|e| fail("read the temporary directory", &e))?.uid()
                == 0;
        if as_nobody {
            let (uid, gid) = nobody_ids()?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| fail("hand the temporary directory to nobody", &e))?;
        }
        let mut server = Server { bin, dir, port: 0, as_nobody, tls, watchdog: None };
        // From here on the watchdog removes the directory, whatever happens next.
        server.spawn_watchdog()?;
        let data = server.dir.join("data");
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        run(initdb, "initdb")?;
        let mut settings = format!(
            "\n# xagent testkit\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             max_connections = {MAX_CONNECTIONS}\nfsync = on\nsynchronous_commit = on\n",
            server.dir.display()
        );
        if tls {
            server.make_certificates()?;
            settings.push_str(&format!(
                "ssl = on\nssl_cert_file = '{0}/server.pem'\nssl_key_file = '{0}/server.key'\n",
                server.dir.display()
            ));
        }
        let conf = data.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(|e| fail("read postgresql.conf", &e))?;
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| fail("write postgresql.conf", &e))?;
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port().map_err(|e| fail("find a free port", &e))?;
            match run(server.pg_ctl_start(), "pg_ctl start") {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let log =
                        std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default();
                    last = format!("{e}\n{}", tail(&log, 2000));
                    // Another process took the port between the probe and the start: retry.
                    if !log.contains("could not bind") && !log.contains("already in use") {
                        break;
                    }
                }
            }
        }
        Err(TestPostgresError(format!("the server did not start: {last}")))
    }

    /// A CA and a server certificate for 127.0.0.1 and localhost signed by it, with the
    /// `openssl` command; the key is made the server's own (PostgreSQL checks its mode).
    fn make_certificates(&self) -> Result<(), TestPostgresError> {
        let openssl = |args: &[&str]| {
            let mut cmd = Command::new("openssl");
            cmd.args(args).current_dir(&self.dir);
            run(cmd, "openssl")
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=xagent test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&ca)?;
        let mut request = vec!["req"];
        request.extend(ec);
        request.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
        openssl(&request)?;
        let extensions = "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
                          keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n";
        std::fs::write(self.dir.join("server.ext"), extensions)
            .map_err(|e| TestPostgresError(format!("write server.ext: {e}")))?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ])?;
        let key = self.dir.join("server.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| TestPostgresError(format!("protect server.key: {e}")))?;
        if self.as_nobody {
            let (uid, gid) = nobody_ids()?;
            for file in ["server.key", "server.pem"] {
                std::os::unix::fs::chown(self.dir.join(file), Some(uid), Some(gid))
                    .map_err(|e| TestPostgresError(format!("hand {file} to nobody: {e}")))?;
            }
        }
        Ok(())
    }

    /// A command for one of the server binaries, as `nobody` when this process is root.
    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut cmd = if self.as_nobody {
            let mut cmd = Command::new(runuser());
            cmd.args(["-u", "nobody", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        };
        // The caller's directory may be closed to `nobody`.
        cmd.current_dir(&self.dir);
        cmd
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(self.dir.join("data")).args(args);
        cmd
    }

    fn pg_ctl_start(&self) -> Command {
        let mut cmd = self.pg_ctl(&["-w", "-t", "60", "-l"]);
        cmd.arg(self.dir.join("server.log"))
            .arg("-o")
            .arg(format!("-p {}", self.port))
            .arg("start");
        cmd
    }

    /// Arms the watchdog that stops the server and removes its directory once this process
    /// ends (at exit, crash or kill -9 alike).
    fn spawn_watchdog(&mut self) -> Result<(), TestPostgresError> {
        let stop = self.pg_ctl(&["stop", "-m", "immediate"]);
        let watchdog = Watchdog::arm(&stop, Some(&self.dir))
            .map_err(|e| TestPostgresError(format!("start the server's watchdog: {e}")))?;
        self.watchdog = Some(watchdog);
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A dedicated server: stop it now, then let the watchdog remove the directory.
        let _ = run(self.pg_ctl(&["stop", "-m", "immediate", "-w"]), "pg_ctl stop");
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.fire();
        }
    }
}

/// Runs a command to its end; its output becomes the error when it fails.
fn run(cmd: Command, what: &str) -> Result<(), TestPostgresError> {
    run_command(cmd, what).map_err(TestPostgresError)
}

/// Runs `cmd` to its end; on failure, what failed with the ends of its output.
pub(crate) fn run_command(mut cmd: Command, what: &str) -> Result<(), String> {
    let output =
        cmd.stdin(Stdio::null()).output().map_err(|e| format!("{what} could not run: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}): {}{}",
        output.status,
        tail(&String::from_utf8_lossy(&output.stdout), 1000),
        tail(&String::from_utf8_lossy(&output.stderr), 2000)
    ))
}

/// The last `max` bytes of `text` (on a character boundary).
pub(crate) fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The newest `/usr/lib/postgresql/VERSION/bin` holding `initdb` and `pg_ctl`.
fn find_bin_dir() -> Result<PathBuf, TestPostgresError> {
    find_bin_dir_in(Path::new("/usr/lib/postgresql"))
}

fn find_bin_dir_in(root: &Path) -> Result<PathBuf, TestPostgresError> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.split('.').next()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        TestPostgresError(format!(
            "PostgreSQL's server binaries (initdb, pg_ctl) are not under {}/*/bin: install \
             Debian's postgresql package (apt-get install postgresql), or set {DATABASE_URL_ENV} \
             to a server whose user may create databases",
            root.display()
        ))
    })
}

fn runuser() -> &'static str {
    if Path::new("/usr/sbin/runuser").exists() { "/usr/sbin/runuser" } else { "runuser" }
}

/// The uid and gid of `nobody`, from /etc/passwd.
fn nobody_ids() -> Result<(u32, u32), TestPostgresError> {
    let mut text = String::new();
    std::fs::File::open("/etc/passwd")
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| TestPostgresError(format!("read /etc/passwd: {e}")))?;
    text.lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            (fields.next()? == "nobody").then_some(())?;
            let _password = fields.next()?;
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .ok_or_else(|| {
            TestPostgresError(
                "running as root, but there is no user `nobody` to run PostgreSQL as".into(),
            )
        })
}

/// A port free on 127.0.0.1 right now.
pub(crate) fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_say_what_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let err = find_bin_dir_in(empty.path()).unwrap_err().to_string();
        assert!(err.contains("install Debian's postgresql package"), "{err}");
        assert!(err.contains(DATABASE_URL_ENV), "{err}");
    }

    #[test]
    fn the_newest_version_with_both_binaries_is_chosen() {
        let root = tempfile::tempdir().unwrap();
        for (version, tools) in [
            ("13", &["initdb", "pg_ctl"][..]),
            ("15", &["initdb", "pg_ctl"][..]),
            ("16", &["initdb"][..]),
        ] {
            let bin = root.path().join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            for tool in tools {
                std::fs::write(bin.join(tool), "").unwrap();
            }
        }
        assert_eq!(find_bin_dir_in(root.path()).unwrap(), root.path().join("15").join("bin"));
    }
}
