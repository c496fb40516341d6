//! `--database-url` (env `XAGENT_CONNECTOR_DATABASE_URL`): one definition for every
//! subcommand that keeps state. Without it, state stays in SQLite files in the state
//! directory; with it, in that PostgreSQL database. The URL is a secret: it is only ever
//! shown redacted (its Display and Debug replace the password with `***`).

use clap::Args;
use xagent_storage_postgres::DatabaseUrl;

/// The environment variable holding the database URL.
pub const ENV_DATABASE_URL: &str = "XAGENT_CONNECTOR_DATABASE_URL";

/// Where the state is kept.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Storage")]
pub struct DatabaseArgs {
    /// Keep the state in this PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB)
    /// instead of SQLite in the state directory. Prefer the environment variable
    /// XAGENT_CONNECTOR_DATABASE_URL: a password on the command line is visible to every
    /// local user in the process list.
    #[arg(long = "database-url", env = ENV_DATABASE_URL, hide_env_values = true,
          value_name = "URL", value_parser = DatabaseUrlParser)]
    pub database_url: Option<DatabaseUrl>,
}

/// Parses the flag into a [`DatabaseUrl`]. A refusal is clap's raw error with the parser's
/// reason only: clap's usual "invalid value '...'" would repeat the URL, password included.
#[derive(Clone, Copy, Debug)]
struct DatabaseUrlParser;

impl clap::builder::TypedValueParser for DatabaseUrlParser {
    type Value = DatabaseUrl;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DatabaseUrl, clap::Error> {
        use clap::error::ErrorKind;
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(ErrorKind::InvalidUtf8, "--database-url must be valid UTF-8\n")
        })?;
        DatabaseUrl::parse(text).map_err(|e| {
            clap::Error::raw(ErrorKind::InvalidValue, format!("--database-url: {e}\n"))
        })
    }
}

/// The warning to print when the command line itself holds a database URL with a password
/// (`--database-url URL` or `--database-url=URL`): every local user can read a process's
/// arguments. `None` when it holds none (a URL from the environment is not on it).
pub(crate) fn password_on_command_line<I, S>(args: I) -> Option<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(arg) = arg.as_ref().to_str().map(str::to_owned) else { continue };
        if arg == "--" {
            break;
        }
        let value = if arg == "--database-url" {
            args.next().and_then(|v| v.as_ref().to_str().map(str::to_owned))
        } else {
            arg.strip_prefix("--database-url=").map(str::to_owned)
        };
        let has_password = value
            .and_then(|text| DatabaseUrl::parse(&text).ok())
            .is_some_and(|url| url.config().get_password().is_some());
        if has_password {
            return Some(format!(
                "xagent-connector: warning: the --database-url on the command line holds a \
                 password, which every local user can read in the process list; put the URL in \
                 the environment variable {ENV_DATABASE_URL} instead"
            ));
        }
    }
    None
}

/// Prints [`password_on_command_line`]'s warning for a command line (program name first), if
/// any.
pub(crate) fn warn_if_password_on_command_line(args: &[std::ffi::OsString]) {
    if let Some(warning) = password_on_command_line(args.iter().skip(1)) {
        eprintln!("{warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        database: DatabaseArgs,
    }

    #[test]
    fn the_flag_parses_into_a_redacted_url_and_a_bad_one_is_refused_without_its_password() {
        let parsed = Command::try_parse_from([
            "x",
            "--database-url",
            "postgres://app:hunter2@127.0.0.1:5432/state",
        ])
        .unwrap();
        let url = parsed.database.database_url.unwrap();
        assert!(!format!("{url} {url:?}").contains("hunter2"), "{url}");
        assert_eq!(url.database(), "state");
        let Err(refused) =
            Command::try_parse_from(["x", "--database-url", "mysql://u:hunter2@h/d"])
        else {
            panic!("a URL that is not PostgreSQL's is refused")
        };
        assert!(!refused.to_string().contains("hunter2"), "{refused}");
    }

    #[test]
    fn a_password_on_the_command_line_is_warned_about_without_repeating_it() {
        for args in [
            &["webchat", "--database-url", "postgres://app:hunter2@127.0.0.1/state"][..],
            &["homie", "--database-url=postgres://app:hunter2@db.example/state"][..],
            &["mcp", "--database-url", "postgres://app@db.example/state?password=hunter2"][..],
        ] {
            let warning = password_on_command_line(args).unwrap_or_default();
            assert!(warning.contains("process list"), "{args:?}: {warning:?}");
            assert!(warning.contains(ENV_DATABASE_URL), "{warning}");
            assert!(!warning.contains("hunter2"), "{warning}");
        }
        for args in [
            &["webchat", "--database-url", "postgres://app@127.0.0.1/state"][..],
            &["webchat", "--state-dir", "/tmp/x"][..],
            &["webchat", "--", "--database-url", "postgres://app:hunter2@h/d"][..],
            &["webchat", "--database-url", "not a url"][..],
        ] {
            assert_eq!(password_on_command_line(args), None, "{args:?}");
        }
    }
}
