//! `drover packages upload`: the .deb streamed from disk (memory stays
//! flat whatever the file's size), a progress bar at a terminal, no limit
//! on how long a moving upload may take but a cut-off when it stops moving,
//! and a broken upload sent again from the start (the store takes the same
//! file twice as one: an upload is idempotent).

use crate::client::ApiClient;
use anyhow::{Context, Result, anyhow, bail};
use drover_api::schedules::Package;
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Attempts before giving up on an upload that keeps breaking off.
const ATTEMPTS: u32 = 3;
/// How long the control plane may take to answer once every byte is sent
/// (it syncs the file and reads the package's control fields).
const ANSWER_WAIT: Duration = Duration::from_secs(300);
/// Bytes read from the file per chunk.
const CHUNK: usize = 64 * 1024;

/// How one attempt ended when it did not store the package.
enum Failed {
    /// The control plane answered no (a bad package, a conflict, a full
    /// store): sending it again would get the same answer.
    Answered(anyhow::Error),
    /// The connection broke or stalled: worth another attempt.
    Broke(anyhow::Error),
}

/// Uploads `file` to `POST /api/v1/packages`; returns the stored record.
pub async fn upload(client: &ApiClient, file: &Path, stall: Duration) -> Result<Package> {
    let size = tokio::fs::metadata(file)
        .await
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    // Drawn on stderr at a terminal only: hidden when piped or in a log.
    let bar = ProgressBar::new(size);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(
        file.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let mut attempt = 1;
    loop {
        bar.set_position(0);
        match once(client, file, size, stall, &bar).await {
            Ok(answer) => {
                bar.finish_and_clear();
                return Ok(answer);
            }
            Err(Failed::Answered(e)) => {
                bar.abandon();
                return Err(e);
            }
            Err(Failed::Broke(e)) if attempt < ATTEMPTS => {
                let wait = Duration::from_secs(2u64.pow(attempt));
                bar.suspend(|| {
                    eprintln!(
                        "drover: {e:#}; sending it again in {} s (attempt {} of {ATTEMPTS})",
                        wait.as_secs(),
                        attempt + 1
                    )
                });
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(Failed::Broke(e)) => {
                bar.abandon();
                return Err(e.context(format!("the upload failed {ATTEMPTS} times")));
            }
        }
    }
}

async fn once(
    client: &ApiClient,
    file: &Path,
    size: u64,
    stall: Duration,
    bar: &ProgressBar,
) -> Result<Package, Failed> {
    let opened = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("cannot read {}", file.display()))
        .map_err(Failed::Answered)?;
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let progress = bar.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(opened, CHUNK).inspect(move |chunk| {
        if let Ok(chunk) = chunk {
            counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            progress.inc(chunk.len() as u64);
        }
    });
    let request = client.post_stream("/packages", size, reqwest::Body::wrap_stream(stream));
    tokio::pin!(request);
    let mut seen = 0;
    let mut moved_at = Instant::now();
    let response = loop {
        tokio::select! {
            response = &mut request => break response,
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                let now = sent.load(Ordering::Relaxed);
                if now != seen {
                    (seen, moved_at) = (now, Instant::now());
                } else if now < size && moved_at.elapsed() >= stall {
                    return Err(Failed::Broke(anyhow!(
                        "the upload stalled: the control plane took no bytes for {} s after \
                         {now} of {size}",
                        stall.as_secs()
                    )));
                } else if now >= size && moved_at.elapsed() >= ANSWER_WAIT {
                    return Err(Failed::Broke(anyhow!(
                        "every byte was sent, and the control plane did not answer within {} s",
                        ANSWER_WAIT.as_secs()
                    )));
                }
            }
        }
    };
    let response = response.map_err(|e| Failed::Broke(client.unreachable(e)))?;
    let status = response.status();
    match ApiClient::check(response).await {
        Ok(answer) => serde_json::from_value(answer)
            .context("the control plane's answer is not a package")
            .map_err(Failed::Answered),
        // The control plane cut a stalled upload off, or is restarting.
        Err(e)
            if status == reqwest::StatusCode::REQUEST_TIMEOUT
                || status == reqwest::StatusCode::SERVICE_UNAVAILABLE
                || status == reqwest::StatusCode::BAD_GATEWAY =>
        {
            Err(Failed::Broke(e))
        }
        Err(e) => Err(Failed::Answered(e)),
    }
}

/// The stall cut-off operators give on the command line, checked.
pub fn stall(seconds: u64) -> Result<Duration> {
    if seconds == 0 {
        bail!("--stall-seconds must be at least 1");
    }
    Ok(Duration::from_secs(seconds))
}
