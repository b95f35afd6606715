//! `skiff-relay`: the thread-per-core io_uring relay of skiff.
//!
//! Subcommands: `serve` (default; the moq-lite relay, one worker per core
//! linked pairwise), `demo` (the relay with a camera publisher and
//! viewers in one process) and `export` (an MP4 file from `--record-dir`).
//! Run with `--help`.
//!
//! Exit status: 0 after a clean stop (SIGINT/SIGTERM and drain), 2 for bad
//! flags or configuration, 1 for other failures, 130 when a second signal
//! cuts the drain short.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use skiff_relay::config::{Cli, Command, ConfigError, DemoTransport, ExportArgs, RelayConfig};
use skiff_relay::error::RelayError;
use skiff_relay::relay::RelayHandler;
use skiff_relay::signals::SignalWatcher;
use skiff_relay::tls::{TlsServer, TlsSource};
use skiff_relay::{record, relay_demo, server};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Prints usage errors to stderr (exit 2) and --help/--version to stdout (exit 0).
        Err(e) => e.exit(),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff-relay: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cli: Cli) -> Result<(), RelayError> {
    let mut config = RelayConfig::load(&cli)?;
    init_logging(&config);
    let command = cli.command.unwrap_or(Command::Serve);
    // Install handlers before anything listens, so an early signal is kept.
    let signals = SignalWatcher::install().map_err(RelayError::Signals)?;
    match command {
        Command::Serve => {
            let threads = config.threads.get();
            // The certificate is read once here (checked already by the
            // configuration) and shared by the workers and the SIGHUP reload.
            let tls = match config.tls_source() {
                Some(source) => {
                    let key = match source {
                        TlsSource::Files(_) => "tls-cert",
                        TlsSource::Generate(_) => "tls-generate",
                    };
                    let tls = TlsServer::load(source.clone()).map_err(|e| {
                        RelayError::Config(ConfigError::Invalid {
                            key,
                            reason: e.to_string(),
                        })
                    })?;
                    let sha256 = tls.cert().fingerprint_hex().unwrap_or_default();
                    if tls.on_tcp() {
                        tracing::info!(cert = %source, %sha256, "TLS on the listen port (TCP and QUIC)");
                    } else {
                        tracing::info!(cert = %source, %sha256, "certificate for QUIC; the TCP port stays plain");
                    }
                    Some(Arc::new(tls))
                }
                None => None,
            };
            let handle = server::start(
                config,
                RelayHandler::factory_with_tls(threads, tls.clone()).map_err(RelayError::Spawn)?,
            )?;
            announce(&handle);
            let signals = match tls {
                Some(tls) => signals.on_reload(move || {
                    // Errors are logged by reload; the old certificate stays.
                    let _ = tls.reload();
                }),
                None => signals,
            };
            let _signal_thread = signals
                .stop_on_signal(handle.stop_trigger())
                .map_err(RelayError::Spawn)?;
            let report = handle.wait()?;
            if report.forced() > 0 {
                tracing::warn!(forced = report.forced(), "drain timeout closed connections");
            }
            tracing::info!("stopped");
            Ok(())
        }
        Command::Export(args) => export(&config, args),
        Command::Demo(args) => {
            if config.tls.is_some() {
                // The TCP port stays plain for the demo's browser page and its
                // tcp:// and ws:// clients; QUIC takes a generated certificate.
                return Err(RelayError::Config(ConfigError::Invalid {
                    key: "tls-cert",
                    reason: "the demo keeps its TCP port plain: drop --tls-cert and --tls-key (--transport quic generates a certificate)".into(),
                }));
            }
            match args.transport() {
                DemoTransport::Quic => {
                    if !config.quic {
                        return Err(RelayError::Config(ConfigError::Invalid {
                            key: "quic",
                            reason: "--transport quic needs QUIC: drop --quic=false".into(),
                        }));
                    }
                    if config.tls_generate.is_empty() {
                        // A certificate for the names the demo's clients dial.
                        config.tls_generate = vec!["localhost".into(), "127.0.0.1".into()];
                    }
                }
                DemoTransport::Tcp | DemoTransport::Ws => {
                    if !config.tls_generate.is_empty() {
                        return Err(RelayError::Config(ConfigError::Invalid {
                            key: "tls-generate",
                            reason: "the demo's clients dial tcp:// or ws://: drop --tls-generate, or add --transport quic".into(),
                        }));
                    }
                }
            }
            if cli.settings.listen.is_none() && config.listen == RelayConfig::default().listen {
                // Pick a free port so the demo never collides with a running relay.
                config.listen.set_port(0);
            }
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let _signal_thread = signals
                .on_signal(move || stop2.store(true, Ordering::Relaxed))
                .map_err(RelayError::Spawn)?;
            let report = relay_demo::run(config, args, stop)?;
            print!("{report}");
            let _ = std::io::stdout().flush();
            if report.failures.is_empty() {
                Ok(())
            } else {
                Err(RelayError::DemoFailed {
                    failed: report.failures.len(),
                    viewers: report.viewers,
                })
            }
        }
    }
}

/// `skiff-relay export`: writes the MP4 and prints what it holds.
fn export(config: &RelayConfig, args: ExportArgs) -> Result<(), RelayError> {
    let Some(record) = &config.record else {
        return Err(RelayError::Config(ConfigError::Invalid {
            key: "record-dir",
            reason: "export reads --record-dir: give it".into(),
        }));
    };
    let job = record::export::Export {
        dir: record.dir.clone(),
        broadcast: args.broadcast,
        track: args.track,
        from: args.from.map(|d| d.0),
        to: args.to.map(|d| d.0),
        output: args.output,
    };
    let done = record::export::run(&job).map_err(RelayError::Export)?;
    println!(
        "exported {} segments ({} frames, track {}, content time {}..{} us, {} bytes) to {}",
        done.segments,
        done.frames,
        done.track,
        done.span_us.0,
        done.span_us.1,
        done.bytes,
        job.output.display()
    );
    Ok(())
}

/// Prints the bound addresses on stdout (one line each) for scripts and tests.
fn announce(handle: &server::ServerHandle) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {}", handle.local_addr());
    if let Some(m) = handle.metrics_addr() {
        let _ = writeln!(out, "metrics on {m}");
    }
    let _ = out.flush();
}

fn init_logging(config: &RelayConfig) {
    // `try_init` fails only if a subscriber is already set, which cannot
    // happen here; ignore rather than panic.
    let _ = tracing_subscriber::fmt()
        .with_max_level(config.log.0)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
