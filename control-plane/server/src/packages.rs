//! The package store and its download links (`PackageInstallV1`).
//!
//! `drover packages upload FILE.deb` streams a file to `POST
//! /api/v1/packages` (bounded by [`UploadLimits`]); the control plane reads
//! its name, version and architecture from its control file
//! ([`crate::debcontrol`], with dpkg-deb, which is on every Debian host),
//! hashes it, keeps it as `packages/<sha256>.deb` in the data directory and
//! records `packages/<NAME_VERSION_ARCH>` in the store.
//!
//! Links are never stored: at every delivery the enricher signs a fresh one
//! for that device and package, valid one hour (HMAC with the replicas'
//! shared `secret.key`), served by the download listener with range
//! requests, so an agent resumes a broken download. An agent whose link
//! expired asks `GET /api/agent/v1/packages/{id}/download-url?device=ID`
//! with its device token for a fresh one.

use crate::auth::Secrets;
use crate::http::{ApiError, bearer};
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use drover_model::model::{DownloadLink, package_id};
use drover_model::{DeviceId, signing::hex};
use drover_rules::records::{DeviceRecord, device_key};
use drover_rules::records::{PackageRecord, package_key};
use drover_store::db::{Db, DbError};
use futures_util::StreamExt;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// How long a download link is good for.
pub const LINK_LIFETIME: SignedDuration = SignedDuration::from_hours(1);

fn bad(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// Where package files live and how links to them are made.
pub struct Downloads {
    secrets: Arc<Secrets>,
    /// The public base of the download listener (`https://host:port`).
    base: String,
    dir: PathBuf,
}

impl Downloads {
    pub fn new(secrets: Arc<Secrets>, base: String, data: &Path) -> Self {
        Self {
            secrets,
            base: base.trim_end_matches('/').to_owned(),
            dir: blob_dir(data),
        }
    }

    /// A fresh link for `device`, whose token is at `generation`, to
    /// `package`: it stops working when the token is rotated or the device
    /// decommissioned, whichever comes before it expires.
    pub fn link(
        &self,
        package: &str,
        device: &DeviceId,
        generation: u64,
        now: Timestamp,
    ) -> DownloadLink {
        let expires_at = now.saturating_add(LINK_LIFETIME).unwrap_or(now);
        let expires = expires_at.as_second();
        let sig = self.secrets.sign_link(package, device, generation, expires);
        DownloadLink {
            url: format!(
                "{}/api/agent/v1/packages/{package}/file?device={device}&generation={generation}&expires={expires}&sig={sig}",
                self.base
            ),
            expires_at,
        }
    }
}

/// The directory of package files in a data directory.
pub fn blob_dir(data: &Path) -> PathBuf {
    data.join("packages")
}

/// Largest upload accepted.
pub const MAX_UPLOAD_BYTES: u64 = drover_model::model::MAX_PACKAGE_BYTES;

/// How much of the package store uploads may fill, and how long an upload
/// may send nothing before it is cut off (`serve --package-quota`,
/// `--upload-stall-seconds`).
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub quota: u64,
    pub stall: std::time::Duration,
}

impl Default for UploadLimits {
    fn default() -> Self {
        Self {
            quota: DEFAULT_PACKAGE_QUOTA,
            stall: std::time::Duration::from_secs(60),
        }
    }
}

/// The package store's default quota: 20 GiB.
pub const DEFAULT_PACKAGE_QUOTA: u64 = 20 << 30;

/// Parses a size as an operator writes it: `20GiB`, `500MiB`, `64KiB`,
/// `1048576` (bytes); `K`, `M`, `G`, `T` and their `B`/`iB` spellings all
/// mean powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size (write e.g. 20GiB, 500MiB or a number of bytes)")
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?} (use KiB, MiB, GiB or TiB)"
            ));
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// How an upload's partial file is named in the store's directory.
const PARTIAL_PREFIX: &str = "upload-";

