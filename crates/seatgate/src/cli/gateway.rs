//! `seatgate gateway`: the HTTPS front door (seatgate-gateway), its OpenAPI
//! document and its borrow-token keys.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::service::run as service;
use seatgate_gateway::borrow;

#[derive(Debug, Args)]
pub(super) struct GatewayArgs {
    #[command(subcommand)]
    command: Option<GatewayCommand>,
}

#[derive(Debug, Subcommand)]
enum GatewayCommand {
    /// Serve the API until SIGINT/SIGTERM (the default).
    Run,
    /// Print the OpenAPI 3.1 document (what /openapi.json serves).
    Openapi,
    /// Write a new Ed25519 key for signing borrow tokens (PKCS#8 PEM, mode 0600).
    Keygen {
        /// The file to write; it must not exist.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Print the public key (PEM) of a borrow-signing key, e.g. for
    /// gateway.borrow.previous_key_files or for a desktop to pin.
    PublicKey {
        /// The private key file.
        #[arg(value_name = "FILE")]
        key: PathBuf,
    },
}

pub(super) async fn gateway(settings: Settings, args: GatewayArgs) -> Result<ExitCode, Error> {
    match args.command.unwrap_or(GatewayCommand::Run) {
        GatewayCommand::Run => {
            let metrics = seatgate_gateway::metrics::install().map_err(Error::Metrics)?;
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                service::shutdown_signal().await;
                stop.cancel();
            });
            let deployment = settings.gateway_deployment();
            seatgate_gateway::serve(settings.gateway, deployment, metrics, shutdown, |addr| {
                eprintln!("seatgate gateway: listening on {addr}");
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        GatewayCommand::Openapi => {
            print!("{}", seatgate_gateway::openapi::document());
            Ok(ExitCode::SUCCESS)
        }
        GatewayCommand::Keygen { out } => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let pem = borrow::generate_key_pem()?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&out)
                .map_err(|e| Error::Usage(format!("cannot create {}: {e}", out.display())))?;
            file.write_all(pem.as_bytes())?;
            println!(
                "wrote {}: set gateway.borrow.signing_key_file to it",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        GatewayCommand::PublicKey { key } => {
            let pem = std::fs::read(&key)
                .map_err(|e| Error::Usage(format!("cannot read {}: {e}", key.display())))?;
            let public = borrow::public_key_pem(&pem).ok_or_else(|| {
                Error::Usage(format!(
                    "{} is not a PKCS#8 PEM Ed25519 private key",
                    key.display()
                ))
            })?;
            print!("{public}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
