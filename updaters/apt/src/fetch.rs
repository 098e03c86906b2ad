//! Downloads for `PackageInstallV1`: one HTTP/1.1 GET (hyper) over TCP or
//! rustls, appending to a partial file and resuming it with a `Range`
//! request, bounded by the package's size; and the refresh of an expired
//! link. The file's checksum is checked by the caller, not here.

use drover_model::model::DownloadLink;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Longest wait for the server to connect, answer, or send the next bytes.
const IDLE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server refused the link: it expired, or its signature no longer holds.
    #[error("the download link was refused ({0}); it may have expired")]
    Refused(StatusCode),
    #[error("{0}")]
    Failed(String),
}

fn failed(what: impl std::fmt::Display) -> FetchError {
    FetchError::Failed(what.to_string())
}

/// How the agent reaches the control plane's package downloads.
#[derive(Clone)]
pub struct Fetcher {
    /// Trust for `https://` links; without it only `http://` to loopback works.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub device_id: String,
    /// The device's token, for refreshing a link.
    pub token: Option<String>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("tls", &self.tls.is_some())
            .field("device_id", &self.device_id)
            .finish_non_exhaustive()
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Fetcher {
    async fn get(
        &self,
        url: &str,
        headers: &[(&str, String)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, FetchError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| failed(format!("bad link {url:?}: {e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| failed(format!("link {url:?} names no host")))?
            .to_owned();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") if is_loopback(&host) => false,
            _ => {
                return Err(failed(format!(
                    "refusing link {url:?}: only https://, or http:// to loopback"
                )));
            }
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = tokio::time::timeout(IDLE, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| failed(format!("no connection to {host}:{port} within {IDLE:?}")))?
            .map_err(|e| failed(format!("cannot connect to {host}:{port}: {e}")))?;
        let stream: Box<dyn Io> = if https {
            let config = self.tls.clone().ok_or_else(|| {
                failed("an https:// link needs a CA file (download_ca_file or the transport's ca_file)")
            })?;
            let name = rustls::pki_types::ServerName::try_from(
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
            )
            .map_err(|e| failed(format!("bad host {host:?}: {e}")))?;
            let tls = tokio::time::timeout(
                IDLE,
                tokio_rustls::TlsConnector::from(config).connect(name, tcp),
            )
            .await
            .map_err(|_| failed("TLS handshake timed out"))?
            .map_err(|e| failed(format!("TLS with {host}:{port} failed: {e}")))?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(format!("HTTP handshake with {host}:{port}: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = Request::get(path).header("host", format!("{host}:{port}"));
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(format!("bad request: {e}")))?;
        let response = tokio::time::timeout(IDLE, sender.send_request(request))
            .await
            .map_err(|_| failed(format!("{host}:{port} did not answer within {IDLE:?}")))?
            .map_err(|e| failed(format!("request to {host}:{port} failed: {e}")))?;
        match response.status() {
            StatusCode::FORBIDDEN | StatusCode::GONE | StatusCode::UNAUTHORIZED => {
                Err(FetchError::Refused(response.status()))
            }
            _ => Ok(response),
        }
    }

    /// Brings `part` to `size` bytes from `url`, continuing from what it
    /// already holds. Never writes more than `size` bytes.
    pub async fn download(&self, url: &str, part: &Path, size: u64) -> Result<(), FetchError> {
        let have = tokio::fs::metadata(part).await.map_or(0, |m| m.len());
        if have > size {
            tokio::fs::remove_file(part).await.map_err(failed)?;
            return Box::pin(self.download(url, part, size)).await;
        }
        if have == size {
            return Ok(());
        }
        let range = [("range", format!("bytes={have}-"))];
        let headers: &[(&str, String)] = if have > 0 { &range } else { &[] };
        let response = self.get(url, headers).await?;
        let offset = match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                tracing::info!(from_byte = have, size, "download resumed");
                have
            }
            StatusCode::OK => 0,
            status => return Err(failed(format!("the package server answered {status}"))),
        };
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(offset == 0)
            .append(offset > 0)
            .open(part)
            .await
            .map_err(|e| failed(format!("cannot write {}: {e}", part.display())))?;
        let mut written = offset;
        let mut body = response.into_body();
        loop {
            let frame = tokio::time::timeout(IDLE, body.frame())
                .await
                .map_err(|_| failed(format!("no bytes for {IDLE:?}; the download stalled")))?;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| failed(format!("the download broke off: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            written += data.len() as u64;
            if written > size {
                return Err(failed(format!(
                    "the server sent more than the package's {size} bytes"
                )));
            }
            file.write_all(&data)
                .await
                .map_err(|e| failed(format!("cannot write {}: {e}", part.display())))?;
        }
        file.sync_all()
            .await
            .map_err(|e| failed(format!("cannot sync {}: {e}", part.display())))?;
        if written < size {
            return Err(failed(format!(
                "the download ended at {written} of {size} bytes"
            )));
        }
        Ok(())
    }

    /// A fresh link for `package`, asked of the server that gave `old`.
    pub async fn refresh(&self, old: &str, package: &str) -> Result<DownloadLink, FetchError> {
        let token = self
            .token
            .clone()
            .ok_or_else(|| failed("no device token to refresh the download link with"))?;
        let uri: Uri = old
            .parse()
            .map_err(|e| failed(format!("bad link {old:?}: {e}")))?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(failed(format!("link {old:?} is not absolute")));
        };
        let url = format!(
            "{scheme}://{authority}/api/agent/v1/packages/{package}/download-url?device={}",
            self.device_id
        );
        let response = self
            .get(&url, &[("authorization", format!("Bearer {token}"))])
            .await?;
        if response.status() != StatusCode::OK {
            return Err(failed(format!(
                "refreshing the download link: the server answered {}",
                response.status()
            )));
        }
        let body = tokio::time::timeout(
            IDLE,
            http_body_util::Limited::new(response.into_body(), 8192).collect(),
        )
        .await
        .map_err(|_| failed("refreshing the download link timed out"))?
        .map_err(|e| failed(format!("refreshing the download link: {e}")))?
        .to_bytes();
        serde_json::from_slice(&body)
            .map_err(|e| failed(format!("refreshing the download link: bad answer: {e}")))
    }
}

/// Hex SHA-256 of a file, read in 64 KiB blocks.
pub async fn sha256_file(path: &Path) -> std::io::Result<(u64, String)> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(path).await?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        context.update(&buffer[..n]);
    }
    let digest = context.finish();
    Ok((
        total,
        digest.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
    ))
}
