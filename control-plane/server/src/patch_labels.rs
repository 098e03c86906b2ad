//! The devices as placement sees them: each with the labels the control
//! plane maintains from its latest patch assessment
//! (`drover_rules::patch::DeviceAssessment::maintained_labels`) beside the
//! operator's own, so a TaskRun's selector and a Deployment's filter match
//! `drover.io/security-updates: pending` with the placement rule unchanged.
//! Only the copies placement reads carry them; stored device records and
//! manifests never do.

use drover_rules::patch::DeviceAssessment;
use drover_rules::records::DeviceRecord;
use drover_store::db::{Db, DbError};
use std::collections::HashMap;

/// Every registered device, with its maintained labels.
pub async fn placed_devices(db: &Db) -> Result<Vec<DeviceRecord>, DbError> {
    let assessments: HashMap<_, DeviceAssessment> = db
        .list::<DeviceAssessment>("assessments/")
        .await?
        .into_iter()
        .map(|(_, _, a)| (a.device.clone(), a))
        .collect();
    Ok(db
        .list::<DeviceRecord>("devices/")
        .await?
        .into_iter()
        .map(|(_, _, mut device)| {
            if let Some(assessment) = assessments.get(&device.id) {
                for (key, value) in assessment.maintained_labels() {
                    device.labels.insert(key.to_owned(), value.to_owned());
                }
            }
            device
        })
        .collect())
}