/// Bytes of the finished packages in the store now (not uploads under way).
async fn finished_bytes(dir: &Path) -> u64 {
    let mut used = 0;
    if let Ok(mut entries) = tokio::fs::read_dir(dir).await {
        while let Ok(Some(entry)) = entries.next_entry().await {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(PARTIAL_PREFIX)
            {
                continue;
            }
            if let Ok(meta) = entry.metadata().await {
                used += meta.len();
            }
        }
    }
    used
}

/// The package store's quota as every upload under way shares it: the
/// bytes of finished packages and the bytes each upload has received so
/// far, checked and counted under one lock for every chunk, so uploads at
/// once cannot each find room that only one has. The finished packages
/// are measured on disk whenever an upload starts with none under way (so
/// a package deleted, or a file removed by hand, is seen then).
#[derive(Default)]
pub struct PackageQuota {
    /// A std Mutex: held only to count, never across an await.
    ledger: std::sync::Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    finished: u64,
    in_flight: u64,
    uploads: usize,
}

impl PackageQuota {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts an upload's reservation (none of its bytes yet).
    async fn begin(self: &Arc<Self>, dir: &Path) -> Reservation {
        let first = {
            let mut ledger = self.ledger();
            ledger.uploads += 1;
            ledger.uploads == 1
        };
        if first {
            let finished = finished_bytes(dir).await;
            self.ledger().finished = finished;
        }
        Reservation {
            quota: self.clone(),
            held: 0,
        }
    }
}

/// The bytes one upload holds of the quota; given back when it is dropped
/// unless [`Reservation::keep`] made them a finished package's.
struct Reservation {
    quota: Arc<PackageQuota>,
    held: u64,
}

impl Reservation {
    /// Takes `bytes` more, if the quota has room: else the bytes in use.
    fn grow(&mut self, bytes: u64, quota: u64) -> Result<(), u64> {
        let mut ledger = self.quota.ledger();
        let used = ledger.finished.saturating_add(ledger.in_flight);
        if used.saturating_add(bytes) > quota {
            return Err(used);
        }
        ledger.in_flight += bytes;
        self.held += bytes;
        Ok(())
    }

    /// The upload became a package in the store: its bytes are finished.
    fn keep(mut self) {
        let mut ledger = self.quota.ledger();
        ledger.in_flight = ledger.in_flight.saturating_sub(self.held);
        ledger.finished = ledger.finished.saturating_add(self.held);
        self.held = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut ledger = self.quota.ledger();
        ledger.in_flight = ledger.in_flight.saturating_sub(self.held);
        ledger.uploads = ledger.uploads.saturating_sub(1);
    }
}

/// How the store's directory is named to clients and in the audit log:
/// never the data directory's path.
const SHOWN_DIR: &str = "DATA/packages";

/// Streams an upload into the store: the file under its checksum, then the
/// record (create-only: the same file again is a no-op, another file under
/// the same name, version and architecture is a conflict).
/// The answers name no path of the control plane's host (dpkg-deb's
/// message names the partial file): a path is the data directory's, and
/// the audit log, which every viewer reads, keeps an error's reason.
pub async fn upload(
    db: &Db,
    data: &Path,
    limits: UploadLimits,
    quota: &Arc<PackageQuota>,
    body: Body,
) -> Result<(PackageRecord, bool), ApiError> {
    let shown = data.display().to_string();
    upload_into(db, data, limits, quota, body)
        .await
        .map_err(|ApiError(status, message)| {
            if !message.contains(&shown) {
                return ApiError(status, message);
            }
            tracing::warn!(error = %message, "upload refused");
            ApiError(status, message.replace(&shown, "DATA"))
        })
}

