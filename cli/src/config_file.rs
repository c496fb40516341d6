//! `--config FILE` of the server subcommands: a TOML file whose keys are the subcommand's
//! flag names (`state-dir = "/var/lib/webchat"`, `trusted-proxy = ["10.0.0.0/8"]`,
//! `max-upload-bytes = 10485760`). The file is read before clap parses the command line and
//! becomes flags for exactly the settings the command line and the environment leave open,
//! which gives the precedence flag > environment > file > default with clap's own parsing.
//! Every value is checked by its flag's parser first, so a wrong type or value is reported
//! with the file and the key. Secrets are never read from the file: their keys are refused
//! with the environment variable or `*-file` flag to use instead.

use std::ffi::OsString;
use std::path::Path;

/// The subcommands that take `--config`.
#[cfg(feature = "matrix")]
pub(crate) const CONFIGURABLE: &[&str] = &["webchat", "homie", "matrix", "mcp"];
/// The subcommands that take `--config` (im.matrix is not in this build).
#[cfg(not(feature = "matrix"))]
pub(crate) const CONFIGURABLE: &[&str] = &["webchat", "homie", "mcp"];

/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Keys that hold secrets though their flag has no hidden environment value.
const SECRET_KEYS: &[&str] = &["pairing-code"];

/// The `--config` flag of a configurable subcommand (flattened into its arguments).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConfigArgs {
    /// Read settings from this TOML file: each key is a flag's name without the dashes
    /// (`state-dir = "/var/lib/xagent"`). Flags and environment variables win over the file;
    /// secrets are never read from it. Examples: docs/<subcommand>.example.toml.
    #[arg(long = "config", value_name = "FILE")]
    pub(crate) file: Option<std::path::PathBuf>,
}

/// `--log-format` of the long-running subcommands.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LogArgs {
    /// Log lines as `text` (the default) or `json`: one object a line with the packet type,
    /// request_id and connector_channel_id of the packet being handled, for a log collector.
    #[arg(long = "log-format", value_name = "FORMAT", default_value = "text",
          env = xagent_server_runtime::ops::ENV_LOG_FORMAT,
          value_parser = |text: &str| text.parse::<xagent_server_runtime::ops::LogFormat>())]
    pub(crate) format: xagent_server_runtime::ops::LogFormat,
}

impl LogArgs {
    /// Installs the logger on stderr: `RUST_LOG` when set, else `default_filter`.
    pub(crate) fn init(&self, default_filter: &str) {
        xagent_server_runtime::ops::init_logging(default_filter, self.format);
    }
}

impl ConfigArgs {
    /// Logs which file the settings came from (after the logger is up).
    pub(crate) fn announce(&self) {
        if let Some(file) = &self.file {
            tracing::info!(file = %file.display(), "settings read from the configuration file");
        }
    }
}

/// Expands a configurable subcommand's `--config FILE` into flags, for `cli` (the whole
/// command tree). Arguments without one come back unchanged.
pub(crate) fn expand(args: Vec<OsString>, cli: &clap::Command) -> Result<Vec<OsString>, String> {
    let Some(name) = args.get(1).and_then(|a| a.to_str()).map(str::to_owned) else {
        return Ok(args);
    };
    if !CONFIGURABLE.contains(&name.as_str()) {
        return Ok(args);
    }
    let Some(sub) = cli.find_subcommand(&name) else { return Ok(args) };
    let Some(file) = config_path(&args[2..])? else { return Ok(args) };
    let table = read(&file)?;
    let given = given_flags(&args[2..]);
    let mut injected = Vec::new();
    for (key, value) in &table {
        injected.extend(flags_for(sub, &name, &file, key, value, &given)?);
    }
    let mut out = args[..2].to_vec();
    out.extend(injected);
    out.extend_from_slice(&args[2..]);
    Ok(out)
}

/// The `--config` value among a subcommand's arguments.
fn config_path(args: &[OsString]) -> Result<Option<std::path::PathBuf>, String> {
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        let value = if text == "--config" {
            Some(iter.next().cloned().ok_or("--config needs a FILE")?)
        } else {
            text.strip_prefix("--config=").map(OsString::from)
        };
        if let Some(value) = value {
            if found.is_some() {
                return Err("--config is given twice; name one file".into());
            }
            found = Some(std::path::PathBuf::from(value));
        }
    }
    Ok(found)
}

