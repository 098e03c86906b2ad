//! `GET /devices/{id}/logs`: a job's whole output, fetched from the device
//! through its transport on demand and streamed as it comes
//! (`drover logs DEVICE [JOB]`). Nothing of it is kept here: the device
//! keeps its output (bounded), and the control plane only passes it on.

use super::*;
use drover_contract::logs::{AskError, LogStream};
use drover_model::logs::{LogChunk, LogRequest, Refusal};
use std::time::Duration;

/// How long a device may take for its first chunk, and between chunks,
/// unless the request asks for less or more (`wait`, at most
/// [`MAX_WAIT_SECONDS`]).
pub const WAIT_SECONDS: u64 = 30;
pub const MAX_WAIT_SECONDS: u64 = 120;

#[derive(Deserialize)]
pub(super) struct LogsQuery {
    /// A job id or its start; the job whose output is newest when absent.
    job: Option<String>,
    /// Only the last lines.
    tail: Option<u32>,
    /// Seconds to wait for the device.
    wait: Option<u64>,
}

pub(super) async fn device_logs(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(query): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    let id = DeviceId::new(id).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let bad = |why: String| ApiError(StatusCode::BAD_REQUEST, why);
    LogRequest {
        request: 0,
        job: query.job.clone(),
        tail: query.tail,
    }
    .check()
    .map_err(bad)?;
    let wait = query.wait.unwrap_or(WAIT_SECONDS);
    if !(1..=MAX_WAIT_SECONDS).contains(&wait) {
        return Err(bad(format!("wait is 1 to {MAX_WAIT_SECONDS} seconds")));
    }
    let wait = Duration::from_secs(wait);
    let Some((_, device)) = state.db.get::<DeviceRecord>(&device_key(&id)).await? else {
        return Err(not_found(format!("device {id}")));
    };
    let unavailable = |why: String| ApiError(StatusCode::SERVICE_UNAVAILABLE, why);
    let Some(transport) = device.transport.as_deref() else {
        return Err(unavailable(format!(
            "device {id} has never connected, so it has no job output to fetch"
        )));
    };
    let link = state
        .links
        .iter()
        .find(|link| link.transport().as_str() == transport)
        .ok_or_else(|| {
            unavailable(format!(
                "device {id} last spoke over {transport}, which this control plane does not serve"
            ))
        })?;
    let mut stream = link
        .logs(&id, query.job, query.tail)
        .await
        .map_err(|e| match e {
            AskError::NotConnected => unavailable(format!(
                "device {id} is not connected to this control plane over {transport} (offline, \
                 or connected to another replica)"
            )),
            AskError::TooMany => ApiError(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
            AskError::Unsupported(_) => ApiError(StatusCode::NOT_IMPLEMENTED, e.to_string()),
            AskError::Link(e) => ApiError(StatusCode::BAD_GATEWAY, e),
        })?;
    let first = next(&mut stream, wait).await.map_err(|why| {
        let status = if why.timed_out {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::BAD_GATEWAY
        };
        ApiError(status, format!("device {id}: {}", why.text))
    })?;
    if let Some(refused) = first.refused {
        let status = match refused {
            Refusal::NoSuchJob => StatusCode::NOT_FOUND,
            Refusal::Ambiguous | Refusal::BadRequest => StatusCode::BAD_REQUEST,
            Refusal::Busy => StatusCode::TOO_MANY_REQUESTS,
            Refusal::NotKept => StatusCode::NOT_IMPLEMENTED,
            Refusal::Other => StatusCode::BAD_GATEWAY,
        };
        let words = first.message.unwrap_or_else(|| format!("{refused:?}"));
        return Err(ApiError(
            status,
            format!("device {id}: {}", drover_model::reason::plain(&words)),
        ));
    }
    let done = first.done;
    let body = futures_util::stream::unfold(
        (Some(first), stream, done),
        move |(first, mut stream, done)| async move {
            if let Some(chunk) = first {
                return Some((Ok(chunk.text.into_bytes()), (None, stream, done)));
            }
            if done {
                return None;
            }
            match next(&mut stream, wait).await {
                Ok(chunk) => {
                    let done = chunk.done;
                    Some((Ok(chunk.text.into_bytes()), (None, stream, done)))
                }
                // Cut off: the body ends without its last chunk, so a
                // client sees an error rather than a short log.
                Err(why) => Some((Err(std::io::Error::other(why.text)), (None, stream, true))),
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

struct Broke {
    text: String,
    timed_out: bool,
}

/// The next chunk within `wait`, or why there is none.
async fn next(stream: &mut LogStream, wait: Duration) -> Result<LogChunk, Broke> {
    match tokio::time::timeout(wait, stream.next()).await {
        Ok(Some(Ok(chunk))) => Ok(chunk),
        Ok(Some(Err(why))) => Err(Broke {
            text: why,
            timed_out: false,
        }),
        Ok(None) => Err(Broke {
            text: "the answer ended before its last chunk".into(),
            timed_out: false,
        }),
        Err(_) => Err(Broke {
            text: format!(
                "no answer from the device within {} s (offline, an agent older than log \
                 requests, or a broker whose permissions predate them: run `drover \
                 nats-config` or `drover mqtt-config` again)",
                wait.as_secs()
            ),
            timed_out: true,
        }),
    }
}
