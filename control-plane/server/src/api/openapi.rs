//! The operators' API's OpenAPI 3.1 document: every route of `/api/v1`
//! with its parameters and answers, generated from the request and answer
//! types (`drover-api`). Served at `GET /api/v1/openapi.json` and kept in
//! `docs/openapi.json` (`tests/tests/docs.rs` fails when that copy is
//! stale). The test below fails when the router has a route this document
//! lacks, or the document one the router lacks.
//!
//! The functions here are descriptions only (utoipa reads its `path`
//! attributes from functions); the handlers live beside their resources.
//! `apply`'s request body (manifests, parsed strictly by kind) is the one
//! body still described as `Object`.

#![allow(dead_code)]

use drover_api::{
    ErrorBody, changes, deployments, devices, enrollment, fleet, operators, runs, schedules,
};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Drover operators' API",
        description = "The control plane's operators' API. Every route takes the operator's \
                       bearer token (`Authorization: Bearer …`) or a dashboard session; a \
                       change also needs the role the route names.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "/api/v1")),
    paths(
        summary, list_alerts, ack_alert,
        list_devices, device_page, token_generations, get_device, delete_device,
        get_inventory, device_jobs, device_logs, get_assessment, rotate_device_token, patch_status,
        accept_device, reject_device, list_device_keys, preauthorize_key, agent_trust,
        list_enrollment_tokens, create_enrollment_token, revoke_enrollment_token,
        apply,
        list_schedules, get_schedule, delete_schedule, suspend_schedule,
        list_runs, get_run, delete_run, run_targets, cancel_run,
        list_deployments, get_deployment, delete_deployment, deployment_targets,
        describe_deployment, add_new_devices, cancel_deployment,
        list_packages, upload_package, delete_package,
        list_secrets, delete_secret,
        list_operators, add_operator, rotate_operator, revoke_operator, whoami,
        read_audit, openapi_json,
    ),
    components(schemas(ErrorBody, changes::Changed)),
    modifiers(&Bearer),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as served and kept: pretty JSON with a final newline.
pub fn document() -> String {
    // Serializing a document of strings and maps cannot fail; an empty
    // object would say so at once in the test that compares it.
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|_| "{}".to_owned());
    text.push('\n');
    text
}

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `?limit=N&continue=NAME`: a listing a page at a time (the next page's
/// address in the `Link` header).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// At most this many (1 to 500); without it, every object.
    limit: Option<u32>,
    /// The name the page continues after (from the `Link` header).
    #[param(rename = "continue")]
    after: Option<String>,
}

/// `?offset=N&limit=N`: one page of a run's or deployment's targets.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PageParams {
    offset: Option<u32>,
    /// At most 500; 100 when left out.
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/summary", tag = "fleet", responses(
    (status = 200, description = "Fleet counts, cheap enough to poll", body = fleet::Summary)))]
fn summary() {}

#[utoipa::path(get, path = "/alerts", tag = "fleet", responses(
    (status = 200, description = "Every alert now, newest first", body = fleet::Alerts)))]
fn list_alerts() {}

#[utoipa::path(post, path = "/alerts/ack", tag = "fleet", request_body = fleet::AckRequest,
    responses(
        (status = 200, description = "Acknowledged while its condition lasts", body = fleet::AckAnswer),
        (status = 404, description = "No such alert is raised now", body = ErrorBody)))]
fn ack_alert() {}

#[utoipa::path(get, path = "/devices", tag = "devices", params(ListParams), responses(
    (status = 200, description = "Every device with its state and patch summary",
     body = Vec<devices::Device>)))]
fn list_devices() {}

#[utoipa::path(get, path = "/devices/page", tag = "devices", params(
        ("offset" = Option<u32>, Query), ("limit" = Option<u32>, Query),
        ("q" = Option<String>, Query, description = "Matches the id, a group, a label, the OS or the agent's version"),
        ("state" = Option<String>, Query, description = "online, offline, never_connected, decommissioned"),
        ("patch" = Option<String>, Query, description = "A patch state")),
    responses((status = 200, description = "One filtered page of the fleet", body = devices::DevicePage),
              (status = 400, body = ErrorBody)))]
fn device_page() {}

#[utoipa::path(get, path = "/devices/token-generations", tag = "devices", responses(
    (status = 200, description = "Each rotated device's token generation",
     body = std::collections::BTreeMap<String, u64>)))]
fn token_generations() {}

#[utoipa::path(get, path = "/devices/{id}", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "One device", body = devices::Device),
              (status = 404, body = ErrorBody)))]
fn get_device() {}