/// The long flags given on the command line (`--name` and `--name=value`).
fn given_flags(args: &[OsString]) -> Vec<String> {
    args.iter()
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect()
}

fn read(file: &Path) -> Result<toml::Table, String> {
    let shown = file.display();
    let size = std::fs::metadata(file)
        .map_err(|e| format!("the configuration file {shown} cannot be read: {e}"))?
        .len();
    if size > MAX_CONFIG_BYTES {
        return Err(format!(
            "the configuration file {shown} is {size} bytes; at most {MAX_CONFIG_BYTES} are read"
        ));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("the configuration file {shown} cannot be read: {e}"))?;
    text.parse::<toml::Table>().map_err(|e| format!("{shown} is not valid TOML: {e}"))
}

/// The flags one key of the file becomes: none when the command line or the environment
/// already set it.
fn flags_for(
    sub: &clap::Command,
    command: &str,
    file: &Path,
    key: &str,
    value: &toml::Value,
    given: &[String],
) -> Result<Vec<OsString>, String> {
    let shown = file.display();
    let flag = key.replace('_', "-");
    let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(flag.as_str())) else {
        return Err(format!(
            "{shown}: unknown key `{key}`: `xagent-connector {command} --help` lists the settings (a key is a flag's name without the dashes)"
        ));
    };
    if flag == "config" {
        return Err(format!("{shown}: `config` cannot name another file"));
    }
    if arg.is_hide_env_values_set() || SECRET_KEYS.contains(&flag.as_str()) {
        let mut instead = Vec::new();
        if let Some(env) = arg.get_env() {
            instead.push(format!("the environment variable {}", env.to_string_lossy()));
        }
        let file_flag = format!("{flag}-file");
        let sibling = if flag == "pairing-code" { "pairing-file".to_owned() } else { file_flag };
        if sub.get_arguments().any(|a| a.get_long() == Some(sibling.as_str())) {
            instead.push(format!("the key `{sibling}` (a file only you can read)"));
        }
        return Err(format!(
            "{shown}: `{key}` is a secret and is never read from the configuration file: use {}",
            if instead.is_empty() { "its flag".to_owned() } else { instead.join(" or ") }
        ));
    }
    if given.contains(&flag) {
        return Ok(Vec::new());
    }
    if let Some(env) = arg.get_env()
        && std::env::var_os(env).is_some_and(|v| !v.is_empty())
    {
        return Ok(Vec::new());
    }
    if matches!(arg.get_action(), clap::ArgAction::SetTrue | clap::ArgAction::SetFalse) {
        return match value {
            toml::Value::Boolean(true) => Ok(vec![OsString::from(format!("--{flag}"))]),
            toml::Value::Boolean(false) => Ok(Vec::new()),
            _ => Err(format!("{shown}: key `{key}` is a switch: true or false")),
        };
    }
    let many = matches!(arg.get_action(), clap::ArgAction::Append);
    let values: Vec<&toml::Value> = match value {
        toml::Value::Array(items) if many => items.iter().collect(),
        toml::Value::Array(_) => {
            return Err(format!("{shown}: key `{key}` takes one value, not a list"));
        }
        other => vec![other],
    };
    let mut flags = Vec::new();
    for item in values {
        let text = match item {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            toml::Value::Array(_) | toml::Value::Table(_) => {
                return Err(format!("{shown}: key `{key}` takes a string or a number here"));
            }
        };
        // The flag's own parser judges the value: clap on a command of this one flag.
        let probe = clap::Command::new("setting")
            .no_binary_name(true)
            .disable_help_flag(true)
            .disable_version_flag(true)
            .arg(arg.clone().required(false));
        if let Err(e) = probe.try_get_matches_from([format!("--{flag}={text}")]) {
            let reason = e.to_string();
            let reason = reason.lines().next().unwrap_or_default();
            let reason = reason.strip_prefix("error: ").unwrap_or(reason);
            return Err(format!("{shown}: key `{key}`: {reason}"));
        }
        flags.push(OsString::from(format!("--{flag}={text}")));
    }
    Ok(flags)
}

