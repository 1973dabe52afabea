//! Signed checkpoints of the central audit ledger: every N records or T seconds a server signs
//! "the chain had COUNT records ending at HEAD at TIME" with an Ed25519 key, stores it in the
//! ledger and appends it to a sink outside it (a file elsewhere, or an HTTP endpoint), and
//! `toolgate audit verify --checkpoints FILE --key PUB` proves a log holds every checkpointed head
//! at its count. `--expect-head` checks one published head; the checkpoints check every one, so a
//! log cut short or rewritten after any checkpoint fails, and a pruned log verifies from the
//! checkpoint it was pruned to.
//!
//! Design decision: what is signed is the canonical JSON of `{"count", "head", "time"}` (the
//! record format's canonical encoding, so any verifier can rebuild it), and the key is a standard
//! PKCS#8 / SPKI PEM pair (`openssl genpkey -algorithm ed25519`), so no tool of ours is needed to
//! make or hold one. Several replicas may run the task; a count is checkpointed once (the ledger's
//! primary key), and only the replica that stored it pushes it to the sink.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde_json::json;
use toolgate_core::canonical;
use toolgate_core::time::now_ms;
use toolgate_store::ledger::{Checkpoint, Ledger};

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the key's 32 bytes follow it.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The bytes a checkpoint's signature covers.
fn statement(count: u64, head: &str, time: i64) -> Vec<u8> {
    canonical::to_vec(&json!({"count": count, "head": head, "time": time}))
}

/// A short name of a public key: the first 16 hex digits of its SHA-256.
fn key_id(public: &[u8]) -> String {
    canonical::sha256_hex(public)[..16].to_owned()
}

/// The DER inside a PEM file's `label` block.
fn pem(path: &Path, label: &str) -> anyhow::Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let body = text
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .map(|(body, _)| body)
        .with_context(|| format!("{} holds no {label} PEM block", path.display()))?;
    let body: String = body.split_whitespace().collect();
    STANDARD
        .decode(body)
        .with_context(|| format!("{}: the {label} block is not base64", path.display()))
}

/// The key that signs checkpoints.
pub(crate) struct Signer {
    pair: Ed25519KeyPair,
    key_id: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({})", self.key_id)
    }
}

impl Signer {
    /// The Ed25519 private key in a PKCS#8 PEM file (`-----BEGIN PRIVATE KEY-----`).
    pub(crate) fn from_file(path: &Path) -> anyhow::Result<Self> {
        let der = pem(path, "PRIVATE KEY")?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
            anyhow::anyhow!("{} is not an Ed25519 private key: {e}", path.display())
        })?;
        let key_id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, key_id })
    }

    /// A checkpoint of `count` records ending at `head`, signed now.
    pub(crate) fn sign(&self, count: u64, head: &str) -> Checkpoint {
        let time = now_ms();
        let signature = self.pair.sign(&statement(count, head, time));
        Checkpoint {
            count,
            head: head.to_owned(),
            time,
            key_id: self.key_id.clone(),
            signature: STANDARD.encode(signature.as_ref()),
        }
    }
}

/// The public key that checks checkpoints: an SPKI PEM file (`-----BEGIN PUBLIC KEY-----`).
pub(crate) fn public_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    let der = pem(path, "PUBLIC KEY")?;
    match der.strip_prefix(SPKI_PREFIX.as_slice()) {
        Some(key) if key.len() == 32 => Ok(key.to_vec()),
        _ => anyhow::bail!("{} is not an Ed25519 public key", path.display()),
    }
}

/// Whether `checkpoint` was signed by `public`.
pub(crate) fn signed_by(checkpoint: &Checkpoint, public: &[u8]) -> bool {
    let Ok(signature) = STANDARD.decode(&checkpoint.signature) else {
        return false;
    };
    let message = statement(checkpoint.count, &checkpoint.head, checkpoint.time);
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&message, &signature)
        .is_ok()
}

/// Where checkpoints go besides the ledger.
#[derive(Clone, Debug)]
pub(crate) enum Sink {
    /// Appended as JSON lines and synced (a file on another disk, another machine's mount).
    File(PathBuf),
    /// POSTed as JSON; anything but 2xx is a failure, retried with the next checkpoint.
    Http(String),
}

impl Sink {
    pub(crate) fn parse(value: &str) -> Self {
        if value.starts_with("https://") || value.starts_with("http://") {
            Self::Http(value.to_owned())
        } else {
            Self::File(PathBuf::from(value))
        }
    }

    async fn push(&self, checkpoint: &Checkpoint) -> anyhow::Result<()> {
        let line = serde_json::to_string(checkpoint)?;
        match self {
            Self::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .with_context(|| format!("cannot open {}", path.display()))?;
                    file.write_all(format!("{line}\n").as_bytes())?;
                    file.sync_data()?;
                    Ok(())
                })
                .await?
            }
            Self::Http(url) => {
                let response = reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(line)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await?;
                anyhow::ensure!(
                    response.status().is_success(),
                    "the sink answered {}",
                    response.status()
                );
                Ok(())
            }
        }
    }
}

