use clap::{CommandFactory as _, Parser as _};
use ebpf_proxy::{
    args::{self, Cli, Command, LogFormat, PinDirArgs},
    cmd,
};

use std::process::ExitCode;

/// jemalloc for every Rust allocation: see observe/memory.rs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, under the name the (prefixed) jemalloc of
/// tikv-jemallocator reads them by: a pointer to a C string.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 94] = ebpf_proxy::observe::memory::JEMALLOC_CONF;

/// The tokio runtime's worker threads (see `main`).
const WORKER_THREADS: usize = 2;

fn main() -> ExitCode {
    // Two workers whatever the node's size (tokio's default is one per
    // CPU): the agent's work is one pipeline task at a time plus the watches
    // (whose two first lists fill about two cores) and the HTTP servers,
    // while each worker costs a thread stack and an allocator cache on a
    // 64-core node. A start's translation and map writes take a second
    // thread of their own for the moment they need it.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
        .expect("building the tokio runtime")
        .block_on(run())
}

async fn run() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(refusal) = args::refused_kube_proxy_flag(&argv) {
        eprintln!("error: {refusal}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(argv);
    if let Err(refusal) = cli.check() {
        eprintln!("error: {refusal}");
        return ExitCode::from(2);
    }
    let (command, verbosity) = match cli.command {
        Some(command) => (command, None),
        None if cli.kube_proxy.is_empty() => {
            // Nothing to do: an agent with every default attaches to the
            // machine's root cgroup, so it is never started by accident.
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
        // kube-proxy's command line: `--cleanup` cleans up, the rest runs.
        None => {
            let cleanup = cli.kube_proxy.cleanup;
            let verbosity = cli.kube_proxy.verbosity;
            let run = match cli.kube_proxy.into_settings() {
                Ok(run) => run,
                Err(error) => error.exit(),
            };
            if cleanup {
                let prepared = cmd::run::prepare(run);
                init_logging(cli.log_format.unwrap_or(LogFormat::Text), verbosity);
                return finish(
                    prepared
                        .map_err(Into::into)
                        .and_then(|p| cmd::cleanup::run(&PinDirArgs { bpffs_dir: p.pin_dir() })),
                );
            }
            (Command::Run(Box::new(run)), verbosity)
        }
    };
    let result = match command {
        Command::Run(run) => {
            // The config file may choose the log format, so it is read first.
            let prepared = cmd::run::prepare(*run);
            let from_file = prepared.as_ref().ok();
            init_logging(
                cli.log_format.or(from_file.and_then(cmd::run::Prepared::log_format)).unwrap_or(LogFormat::Text),
                verbosity.or(from_file.and_then(cmd::run::Prepared::log_verbosity)),
            );
            match prepared {
                Ok(prepared) => cmd::run::run(prepared).await,
                Err(err) => Err(err.into()),
            }
        }
        command => {
            init_logging(cli.log_format.unwrap_or(LogFormat::Text), None);
            match command {
                Command::Run(_) => unreachable!("handled above"),
                Command::Demo(demo) => cmd::demo::run(demo).await,
                Command::Cleanup(pins) => cmd::cleanup::run(&pins),
                Command::Service(service) => cmd::service::run(&service),
                Command::Status(status) => cmd::status::run(&status),
                Command::Completion { shell } => cmd::completion::run(shell),
                Command::Explain(explain) => cmd::explain::run(&explain),
            }
        }
    };
    finish(result)
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The Kubernetes client logs an ERROR for every request that fails
/// (`kube_client::client::builder`'s trace layer), about one a second per
/// watch while the API server is unreachable. The watches log the first
/// failure and a reminder every 30 s themselves (`source::reachability`),
/// so the client's line is shown only when the log is at debug or finer.
fn quiet_client_failures(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::filter::LevelFilter;
    if filter.max_level_hint().is_some_and(|level| level >= LevelFilter::DEBUG) {
        return filter;
    }
    filter.add_directive("kube_client::client::builder=off".parse().expect("a valid directive"))
}

/// Logs to stderr in `format`; `RUST_LOG` sets the level, else klog's
/// `verbosity` (kube-proxy's `-v`, `logging.verbosity`), else info.
fn init_logging(format: LogFormat, verbosity: Option<u32>) {
    let default = verbosity.map_or("info", args::level_for_verbosity);
    let filter = quiet_client_failures(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