#[cfg(test)]
/// A commented example file for `command`: every key with its help and default (commented
/// out), the required ones set, the secret ones named with where they come from instead.
pub(crate) fn example(sub: &clap::Command, command: &str) -> String {
    let mut out = format!(
        "# Settings of `xagent-connector {command}`: start it with\n\
         #   xagent-connector {command} --config docs/{command}.example.toml\n\
         # Each key is a flag's name without the dashes; flags and environment variables win\n\
         # over this file, and the file wins over the defaults shown. Secrets never go in\n\
         # here: each secret's key below says where it comes from instead.\n\
         # (Generated from the command's flags; `cargo test -p xagent-cli config_file` checks it.)\n"
    );
    for arg in sub.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version" | "config") {
            continue;
        }
        out.push('\n');
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        for line in wrap(&help, 92) {
            out.push_str(&format!("# {line}\n"));
        }
        if arg.is_hide_env_values_set() || SECRET_KEYS.contains(&long) {
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let from = env.map_or_else(|| "its *-file key".to_owned(), |e| format!("${e}"));
            out.push_str(&format!("# {long}: a secret, not read from this file (use {from})\n"));
            continue;
        }
        if let Some(env) = arg.get_env() {
            out.push_str(&format!("# (environment: {})\n", env.to_string_lossy()));
        }
        let many = matches!(arg.get_action(), clap::ArgAction::Append);
        let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        if let Some(value) = required_example(command, long) {
            out.push_str(&format!("{long} = {}\n", toml_literal(value)));
        } else if switch {
            out.push_str(&format!("# {long} = false\n"));
        } else if many {
            let name = arg.get_value_names().and_then(|n| n.first()).map(|n| n.to_string());
            out.push_str(&format!("# {long} = [\"{}\"]\n", name.unwrap_or_default()));
        } else if let Some(default) = defaults.first() {
            out.push_str(&format!("# {long} = {}\n", toml_literal(default)));
        } else {
            let name = arg.get_value_names().and_then(|n| n.first()).map(|n| n.to_string());
            out.push_str(&format!("# {long} = \"{}\"\n", name.unwrap_or_default()));
        }
    }
    out
}

#[cfg(test)]
/// Values for the example's required keys: enough for the example to start as it is
/// (webchat, homie) or to show the shape (matrix, mcp).
fn required_example(command: &str, key: &str) -> Option<&'static str> {
    match (command, key) {
        ("webchat", "state-dir") => Some("webchat-state"),
        ("homie", "state-dir") => Some("homie-state"),
        ("homie", "mqtt-url") => Some("mqtt://127.0.0.1:1883"),
        ("matrix", "state-dir") => Some("matrix-state"),
        ("matrix", "homeserver") => Some("https://matrix.example.org"),
        ("matrix", "user") => Some("@agent-bot:example.org"),
        ("mcp", "base-url") => Some("http://127.0.0.1:8080"),
        _ => None,
    }
}

#[cfg(test)]
/// A TOML literal for a flag's default: a number or a boolean as it is, else a string.
fn toml_literal(value: &str) -> String {
    if value.parse::<i64>().is_ok() || value == "true" || value == "false" {
        value.to_owned()
    } else {
        toml::Value::String(value.to_owned()).to_string()
    }
}

