//! The local status socket: a Unix socket speaking one JSON request and one
//! JSON response per line, mode 0660 so only root and the agent's group can
//! ask. `drover-agent status` and `drover-agent jobs` are its clients.

use crate::executor::{Agent, AgentInfo};
use drover_model::JobId;
use drover_model::model::{JobKind, JobStatus};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

const MAX_REQUEST_BYTES: usize = 4096;
/// Clients served at once, apart from root and the agent's own user, who
/// have slots of their own: readers of the status group cannot lock them out.
const MAX_CONNECTIONS: usize = 8;
const PRIVILEGED_CONNECTIONS: usize = 2;
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client may take to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Upper bound of jobs one `jobs` request returns.
pub const MAX_JOBS_LISTED: usize = 200;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "camelCase")]
pub enum Request {
    Status,
    Jobs {
        limit: Option<usize>,
    },
    /// One job's status.
    #[serde(rename_all = "camelCase")]
    Job {
        job_id: JobId,
    },
    /// Queue a local system upgrade (root or the agent's own user only).
    Upgrade,
    /// Continue a failed local upgrade from its failed step (root or the agent's own user only).
    #[serde(rename_all = "camelCase")]
    Resume {
        job_id: JobId,
    },
    /// Queue a local patch assessment (root or the agent's own user only:
    /// it refreshes apt's lists). (Appended.)
    Assess,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Response {
    Status(Box<AgentInfo>),
    Jobs(Vec<JobStatus>),
    Job(Box<JobStatus>),
    Error(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot bind the status socket {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot reach the agent's status socket {path}: {source} (is drover-agent running, and may this user read the socket?)"
    )]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("status socket I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unreadable answer from the agent: {0}")]
    Decode(#[from] serde_json::Error),
}

/// Binds the socket (replacing a stale one), gives it to group `gid` when
/// set (the group whose members may read status), and serves until `shutdown`.
pub async fn serve(
    path: &Path,
    gid: Option<u32>,
    agent: Arc<Agent>,
    shutdown: CancellationToken,
) -> Result<(), SocketError> {
    let bind_error = |source| SocketError::Bind {
        path: path.display().to_string(),
        source,
    };
    if path.exists() {
        std::fs::remove_file(path).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(bind_error)?;
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let privileged_slots = Arc::new(Semaphore::new(PRIVILEGED_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                warn!(error = %e, "status socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let pool = if privileged(&stream) {
            &privileged_slots
        } else {
            &slots
        };
        let Ok(permit) = pool.clone().try_acquire_owned() else {
            debug!("status socket busy; turning a client away");
            tokio::spawn(async move {
                let busy = Response::Error(format!(
                    "the agent's status socket is busy ({MAX_CONNECTIONS} clients at once); try again"
                ));
                let mut stream = stream;
                if let Ok(mut bytes) = serde_json::to_vec(&busy) {
                    bytes.push(b'\n');
                    let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(&bytes)).await;
                }
            });
            continue;
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(IO_TIMEOUT, answer(stream, &agent)).await {
                debug!(error = %e, "status socket client timed out");
            }
            drop(permit);
        });
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// Whether the peer may change things: root, or the user the agent runs as.
fn privileged(stream: &UnixStream) -> bool {
    use std::os::unix::fs::MetadataExt;
    let own_uid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    match stream.peer_cred() {
        Ok(cred) => cred.uid() == 0 || Some(cred.uid()) == own_uid,
        Err(_) => false,
    }
}

async fn answer(stream: UnixStream, agent: &Agent) -> Result<(), std::io::Error> {
    let may_change = privileged(&stream);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES as u64));
    let mut line = String::new();
    match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await {
        Ok(read) => {
            read?;
        }
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no request line in time",
            ));
        }
    }
    let response = match serde_json::from_str::<Request>(line.trim()) {
        Err(e) => Response::Error(format!(
            "bad request (expected {{\"request\":\"status\"}}, \"jobs\", \"job\", \"upgrade\", \"resume\" or \"assess\"): {e}"
        )),
        Ok(Request::Status) => match agent.info() {
            Ok(info) => Response::Status(Box::new(info)),
            Err(e) => Response::Error(e.to_string()),
        },
        Ok(Request::Jobs { limit }) => {
            let limit = limit.unwrap_or(20).min(MAX_JOBS_LISTED);
            match agent.recent_jobs(limit) {
                Ok(jobs) => Response::Jobs(jobs),
                Err(e) => Response::Error(e.to_string()),
            }
        }
        Ok(Request::Job { job_id }) => match agent.job(job_id) {
            Ok(Some(status)) => Response::Job(Box::new(status)),
            Ok(None) => Response::Error(format!("no job {job_id} on this device")),
            Err(e) => Response::Error(e.to_string()),
        },
        Ok(Request::Upgrade | Request::Resume { .. } | Request::Assess) if !may_change => {
            Response::Error(
                "only root or the agent's user may start or resume an upgrade or an assessment"
                    .into(),
            )
        }
        Ok(Request::Assess) => match agent.admit_local(JobKind::patch_assessment()) {
            Ok(reply) => Response::Job(Box::new(reply.status)),
            Err(e) => Response::Error(e.to_string()),
        },
        Ok(Request::Upgrade) => match agent.admit_local(JobKind::system_upgrade()) {
            Ok(reply) => Response::Job(Box::new(reply.status)),
            Err(e) => Response::Error(e.to_string()),
        },
        Ok(Request::Resume { job_id }) => match agent.resume_local(job_id) {
            Ok(status) => Response::Job(Box::new(status)),
            Err(e) => Response::Error(e.to_string()),
        },
    };
    let mut bytes = serde_json::to_vec(&response).unwrap_or_else(|e| {
        format!("{{\"error\":\"cannot encode the answer: {e}\"}}").into_bytes()
    });
    bytes.push(b'\n');
    write.write_all(&bytes).await?;
    write.shutdown().await
}

/// Sends one request to the agent's socket and returns its answer.
pub async fn request(path: &Path, request: &Request) -> Result<Response, SocketError> {
    let exchange = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| SocketError::Connect {
                path: path.display().to_string(),
                source,
            })?;
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        // A busy agent answers without reading: read its answer even when
        // the write found the socket closed.
        let _ = write.write_all(&line).await;
        let mut answer = String::new();
        BufReader::new(read).read_line(&mut answer).await?;
        if answer.trim().is_empty() {
            return Err(SocketError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the agent closed the connection without answering",
            )));
        }
        Ok::<_, SocketError>(serde_json::from_str(answer.trim())?)
    };
    tokio::time::timeout(IO_TIMEOUT, exchange)
        .await
        .map_err(|_| SocketError::Timeout(IO_TIMEOUT))?
}
