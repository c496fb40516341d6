//! `xagent-connector check`: validate one document and print every violation.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use xagent_protocol_types::Side;
use xagent_protocol_validate::{CardFacts, DocumentKind, Report, Severity, check_text_from};

use crate::EXIT_USAGE;

/// Arguments of `check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The kind of document.
    #[command(subcommand)]
    target: Target,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    format: Format,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// One violation a line, for people (coloured on a terminal unless NO_COLOR is set).
    Text,
    /// `{"valid": bool, "violations": [{"rule", "severity", "path", "message"}]}`.
    Json,
}

/// The sending side of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Sender {
    /// The Connector sent it.
    Connector,
    /// xAgent sent it.
    Xagent,
}

impl From<Sender> for Side {
    fn from(sender: Sender) -> Self {
        match sender {
            Sender::Connector => Side::Connector,
            Sender::Xagent => Side::Xagent,
        }
    }
}

/// What to check.
#[derive(Debug, Subcommand)]
enum Target {
    /// A Connector Card (`connector-card.json`).
    Card {
        /// The file, or `-` for standard input.
        file: PathBuf,
    },
    /// A Connection Descriptor, optionally against a Card.
    Descriptor {
        /// The file, or `-` for standard input.
        file: PathBuf,
        /// The Connector Card to check against.
        #[arg(long)]
        card: Option<PathBuf>,
    },
    /// One data-plane packet, optionally against a Card.
    Packet {
        /// The file, or `-` for standard input.
        file: PathBuf,
        /// The Connector Card to check against.
        #[arg(long)]
        card: Option<PathBuf>,
        /// Who sends the packet: applies the rules that depend on the direction. Without it a
        /// packet type one side sends is judged as sent by that side, and one both sides send
        /// is judged for both (each such violation names its sender).
        #[arg(long, value_enum)]
        sender: Option<Sender>,
    },
    /// A `SKILL.md`, against the Card whose Skill it is.
    Skill {
        /// The file, or `-` for standard input.
        file: PathBuf,
        /// The Connector Card the Skill belongs to.
        #[arg(long)]
        card: PathBuf,
    },
}

/// A usage or I/O failure (exit status 2).
#[derive(Debug)]
struct UsageError(String);

fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn read_input(path: &Path) -> Result<String, UsageError> {
    if is_stdin(path) {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| UsageError(format!("cannot read standard input: {e}")))?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("cannot read {}: {e}", path.display())))
    }
}

/// Reads the reference Card. A Card that cannot be used as a reference is a usage error: check
/// it first with `check card`.
fn read_card(path: &Path) -> Result<CardFacts, UsageError> {
    let text = read_input(path)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        UsageError(format!(
            "the Card {} is not JSON ({e}); run `xagent-connector check card` on it",
            path.display()
        ))
    })?;
    if !value.is_object() {
        return Err(UsageError(format!("the Card {} is not a JSON object", path.display())));
    }
    Ok(CardFacts::from_value(&value))
}

fn evaluate(target: &Target) -> Result<Report, UsageError> {
    let (kind, file, card, sender) = match target {
        Target::Card { file } => (DocumentKind::Card, file, None, None),
        Target::Descriptor { file, card } => (DocumentKind::Descriptor, file, card.as_ref(), None),
        Target::Packet { file, card, sender } => {
            (DocumentKind::Packet, file, card.as_ref(), sender.map(Side::from))
        }
        Target::Skill { file, card } => (DocumentKind::Skill, file, Some(card), None),
    };
    if card.is_some_and(|c| is_stdin(c)) && is_stdin(file) {
        return Err(UsageError("FILE and --card cannot both be standard input".into()));
    }
    let card = card.map(|c| read_card(c)).transpose()?;
    let text = read_input(file)?;
    Ok(check_text_from(kind, &text, card.as_ref(), sender))
}

/// Runs `check` and returns the exit status.
pub(crate) fn run(args: CheckArgs) -> ExitCode {
    let report = match evaluate(&args.target) {
        Ok(report) => report,
        Err(UsageError(message)) => {
            eprintln!("error: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut out = std::io::stdout().lock();
    let written = match args.format {
        Format::Json => writeln!(out, "{}", report.to_json()),
        Format::Text => {
            let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            write_text(&mut out, &report, colour)
        }
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        // A closed pipe is not worth a panic; report it as an I/O failure.
        eprintln!("error: cannot write the report: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    if report.valid { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

fn write_text(out: &mut impl Write, report: &Report, colour: bool) -> std::io::Result<()> {
    for v in &report.violations {
        let path = if v.path.is_empty() { "/" } else { v.path.as_str() };
        let (start, end) = match (colour, v.severity) {
            (false, _) => ("", ""),
            (true, Severity::Error) => ("\x1b[1;31m", "\x1b[0m"),
            (true, Severity::Warning) => ("\x1b[1;33m", "\x1b[0m"),
        };
        writeln!(
            out,
            "{start}{:<7}{end} {} at {path}: {}",
            v.severity.as_str(),
            v.rule,
            v.message
        )?;
    }
    let errors = report.errors().count();
    let warnings = report.warnings().count();
    if errors == 0 && warnings == 0 {
        eprintln!("valid: no violations");
    } else {
        eprintln!(
            "{}: {errors} error(s), {warnings} warning(s)",
            if report.valid { "valid" } else { "invalid" }
        );
    }
    Ok(())
}
