//! The control plane's HTTP listeners (the operators' API and package
//! downloads): every connection holds a slot of the listener's
//! [`Admission`] (a few per address while in its TLS handshake, a bounded
//! number per address and in all after it), has [`HANDSHAKE_TIMEOUT`] for
//! its TLS handshake and [`HEADER_TIMEOUT`] for each request's headers, and
//! is closed after [`IDLE_TIMEOUT`] without a byte either way, so a stall
//! mid-upload ends too. Idle or half-sent sockets exhaust only their own
//! address's slots.

use drover_net::admission::{Admission, Established};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Time a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no byte in either direction for this long is closed:
/// an idle keep-alive connection, a stalled upload or download. The
/// dashboard's event stream sends a keep-alive every 15 s.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `router` on `listener` until `shutdown`, over TLS when `tls` is
/// given, within `admission`'s limits.
pub async fn serve(
    what: &'static str,
    listener: TcpListener,
    tls: Option<drover_net::tls::Acceptor>,
    router: axum::Router,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
) {
    // The connections, so that serving ends only once each has finished
    // what it was answering (each gets a graceful shutdown of at most 5 s):
    // a request whose write the store refused still gets its 503 before the
    // process exits.
    let mut connections = tokio::task::JoinSet::new();
    while let Some((tcp, peer, pending)) = admission.accept(what, &listener, &shutdown).await {
        while connections.try_join_next().is_some() {}
        let (tls, router, shutdown, admission) = (
            tls.clone(),
            router.clone(),
            shutdown.clone(),
            admission.clone(),
        );
        connections.spawn(async move {
            let _ = tcp.set_nodelay(true);
            let established = |pending: drover_net::admission::Pending| match pending.establish() {
                Ok(slot) => Some(slot),
                Err(why) => {
                    let refused = admission.refused();
                    if refused.is_power_of_two() {
                        warn!(%peer, refused, reason = %why, "{what}: connection closed");
                    }
                    None
                }
            };
            match tls {
                Some(acceptor) => {
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "{what}: TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "{what}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                            return;
                        }
                    };
                    let Some(slot) = established(pending) else {
                        return;
                    };
                    connection(stream, peer, router, slot, shutdown).await;
                }
                None => {
                    let Some(slot) = established(pending) else {
                        return;
                    };
                    connection(tcp, peer, router, slot, shutdown).await;
                }
            }
        });
    }
    while connections.join_next().await.is_some() {}
}

/// One connection's requests, until it ends, idles out or `shutdown`.
async fn connection<S>(
    stream: S,
    peer: std::net::SocketAddr,
    router: axum::Router,
    _slot: Established,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let last = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let io = Activity {
        inner: stream,
        last: last.clone(),
        started,
    };
    // Each request carries the client's address (axum's ConnectInfo):
    // failed logins are counted and logged per address.
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            tower_service::Service::call(&mut router.clone(), request)
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    loop {
        let idle_until =
            started + Duration::from_millis(last.load(Ordering::Relaxed)) + IDLE_TIMEOUT;
        tokio::select! {
            result = &mut served => {
                if let Err(e) = result {
                    debug!(error = %e, "connection ended");
                }
                return;
            }
            _ = tokio::time::sleep_until(idle_until) => {
                let moved = started + Duration::from_millis(last.load(Ordering::Relaxed));
                if moved + IDLE_TIMEOUT <= tokio::time::Instant::now() {
                    debug!("connection idle for {IDLE_TIMEOUT:?}; closed");
                    return;
                }
            }
            _ = shutdown.cancelled() => {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut served).await;
                return;
            }
        }
    }
}

/// A stream that notes when a byte last went either way (milliseconds
/// since `started`).
struct Activity<S> {
    inner: S,
    last: Arc<AtomicU64>,
    started: tokio::time::Instant,
}

impl<S> Activity<S> {
    fn moved(&self) {
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(millis, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Activity<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Activity<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The first certificate in a PEM file (a server's own comes first).
fn first_certificate(
    path: &std::path::Path,
) -> anyhow::Result<rustls::pki_types::CertificateDer<'static>> {
    use anyhow::Context as _;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(path)
        .and_then(|mut certs| certs.next().transpose())
        .with_context(|| format!("cannot read a certificate from {}", path.display()))?
        .with_context(|| format!("no PEM certificate in {}", path.display()))
}

/// The DNS names in the subject alternative names of a server's
/// certificate: the names clients reach this server by and verify it under.
pub fn certificate_dns_names(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let cert = first_certificate(path)?;
    let parsed = webpki::EndEntityCert::try_from(&cert)
        .map_err(|e| anyhow::anyhow!("cannot parse the certificate in {}: {e}", path.display()))?;
    Ok(parsed.valid_dns_names().map(str::to_owned).collect())
}

/// Of `names` (DNS names or IP addresses), those a server's certificate is
/// not valid for, as a client would judge it.
pub fn certificate_lacks(path: &std::path::Path, names: &[String]) -> anyhow::Result<Vec<String>> {
    use rustls::pki_types::ServerName;
    let cert = first_certificate(path)?;
    let parsed = webpki::EndEntityCert::try_from(&cert)
        .map_err(|e| anyhow::anyhow!("cannot parse the certificate in {}: {e}", path.display()))?;
    Ok(names
        .iter()
        .filter(|name| {
            ServerName::try_from(name.as_str())
                .map(|server| parsed.verify_is_valid_for_subject_name(&server).is_err())
                .unwrap_or(true)
        })
        .cloned()
        .collect())
}
