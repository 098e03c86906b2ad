//! TaskSchedules as the API shows them, and the package store's entries.

use crate::runs::{ObjectMeta, TaskRunSpec};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A TaskSchedule: runs made from a template on a cadence, in UTC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskSchedule {
    pub api_version: String,
    /// `TaskSchedule`.
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: TaskScheduleSpec,
    pub status: TaskScheduleStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskScheduleSpec {
    pub schedule: Cadence,
    pub suspend: bool,
    pub template: RunTemplate,
    pub successful_runs_history_limit: u32,
    pub failed_runs_history_limit: u32,
}

/// When a schedule ticks, in UTC: one of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Cadence {
    /// Every day at `HH:MM`.
    Daily(String),
    /// Every week on a day (`mon` … `sun`) at `HH:MM`.
    Weekly { day: String, at: String },
    /// Every year on `MM-DD` at `HH:MM`.
    Yearly { date: String, at: String },
    /// A five-field cron expression.
    Cron(String),
}

/// The run each tick makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunTemplate {
    pub spec: TaskRunSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskScheduleStatus {
    /// The latest tick looked at.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_tick: Option<Timestamp>,
    /// The next tick (none while suspended).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_tick: Option<Timestamp>,
    /// The run made for the latest tick that got one.
    pub last_run: Option<String>,
    /// That run while it is not finished.
    pub active_run: Option<String>,
    /// Ticks that got no run.
    pub skipped_ticks: u64,
}

/// `POST /taskschedules/{name}/suspend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Suspension {
    pub suspend: bool,
}

/// A package in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Package {
    /// `NAME_VERSION_ARCH`.
    pub id: String,
    pub name: String,
    pub version: String,
    pub architecture: String,
    pub sha256: String,
    pub size: u64,
    #[schema(value_type = String, format = DateTime)]
    pub uploaded_at: Timestamp,
}