#[utoipa::path(delete, path = "/devices/{id}", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "Deleted, with its jobs (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody)))]
fn delete_device() {}

#[utoipa::path(get, path = "/devices/{id}/inventory", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "The installed packages last reported",
               body = devices::DeviceInventory),
              (status = 404, body = ErrorBody)))]
fn get_inventory() {}

#[utoipa::path(get, path = "/devices/{id}/jobs", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "The device's latest jobs", body = devices::DeviceJobs),
              (status = 404, body = ErrorBody)))]
fn device_jobs() {}

#[utoipa::path(get, path = "/devices/{id}/logs", tag = "devices",
    params(("id" = String, Path),
           ("job" = Option<String>, Query, description = "A job id or its start; the job \
            whose output is newest when left out"),
           ("tail" = Option<u32>, Query, description = "Only the last lines"),
           ("wait" = Option<u64>, Query, description = "Seconds to wait for the device \
            (1 to 120, 30 by default)")),
    responses((status = 200, description = "The job's whole output, fetched from the device \
               through its transport and streamed as it comes (plain text; at most its last \
               4 MiB). A body cut off before its end means the device stopped answering",
               content_type = "text/plain", body = String),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody), (status = 502, body = ErrorBody),
              (status = 503, body = ErrorBody), (status = 504, body = ErrorBody)))]
fn device_logs() {}

#[utoipa::path(get, path = "/devices/{id}/assessment", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "The device's last patch assessment",
               body = devices::Assessment),
              (status = 404, body = ErrorBody)))]
fn get_assessment() {}

#[utoipa::path(post, path = "/devices/{id}/rotate-token", tag = "devices", params(("id" = String, Path)),
    responses((status = 200, description = "The device's token generation raised (admin)",
               body = devices::TokenRotated),
              (status = 404, body = ErrorBody)))]
fn rotate_device_token() {}

#[utoipa::path(get, path = "/patch-status", tag = "devices", responses(
    (status = 200, description = "The fleet's patch status", body = devices::PatchStatus)))]
fn patch_status() {}

#[utoipa::path(post, path = "/apply", tag = "apply",
    params(("dryRun" = Option<String>, Query, description = "`server`: check and preview only")),
    request_body(content = Object, description = "A manifest, an array of them, or a List"),
    responses((status = 200, description = "What became of each object; with dryRun=server, \
               a preview of what applying would do", body = changes::ApplyAnswer),
              (status = 201, description = "Created (one object sent)", body = changes::Applied),
              (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
fn apply() {}

#[utoipa::path(get, path = "/taskschedules", tag = "schedules", params(ListParams), responses(
    (status = 200, description = "Every schedule", body = Vec<schedules::TaskSchedule>)))]
fn list_schedules() {}

#[utoipa::path(get, path = "/taskschedules/{name}", tag = "schedules", params(("name" = String, Path)),
    responses((status = 200, description = "One schedule", body = schedules::TaskSchedule),
              (status = 404, body = ErrorBody)))]
fn get_schedule() {}

#[utoipa::path(delete, path = "/taskschedules/{name}", tag = "schedules", params(("name" = String, Path)),
    responses((status = 200, description = "Deleted; its runs stay (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody)))]
fn delete_schedule() {}

#[utoipa::path(post, path = "/taskschedules/{name}/suspend", tag = "schedules", params(("name" = String, Path)),
    request_body = schedules::Suspension,
    responses((status = 200, description = "The schedule as it is now", body = schedules::TaskSchedule),
              (status = 404, body = ErrorBody)))]
fn suspend_schedule() {}

#[utoipa::path(get, path = "/taskruns", tag = "runs", params(ListParams), responses(
    (status = 200, description = "Every run", body = Vec<runs::TaskRun>)))]
fn list_runs() {}

#[utoipa::path(get, path = "/taskruns/{name}", tag = "runs", params(("name" = String, Path)),
    responses((status = 200, description = "One run", body = runs::TaskRun),
              (status = 404, body = ErrorBody)))]
fn get_run() {}

#[utoipa::path(delete, path = "/taskruns/{name}", tag = "runs", params(("name" = String, Path)),
    responses((status = 200, description = "Deleted with its jobs (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn delete_run() {}

#[utoipa::path(get, path = "/taskruns/{name}/targets", tag = "runs",
    params(("name" = String, Path), PageParams),
    responses((status = 200, description = "One page of the run's frozen plan",
               body = runs::RunTargets),
              (status = 404, body = ErrorBody)))]
fn run_targets() {}

