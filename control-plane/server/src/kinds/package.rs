//! `packageInstallV1`: one .deb from the package store. Its checks at
//! apply (the package and its Secrets exist, downloads are served) are in
//! api/apply.rs and its enricher (a fresh link, sealed secrets) in
//! secrets.rs; its report stays with the job.

use super::Kind;

pub struct PackageInstall;

impl Kind for PackageInstall {
    fn name(&self) -> &'static str {
        "packageInstallV1"
    }
}
