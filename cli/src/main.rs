//! The `xagent-connector` binary: everything is in the library ([`xagent_cli::run`]).

fn main() -> std::process::ExitCode {
    xagent_cli::run(std::env::args_os())
}