#[cfg(test)]
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn cli() -> clap::Command {
        crate::Cli::command()
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("settings.toml");
        std::fs::write(&path, text).expect("write");
        (dir, path)
    }

    fn expanded(text: &str, extra: &[&str]) -> Result<Vec<String>, String> {
        let (_dir, path) = file(text);
        let mut args = os(&["xagent-connector", "webchat", "--config"]);
        args.push(path.into_os_string());
        args.extend(os(extra));
        expand(args, &cli()).map(|a| a.iter().map(|s| s.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn keys_become_flags_and_the_command_line_wins() {
        let text = "state-dir = \"/srv/chat\"\nmax_upload_bytes = 2048\ntrusted-proxy = [\"10.0.0.0/8\", \"::1\"]\n";
        let args = expanded(text, &[]).expect("expands");
        for want in [
            "--state-dir=/srv/chat",
            "--max-upload-bytes=2048",
            "--trusted-proxy=10.0.0.0/8",
            "--trusted-proxy=::1",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let args = expanded(text, &["--state-dir", "/elsewhere"]).expect("expands");
        assert!(!args.iter().any(|a| a == "--state-dir=/srv/chat"), "the flag wins: {args:?}");
        let parsed = crate::Cli::try_parse_from(expanded(text, &[]).expect("expands"));
        assert!(parsed.is_ok(), "clap takes the expansion: {parsed:?}");
    }

    #[test]
    fn unknown_keys_wrong_types_and_bad_values_name_the_file_and_the_key() {
        let error = expanded("stat-dir = \"/x\"\n", &[]).expect_err("unknown");
        assert!(
            error.contains("settings.toml") && error.contains("unknown key `stat-dir`"),
            "{error}"
        );
        let error = expanded("max-upload-bytes = \"lots\"\n", &[]).expect_err("type");
        assert!(error.contains("key `max-upload-bytes`") && error.contains("lots"), "{error}");
        let error = expanded("listen = [\"a\", \"b\"]\n", &[]).expect_err("list");
        assert!(error.contains("key `listen` takes one value"), "{error}");
        let error = expanded("room-upload-share-percent = 400\n", &[]).expect_err("range");
        assert!(error.contains("key `room-upload-share-percent`"), "{error}");
        let error = expanded("state-dir = \n", &[]).expect_err("toml");
        assert!(error.contains("is not valid TOML"), "{error}");
    }

    #[test]
    fn secrets_are_refused_with_where_they_come_from_instead() {
        let error = expanded("api-key = \"sk-in-a-file\"\n", &[]).expect_err("secret");
        assert!(
            error.contains("XAGENT_CONNECTOR_API_KEY") && error.contains("api-key-file"),
            "{error}"
        );
        assert!(!error.contains("sk-in-a-file"), "the value is not repeated: {error}");
        let error = expanded("database-url = \"postgres://u:pw@h/db\"\n", &[]).expect_err("secret");
        assert!(
            error.contains("XAGENT_CONNECTOR_DATABASE_URL") && !error.contains("pw@"),
            "{error}"
        );
    }

    #[test]
    fn a_setting_the_environment_holds_is_not_taken_from_the_file() {
        // PATH is set in every test environment: its setting stays with the environment.
        let tree = clap::Command::new("xagent-connector").subcommand(
            clap::Command::new("webchat")
                .arg(clap::Arg::new("region").long("region").env("PATH"))
                .arg(clap::Arg::new("zone").long("zone"))
                .arg(clap::Arg::new("config").long("config")),
        );
        let (_dir, path) = file("region = \"from-file\"\nzone = \"z1\"\n");
        let mut args = os(&["xagent-connector", "webchat", "--config"]);
        args.push(path.into_os_string());
        let args: Vec<String> = expand(args, &tree)
            .expect("expands")
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(!args.iter().any(|a| a.starts_with("--region")), "{args:?}");
        assert!(args.iter().any(|a| a == "--zone=z1"), "{args:?}");
    }

    #[test]
    fn commands_without_config_are_left_alone() {
        let args = os(&["xagent-connector", "check", "card.json"]);
        assert_eq!(expand(args.clone(), &cli()).expect("unchanged"), args);
        let args = os(&["xagent-connector", "webchat", "--state-dir", "d"]);
        assert_eq!(expand(args.clone(), &cli()).expect("unchanged"), args);
    }

    /// The examples in docs/ are what the flags say (regenerate with
    /// `XAGENT_UPDATE_EXAMPLES=1 cargo test -p xagent-cli config_file`), and each is accepted.
    #[test]
    fn the_example_files_match_the_flags_and_are_accepted() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let cli = cli();
        for command in CONFIGURABLE {
            let sub = cli.find_subcommand(command).expect("subcommand");
            let text = example(sub, command);
            let path = docs.join(format!("{command}.example.toml"));
            if std::env::var_os("XAGENT_UPDATE_EXAMPLES").is_some() {
                std::fs::write(&path, &text).expect("write the example");
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                committed,
                text,
                "{} is stale: XAGENT_UPDATE_EXAMPLES=1 cargo test -p xagent-cli config_file",
                path.display()
            );
            let mut args = os(&["xagent-connector", command, "--config"]);
            args.push(path.into_os_string());
            let args = expand(args, &cli).expect("the example expands");
            crate::Cli::try_parse_from(args).expect("clap takes the example");
        }
    }
}
