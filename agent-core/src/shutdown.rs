//! How a daemon learns it should stop: SIGTERM (systemd) or Ctrl-C. The
//! binaries turn this into a cancellation token that every task watches.

/// Resolves on SIGTERM or Ctrl-C.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
