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
}
