//! The job record's layouts: each old one frozen, migrated on read.

use super::Record;
use crate::records::{Delivery, JobDelivery};
use drover_model::layout::{JobStatusV1, JobStatusV2};
use drover_model::model::Intent;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// A job record as stored: V1 until the control plane recorded its own
/// receive time of the terminal status (A12), V2 until an operator could
/// cancel a job, V3 until statuses carried their failure, V4 until they
/// carried their reason lines, V5 since.
#[derive(Serialize, Deserialize)]
pub(super) enum StoredJob {
    V1(JobV1),
    V2(JobV2),
    V3(JobV3),
    V4(JobV4),
    V5(JobDelivery),
}

/// Frozen: the layout written before V2. Never change it.
#[derive(Serialize, Deserialize)]
pub(super) struct JobV1 {
    intent: Intent,
    run: Option<String>,
    delivery: Delivery,
    status: Option<JobStatusV1>,
    created_at: Timestamp,
}

/// Frozen: the layout written before V3. Never change it.
#[derive(Serialize, Deserialize)]
pub(super) struct JobV2 {
    intent: Intent,
    run: Option<String>,
    delivery: Delivery,
    status: Option<JobStatusV1>,
    created_at: Timestamp,
    terminal_received_at: Option<Timestamp>,
}

/// Frozen: the layout written before V4. Never change it.
#[derive(Serialize, Deserialize)]
pub(super) struct JobV3 {
    pub(super) intent: Intent,
    pub(super) run: Option<String>,
    pub(super) delivery: Delivery,
    pub(super) status: Option<JobStatusV1>,
    pub(super) created_at: Timestamp,
    pub(super) terminal_received_at: Option<Timestamp>,
    pub(super) cancel_requested_at: Option<Timestamp>,
}

/// Frozen: the layout written before V5. Never change it.
#[derive(Serialize, Deserialize)]
pub(super) struct JobV4 {
    intent: Intent,
    run: Option<String>,
    delivery: Delivery,
    status: Option<JobStatusV2>,
    created_at: Timestamp,
    terminal_received_at: Option<Timestamp>,
    cancel_requested_at: Option<Timestamp>,
}

impl Record for JobDelivery {
    /// V5 is the record itself, whose status is the wire's type: a change
    /// to either changes these bytes, and `a_v5_job_record_decodes_and_is_still_written_alike`
    /// fails until the change adds V6 and freezes V5's shape.
    fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_stdvec(&StoredJob::V5(self.clone()))
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, postcard::Error> {
        Ok(match postcard::from_bytes(bytes)? {
            // V1 never recorded when the control plane received a result;
            // such a record is judged as before (see the server's engine::runs::outcome_of).
            StoredJob::V1(v1) => JobDelivery {
                intent: v1.intent,
                run: v1.run,
                delivery: v1.delivery,
                status: v1.status.map(Into::into),
                created_at: v1.created_at,
                terminal_received_at: None,
                cancel_requested_at: None,
            },
            StoredJob::V2(v2) => JobDelivery {
                intent: v2.intent,
                run: v2.run,
                delivery: v2.delivery,
                status: v2.status.map(Into::into),
                created_at: v2.created_at,
                terminal_received_at: v2.terminal_received_at,
                cancel_requested_at: None,
            },
            StoredJob::V3(v3) => JobDelivery {
                intent: v3.intent,
                run: v3.run,
                delivery: v3.delivery,
                status: v3.status.map(Into::into),
                created_at: v3.created_at,
                terminal_received_at: v3.terminal_received_at,
                cancel_requested_at: v3.cancel_requested_at,
            },
            StoredJob::V4(v4) => JobDelivery {
                intent: v4.intent,
                run: v4.run,
                delivery: v4.delivery,
                status: v4.status.map(Into::into),
                created_at: v4.created_at,
                terminal_received_at: v4.terminal_received_at,
                cancel_requested_at: v4.cancel_requested_at,
            },
            StoredJob::V5(v5) => v5,
        })
    }
}