/// When to checkpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Every {
    /// After this many records since the last checkpoint.
    pub(crate) records: u64,
    /// After this long since the last checkpoint, if any record came since.
    pub(crate) interval: Duration,
}

/// Checkpoints `ledger` for as long as the process serves: the head is read once a second, and
/// signed when `every` says so.
pub(crate) fn start(ledger: Ledger, signer: Signer, sink: Sink, every: Every) -> CheckpointTask {
    CheckpointTask(tokio::spawn(async move {
        let mut last: Option<(u64, i64)> = None;
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match checkpoint_once(&ledger, &signer, &sink, every, &mut last).await {
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), "checkpoint not made; trying again")
                }
            }
        }
    }))
}

/// Stops the checkpoints when dropped.
#[derive(Debug)]
pub(crate) struct CheckpointTask(tokio::task::JoinHandle<()>);

impl Drop for CheckpointTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn checkpoint_once(
    ledger: &Ledger,
    signer: &Signer,
    sink: &Sink,
    every: Every,
    last: &mut Option<(u64, i64)>,
) -> anyhow::Result<()> {
    if last.is_none() {
        *last = Some(
            ledger
                .checkpoints()
                .await?
                .last()
                .map_or((0, 0), |c| (c.count, c.time)),
        );
    }
    let (last_count, last_time) = last.unwrap_or((0, 0));
    let (count, head) = ledger.head().await?;
    let since = Duration::from_millis(u64::try_from(now_ms() - last_time).unwrap_or(0));
    if count <= last_count || (count - last_count < every.records && since < every.interval) {
        return Ok(());
    }
    let checkpoint = signer.sign(count, &head);
    if ledger.add_checkpoint(&checkpoint).await? {
        sink.push(&checkpoint)
            .await
            .context("cannot push the checkpoint to its sink")?;
        tracing::info!(count, head = %head, "audit checkpoint signed");
    }
    *last = Some((count, checkpoint.time));
    Ok(())
}

/// Reads a checkpoints file (JSON lines, as the file sink writes them).
pub(crate) fn read(path: &Path) -> anyhow::Result<Vec<Checkpoint>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read checkpoints {}", path.display()))?;
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{}: line {} is not a checkpoint", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_checkpoint_verifies_and_any_change_to_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        std::fs::write(
            &key,
            format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
                STANDARD.encode(pkcs8.as_ref())
            ),
        )
        .unwrap();
        let signer = Signer::from_file(&key).unwrap();
        let public = signer.pair.public_key().as_ref().to_vec();
        let checkpoint = signer.sign(42, &"ab".repeat(32));
        assert!(signed_by(&checkpoint, &public));
        for changed in [
            Checkpoint {
                count: 41,
                ..checkpoint.clone()
            },
            Checkpoint {
                head: "cd".repeat(32),
                ..checkpoint.clone()
            },
            Checkpoint {
                time: checkpoint.time + 1,
                ..checkpoint.clone()
            },
        ] {
            assert!(!signed_by(&changed, &public), "{changed:?}");
        }
        let other = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let other = Ed25519KeyPair::from_pkcs8(other.as_ref()).unwrap();
        assert!(!signed_by(&checkpoint, other.public_key().as_ref()));
    }

    /// A one-request HTTP server on 127.0.0.1 answering `status`; returns its URL and the body
    /// it will have received.
    async fn sink_server(status: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/checkpoints", listener.local_addr().unwrap());
        let received = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut chunk = [0_u8; 4096];
            // Headers, then as many body bytes as Content-Length says.
            let body = loop {
                let n = socket.read(&mut chunk).await.unwrap();
                request.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&request).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= length {
                        break body.to_owned();
                    }
                }
            };
            let answer =
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            socket.write_all(answer.as_bytes()).await.unwrap();
            body
        });
        (url, received)
    }

    #[tokio::test]
    async fn an_http_sink_receives_the_checkpoint_and_a_refusal_is_an_error() {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let checkpoint = Checkpoint {
            count: 7,
            head: "ab".repeat(32),
            time: 1_700_000_000_000,
            key_id: "0123456789abcdef".to_owned(),
            signature: "c2ln".to_owned(),
        };
        let (url, received) = sink_server("204 No Content").await;
        Sink::parse(&url).push(&checkpoint).await.unwrap();
        let body = received.await.unwrap();
        assert_eq!(
            serde_json::from_str::<Checkpoint>(&body).unwrap(),
            checkpoint
        );

        let (url, _received) = sink_server("500 Internal Server Error").await;
        let refused = Sink::parse(&url).push(&checkpoint).await;
        assert!(refused.is_err(), "a 500 is not a pushed checkpoint");
    }
}