#[utoipa::path(post, path = "/taskruns/{name}/cancel", tag = "runs", params(("name" = String, Path)),
    responses((status = 202, description = "Canceling", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn cancel_run() {}

#[utoipa::path(get, path = "/deployments", tag = "deployments", params(ListParams), responses(
    (status = 200, description = "Every deployment", body = Vec<deployments::Deployment>)))]
fn list_deployments() {}

#[utoipa::path(get, path = "/deployments/{name}", tag = "deployments", params(("name" = String, Path)),
    responses((status = 200, description = "One deployment", body = deployments::Deployment),
              (status = 404, body = ErrorBody)))]
fn get_deployment() {}

#[utoipa::path(delete, path = "/deployments/{name}", tag = "deployments", params(("name" = String, Path)),
    responses((status = 200, description = "Deleted with its targets and jobs (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn delete_deployment() {}

#[utoipa::path(get, path = "/deployments/{name}/targets", tag = "deployments",
    params(("name" = String, Path), PageParams,
           ("state" = Option<String>, Query, description = "Only targets in this state")),
    responses((status = 200, description = "One page of the deployment's targets",
               body = deployments::DeploymentTargets),
              (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
fn deployment_targets() {}

#[utoipa::path(get, path = "/deployments/{name}/describe", tag = "deployments", params(("name" = String, Path)),
    responses((status = 200, description = "The deployment's counts, windows, failures and retries",
               body = deployments::DeploymentDescription),
              (status = 404, body = ErrorBody)))]
fn describe_deployment() {}

#[utoipa::path(post, path = "/deployments/{name}/add-new-devices", tag = "deployments", params(("name" = String, Path)),
    responses((status = 202, description = "Requested", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn add_new_devices() {}

#[utoipa::path(post, path = "/deployments/{name}/cancel", tag = "deployments", params(("name" = String, Path)),
    responses((status = 202, description = "Canceling", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn cancel_deployment() {}

#[utoipa::path(get, path = "/packages", tag = "packages", params(ListParams), responses(
    (status = 200, description = "Every package", body = Vec<schedules::Package>)))]
fn list_packages() {}

#[utoipa::path(post, path = "/packages", tag = "packages",
    request_body(content = Vec<u8>, content_type = "application/vnd.debian.binary-package"),
    responses((status = 201, description = "Stored", body = schedules::Package),
              (status = 200, description = "Already stored", body = schedules::Package),
              (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
fn upload_package() {}

#[utoipa::path(delete, path = "/packages/{id}", tag = "packages", params(("id" = String, Path)),
    responses((status = 200, description = "Deleted (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn delete_package() {}

#[utoipa::path(get, path = "/secrets", tag = "secrets", params(ListParams), responses(
    (status = 200, description = "Secrets by name and keys; never their values", body = Vec<fleet::SecretSummary>)))]
fn list_secrets() {}

#[utoipa::path(delete, path = "/secrets/{name}", tag = "secrets", params(("name" = String, Path)),
    responses((status = 200, description = "Deleted (admin)", body = changes::Changed),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn delete_secret() {}

#[utoipa::path(post, path = "/devices/{id}/accept", tag = "enrollment", params(("id" = String, Path)),
    responses((status = 200, description = "The device's key accepted: it joins with its token's \
               groups and labels (admin)", body = enrollment::DeviceKey),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn accept_device() {}

#[utoipa::path(post, path = "/devices/{id}/reject", tag = "enrollment", params(("id" = String, Path)),
    responses((status = 200, description = "The device's key rejected; an open session ends (admin)",
               body = enrollment::DeviceKey),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn reject_device() {}

#[utoipa::path(get, path = "/device-keys", tag = "enrollment",
    params(super::enrollment::KeyFilter),
    responses((status = 200, description = "The keys devices enrolled", body = Vec<enrollment::DeviceKey>),
              (status = 400, body = ErrorBody)))]
fn list_device_keys() {}

#[utoipa::path(post, path = "/device-keys", tag = "enrollment",
    request_body = enrollment::PreauthorizedKey,
    responses((status = 201, description = "The key accepted before the device asks; the device \
               joins with the groups and labels given (admin)", body = enrollment::DeviceKey),
              (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
fn preauthorize_key() {}

#[utoipa::path(get, path = "/agent-trust", tag = "enrollment", responses(
    (status = 200, description = "What every device's agent config pins: the intent-signing \
     public keys and, with NATS decentralized authentication, the enrollment user's JWT; \
     nothing secret", body = enrollment::AgentTrust)))]
fn agent_trust() {}

#[utoipa::path(get, path = "/enrollment-tokens", tag = "enrollment", responses(
    (status = 200, description = "Every enrollment token; never the token itself",
     body = Vec<enrollment::EnrollmentToken>)))]
fn list_enrollment_tokens() {}

#[utoipa::path(post, path = "/enrollment-tokens", tag = "enrollment",
    request_body = enrollment::NewEnrollmentToken,
    responses((status = 201, description = "Created; the token is given once (admin)",
               body = enrollment::EnrollmentToken),
              (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
fn create_enrollment_token() {}

#[utoipa::path(post, path = "/enrollment-tokens/{name}/revoke", tag = "enrollment",
    params(("name" = String, Path)),
    responses((status = 200, description = "Revoked: no new device enrolls with it (admin)",
               body = enrollment::EnrollmentToken),
              (status = 404, body = ErrorBody)))]
fn revoke_enrollment_token() {}

#[utoipa::path(get, path = "/operators", tag = "operators", responses(
    (status = 200, description = "Every operator", body = Vec<operators::Operator>)))]
