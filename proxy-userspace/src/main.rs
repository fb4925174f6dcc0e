use clap::Parser as _;
use ebpf_proxy::{
    args::{Cli, Command, LogFormat},
    cmd,
};

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(*args).await,
        Command::Demo(args) => cmd::demo::run(args).await,
        Command::Cleanup(args) => cmd::cleanup::run(&args),
        Command::Service(args) => cmd::service::run(&args),
        Command::Status(args) => cmd::status::run(&args),
        Command::Completion { shell } => cmd::completion::run(shell),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