async fn upload_into(
    db: &Db,
    data: &Path,
    limits: UploadLimits,
    quota: &Arc<PackageQuota>,
    body: Body,
) -> Result<(PackageRecord, bool), ApiError> {
    let dir = blob_dir(data);
    tokio::fs::create_dir_all(&dir).await.map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot create {SHOWN_DIR}: {e}"),
        )
    })?;
    let mut reservation = quota.begin(&dir).await;
    let tmp = tempfile::Builder::new()
        .prefix(PARTIAL_PREFIX)
        .suffix(".deb")
        .tempfile_in(&dir)
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot write in {SHOWN_DIR}: {e}"),
            )
        })?;
    let io_error = |e: std::io::Error| {
        ApiError(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("cannot store the upload: {e}"),
        )
    };
    let mut file = tokio::fs::File::from_std(tmp.reopen().map_err(io_error)?);
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    loop {
        let chunk = match tokio::time::timeout(limits.stall, stream.next()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    received = size,
                    "an upload sent nothing for {:?}; cut off",
                    limits.stall
                );
                return Err(ApiError(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the upload stalled: no bytes for {} s after {size} bytes; send it again",
                        limits.stall.as_secs()
                    ),
                ));
            }
        };
        let chunk = chunk.map_err(|e| bad(format!("the upload broke off: {e}")))?;
        size += chunk.len() as u64;
        if size > MAX_UPLOAD_BYTES {
            return Err(ApiError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a package may be at most {MAX_UPLOAD_BYTES} bytes"),
            ));
        }
        if let Err(used) = reservation.grow(chunk.len() as u64, limits.quota) {
            drop((file, tmp, reservation));
            drain_refused(&mut stream, size, limits.stall).await;
            return Err(ApiError(
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "the package store is full: {used} bytes are stored or being uploaded and its \
                     quota is {} bytes (drover serve --package-quota); raise the quota or delete \
                     packages (drover delete package ID)",
                    limits.quota,
                ),
            ));
        }
        digest.update(&chunk);
        file.write_all(&chunk).await.map_err(io_error)?;
    }
    file.sync_all().await.map_err(io_error)?;
    drop(file);
    if size == 0 {
        return Err(bad(
            "the upload is empty; send the .deb file as the request body",
        ));
    }
    let sha256 = hex(digest.finish().as_ref());
    let (name, version, architecture) = crate::debcontrol::fields(tmp.path()).await?;
    let record = PackageRecord {
        id: package_id(&name, &version, &architecture),
        name,
        version,
        architecture,
        sha256: sha256.clone(),
        size,
        uploaded_at: Timestamp::now(),
    };
    record.job().check().map_err(bad)?;
    let key = package_key(&record.id);
    if let Some((_, existing)) = db.get::<PackageRecord>(&key).await? {
        return if existing.sha256 == record.sha256 {
            Ok((existing, false))
        } else {
            Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "package {} is already in the store with another file (sha256 {}); \
                     a name, version and architecture name one file forever: give the new one a new version",
                    record.id, existing.sha256
                ),
            ))
        };
    }
    let path = dir.join(format!("{sha256}.deb"));
    tmp.persist(&path).map_err(|e| io_error(e.error))?;
    reservation.keep();
    if let Ok(dir) = std::fs::File::open(&dir) {
        let _ = dir.sync_all();
    }
    match db.put(&key, &record, 0).await {
        Ok(_) => Ok((record, true)),
        Err(DbError::Kv(e)) if e.is_conflict() => {
            // Another upload of the same id won the race: the same answer as above.
            Box::pin(upload_check(db, record)).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads and drops the rest of a refused upload before it is answered.
/// A server that closes a connection with bytes still unread resets it, and
/// a client cut off while it is still sending reports a broken pipe instead
/// of the refusal. Bounded as an upload is: [`MAX_UPLOAD_BYTES`] in all,
/// and no more than the stall timeout between two chunks.
async fn drain_refused(
    stream: &mut axum::body::BodyDataStream,
    mut size: u64,
    stall: std::time::Duration,
) {
    while size <= MAX_UPLOAD_BYTES {
        match tokio::time::timeout(stall, stream.next()).await {
            Ok(Some(Ok(chunk))) => size += chunk.len() as u64,
            _ => return,
        }
    }
}

async fn upload_check(db: &Db, record: PackageRecord) -> Result<(PackageRecord, bool), ApiError> {
    match db.get::<PackageRecord>(&package_key(&record.id)).await? {
        Some((_, existing)) if existing.sha256 == record.sha256 => Ok((existing, false)),
        _ => Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "package {} was stored with another file meanwhile",
                record.id
            ),
        )),
    }
}