fn list_operators() {}

#[utoipa::path(post, path = "/operators", tag = "operators", request_body = operators::NewOperator,
    responses((status = 201, description = "Added; its token is given once (admin)", body = operators::Operator),
              (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
fn add_operator() {}

#[utoipa::path(post, path = "/operators/{name}/rotate", tag = "operators", params(("name" = String, Path)),
    responses((status = 200, description = "A new token, given once (admin)", body = operators::Operator),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn rotate_operator() {}

#[utoipa::path(post, path = "/operators/{name}/revoke", tag = "operators", params(("name" = String, Path)),
    responses((status = 200, description = "Revoked (admin)", body = operators::Operator),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
fn revoke_operator() {}

#[utoipa::path(get, path = "/whoami", tag = "operators", responses(
    (status = 200, description = "The caller", body = operators::Whoami)))]
fn whoami() {}

#[utoipa::path(get, path = "/audit", tag = "audit", params(
        ("since" = Option<String>, Query, description = "An RFC 3339 time or an age (30m, 24h, 7d)"),
        ("operator" = Option<String>, Query), ("kind" = Option<String>, Query),
        ("format" = Option<String>, Query, description = "json (the default) or jsonl")),
    responses((status = 200, description = "The audit log in time order (as JSON lines with \
               format=jsonl)", body = Vec<operators::AuditEntry>)))]
fn read_audit() {}

#[utoipa::path(get, path = "/openapi.json", tag = "api", responses(
    (status = 200, description = "This document", body = Object)))]
fn openapi_json() {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The routes `api::router` nests under `/api/v1`, read from its
    /// source: each `.route("PATH", get(..).delete(..))` as (METHOD, PATH).
    fn routed() -> BTreeSet<(String, String)> {
        let source = include_str!("mod.rs");
        let start = source
            .find("let api = Router::new()")
            .expect("the api router");
        let end = start + source[start..].find(".layer(").expect("its layers");
        let mut routes = BTreeSet::new();
        for part in source[start..end].split(".route(").skip(1) {
            let path = part.split('"').nth(1).expect("a route's path");
            let after = &part[part.find(',').expect("its handlers")..];
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = format!("{method}(");
                let found = after.match_indices(&called).any(|(at, _)| {
                    at == 0
                        || !after.as_bytes()[at - 1].is_ascii_alphanumeric()
                            && after.as_bytes()[at - 1] != b'_'
                });
                if found {
                    routes.insert((method.to_uppercase(), path.to_owned()));
                }
            }
        }
        routes
    }

    fn documented() -> BTreeSet<(String, String)> {
        let document: serde_json::Value =
            serde_json::from_str(&document()).expect("the document is JSON");
        let mut routes = BTreeSet::new();
        for (path, item) in document["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("a path item").keys() {
                routes.insert((method.to_uppercase(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn every_route_is_documented_and_every_documented_route_is_routed() {
        let routed = routed();
        let documented = documented();
        // The reading of the router finds what it should (a positive control).
        assert!(routed.contains(&("DELETE".into(), "/devices/{id}".into())));
        assert!(routed.contains(&("POST".into(), "/packages".into())));
        assert!(routed.len() > 40, "{routed:?}");
        let missing: Vec<_> = routed.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&routed).collect();
        assert!(
            missing.is_empty(),
            "routes not in the OpenAPI document: {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "documented routes the router lacks: {extra:?}"
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_with_the_shared_schemas() {
        let document: serde_json::Value =
            serde_json::from_str(&document()).expect("the document is JSON");
        assert!(
            document["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1"))
        );
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        for name in [
            "Changed",
            "ErrorBody",
            "Summary",
            "Alert",
            "Operator",
            "Whoami",
        ] {
            assert!(schemas.contains_key(name), "no schema {name}");
        }
    }
}