#[derive(Clone)]
pub struct DownloadState {
    pub db: Db,
    pub secrets: Arc<Secrets>,
    pub downloads: Arc<Downloads>,
}

/// The routes of the download listener, for agents.
pub fn download_router(state: DownloadState) -> Router {
    Router::new()
        .route("/api/agent/v1/packages/{id}/file", get(download))
        .route("/api/agent/v1/packages/{id}/download-url", get(refresh))
        .with_state(state)
}

#[derive(Deserialize)]
struct LinkQuery {
    device: String,
    #[serde(default)]
    generation: u64,
    expires: i64,
    sig: String,
}

/// Whether `package` was given to `device`: one of its jobs, of a run or a
/// deployment, installs it. A device gets links to those packages only.
async fn given_to(db: &Db, device: &DeviceId, package: &str) -> Result<bool, DbError> {
    Ok(db
        .list::<drover_rules::records::JobDelivery>(&drover_rules::records::device_jobs_prefix(device))
        .await?
        .iter()
        .any(|(_, _, job)| {
            matches!(&job.intent.kind, drover_model::model::JobKind::PackageInstallV1(p) if p.package == package)
        }))
}

/// Whether `device` may still download at `generation`: registered, not
/// decommissioned, and its token not rotated since.
async fn device_current(db: &Db, device: &DeviceId, generation: u64) -> Result<bool, DbError> {
    let live = matches!(
        db.get::<DeviceRecord>(&device_key(device)).await?,
        Some((_, record)) if !record.decommissioned
    );
    Ok(live && crate::device_tokens::generation(db, device).await? == generation)
}

async fn download(
    State(state): State<DownloadState>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<LinkQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let refused = || ApiError(StatusCode::FORBIDDEN, "the link is not valid".into());
    let device = DeviceId::new(query.device).map_err(|_| refused())?;
    if !state
        .secrets
        .verify_link(&id, &device, query.generation, query.expires, &query.sig)
    {
        return Err(refused());
    }
    if Timestamp::now().as_second() >= query.expires {
        return Err(ApiError(
            StatusCode::GONE,
            "the link expired; ask for a fresh one".into(),
        ));
    }
    // A link outlives neither the device's token nor the device, and opens
    // only a package given to it.
    if !device_current(&state.db, &device, query.generation).await?
        || !given_to(&state.db, &device, &id).await?
    {
        return Err(refused());
    }
    let Some((_, package)) = state.db.get::<PackageRecord>(&package_key(&id)).await? else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("package {id} not found"),
        ));
    };
    let path = state.downloads.dir.join(format!("{}.deb", package.sha256));
    let response = tower_http::services::ServeFile::new(path)
        .try_call(request)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(response.map(Body::new))
}

#[derive(Deserialize)]
struct DeviceQuery {
    device: String,
}

async fn refresh(
    State(state): State<DownloadState>,
    UrlPath(id): UrlPath<String>,
    Query(DeviceQuery { device }): Query<DeviceQuery>,
    request: Request,
) -> Result<Json<DownloadLink>, ApiError> {
    let refused = || {
        ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or bad device token (Authorization: Bearer <token>)".into(),
        )
    };
    let device = DeviceId::new(device).map_err(|_| refused())?;
    let generation = crate::device_tokens::generation(&state.db, &device).await?;
    if !state
        .secrets
        .verify_device_at(&device, generation, bearer(&request))
    {
        return Err(refused());
    }
    if !device_current(&state.db, &device, generation).await? {
        return Err(refused());
    }
    if state
        .db
        .get::<PackageRecord>(&package_key(&id))
        .await?
        .is_none()
    {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("package {id} not found"),
        ));
    }
    if !given_to(&state.db, &device, &id).await? {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!("package {id} was not given to device {device}: no job of it installs it"),
        ));
    }
    Ok(Json(state.downloads.link(
        &id,
        &device,
        generation,
        Timestamp::now(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_operators_write_them() {
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("500 MiB"), Ok(500 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("ten").unwrap_err().contains("not a size"));
        assert!(
            parse_size("5 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("99999999TiB").unwrap_err().contains("too large"));
    }
}
