//! The CLI's HTTP client for the operators' API.

use anyhow::{Context, Result, bail};
use drover_api::ErrorBody;
use drover_api::changes::{Applied, Changed, Preview, PreviewItem};
use drover_net::tls::{SYSTEM_CA_BUNDLE, is_loopback};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

pub struct ApiClient {
    base: String,
    token: String,
    http: reqwest::Client,
    /// The CA this client trusts for `https://`, when given.
    ca_file: Option<std::path::PathBuf>,
}

impl ApiClient {
    /// A client of the API at `base`. `https://` trusts `ca_file` (a CA
    /// bundle, or the server's own self-signed certificate to pin it), else
    /// Debian's system bundle. `http://` is refused to any host but this
    /// machine: the operator token would cross the network in clear.
    pub fn new(base: &str, token: &str, ca_file: Option<&Path>) -> Result<Self> {
        let url = reqwest::Url::parse(base)
            .with_context(|| format!("the control plane's address {base:?} is not a URL"))?;
        let host = url.host_str().unwrap_or("");
        drover_net::tls::install_default_provider();
        let builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
        let builder = match url.scheme() {
            "https" => {
                let ca = ca_file.unwrap_or(Path::new(SYSTEM_CA_BUNDLE));
                let tls = drover_net::tls::client_config(ca)?;
                builder
                    .https_only(true)
                    .tls_backend_preconfigured(rustls::ClientConfig::clone(&tls))
            }
            "http" if is_loopback(host) => {
                if ca_file.is_some() {
                    bail!("--ca-file is for https://, but the control plane's address is {base}");
                }
                // Plain http on this machine trusts no certificate at all, so
                // the client needs none of the system's: without this, a host
                // with no CA bundle (a minimal Debian) could not reach its own
                // control plane.
                let trusts_nothing = rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                builder.tls_backend_preconfigured(trusts_nothing)
            }
            "http" => bail!(
                "refusing to send the operator token in clear to {host}: use https:// \
                 (drover serve --api-tls-cert/--api-tls-key) or reach the API on this machine"
            ),
            other => {
                bail!("the control plane's address must be https:// or http://, not {other}://")
            }
        };
        let http = builder.build().context("cannot build the HTTP client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            http,
            ca_file: ca_file.map(Path::to_owned),
        })
    }

    pub(crate) async fn check(response: reqwest::Response) -> Result<Value> {
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = match serde_json::from_value::<ErrorBody>(body.clone()) {
                Ok(answer) => answer.error,
                Err(_) => body.to_string(),
            };
            bail!("the control plane answered {status}: {message}");
        }
        Ok(body)
    }

    async fn send_get(&self, path: &str) -> Result<reqwest::Response> {
        let url = format!("{}/api/v1{path}", self.base);
        self.http
            .get(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))
    }

    /// Like [`ApiClient::get`], with None when nothing listens at the
    /// server's address (connection refused): a control plane not started.
    pub async fn get_if_up<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        let url = format!("{}/api/v1{path}", self.base);
        match self.http.get(&url).bearer_auth(&self.token).send().await {
            Ok(response) => Ok(Some(serde_json::from_value(Self::check(response).await?)?)),
            Err(e) if e.is_connect() => Ok(None),
            Err(e) => Err(self.unreachable(e)),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The CA file this client trusts (`--ca-file` or the context's).
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let response = self.send_get(path).await?;
        Ok(serde_json::from_value(Self::check(response).await?)?)
    }

    /// Every object of a listing, asked for a page at a time (`?limit=`)
    /// and following each answer's `Link: <…>; rel="next"` until there is
    /// none, so no single answer is the whole fleet.
    pub async fn list(&self, path: &str) -> Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut next = Some(format!("{path}?limit={LIST_PAGE}"));
        while let Some(page) = next.take() {
            let response = self.send_get(&page).await?;
            next = next_page(response.headers());
            match Self::check(response).await? {
                Value::Array(objects) => items.extend(objects),
                other => bail!("the control plane answered {path} with {other}, not a list"),
            }
        }
        Ok(items)
    }

    /// Like [`ApiClient::get`], with None when the resource does not exist.
    pub async fn get_optional<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        let response = self.send_get(path).await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Ok(Some(serde_json::from_value(Self::check(response).await?)?))
    }

    /// POSTs `body` as JSON; the answer read as `T` (a type of `drover-api`).
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl serde::Serialize + ?Sized),
    ) -> Result<T> {
        let url = format!("{}/api/v1{path}", self.base);
        let response = self
            .http
            .post(&url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(serde_json::from_value(Self::check(response).await?)?)
    }

    /// DELETEs `path`; the answer read as `T` (a type of `drover-api`).
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("{}/api/v1{path}", self.base);
        let response = self
            .http
            .delete(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        Ok(serde_json::from_value(Self::check(response).await?)?)
    }

    /// GETs an answer to read as it comes (a device's job output), with no
    /// whole-request limit beyond ten minutes: the server cuts off a device
    /// that stops answering. An error answer is an error, in its words.
    pub async fn get_streamed(&self, path: &str) -> Result<reqwest::Response> {
        let url = format!("{}/api/v1{path}", self.base);
        let response = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Self::check(response).await?;
        anyhow::bail!("unexpected answer from {url}")
    }

    /// POSTs a streamed body of `size` bytes (a package upload), with no
    /// limit on the whole request: the caller cuts off a stalled one.
    pub async fn post_stream(
        &self,
        path: &str,
        size: u64,
        body: reqwest::Body,
    ) -> reqwest::Result<reqwest::Response> {
        let url = format!("{}/api/v1{path}", self.base);
        self.http
            .post(&url)
            .bearer_auth(&self.token)
            .header("content-type", "application/vnd.debian.binary-package")
            .header("content-length", size)
            .timeout(Duration::from_secs(7 * 24 * 3600))
            .body(body)
            .send()
            .await
    }

    /// A request that got no answer, with what to do when it was TLS (the
    /// agent's advice, worded for the CLI's --ca-file).
    pub fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            chain.push_str(": ");
            chain.push_str(&cause.to_string());
            source = cause.source();
        }
        let advice = transport_websocket::client::tls_advice(
            drover_net::certificate::certificate_problem(&e),
            "--ca-file (or the context's ca-file)",
            "--server",
        );
        anyhow::anyhow!(
            "cannot reach the control plane at {}: {chain}{advice}",
            self.base
        )
    }

    /// Applies every document of a YAML or JSON text in one request (a
    /// List when there are several); returns what became of each.
    pub async fn apply_text(&self, text: &str) -> Result<Vec<Changed>> {
        let documents = manifests(text)?;
        let applied: Applied = match documents.as_slice() {
            [one] => self.post("/apply", one).await?,
            _ => self.post("/apply", &list_of(documents)).await?,
        };
        Ok(applied.into_items())
    }

    /// Checks the documents and previews what applying them would do
    /// (`POST /apply?dryRun=server`); nothing is stored.
    pub async fn preview_text(&self, text: &str) -> Result<Vec<PreviewItem>> {
        let preview: Preview = self
            .post("/apply?dryRun=server", &list_of(manifests(text)?))
            .await?;
        Ok(preview.items)
    }
}

/// The documents of a YAML or JSON text, bounded, each as apply takes it.
fn manifests(text: &str) -> Result<Vec<Value>> {
    const MAX_TEXT: usize = 16 * 1024 * 1024;
    const MAX_DEPTH: usize = 64;
    if text.len() > MAX_TEXT {
        bail!(
            "the file is {} bytes, over the limit of {MAX_TEXT}",
            text.len()
        );
    }
    let depth = drover_rules::strict_json::nesting_depth(text);
    if depth > MAX_DEPTH {
        bail!("the file nests {depth} levels of [ or {{, over the limit of {MAX_DEPTH}");
    }
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = <Value as serde::Deserialize>::deserialize(document)
            .context("not valid YAML or JSON")?;
        match value {
            Value::Null => {}
            // What `get KIND -o yaml|json` prints for several: a list.
            Value::Array(items) => documents.extend(items.into_iter().map(as_manifest)),
            value => documents.push(as_manifest(value)),
        }
    }
    if documents.is_empty() {
        bail!("no manifest found");
    }
    Ok(documents)
}

/// Several manifests as one `kind: List`.
fn list_of(documents: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": documents})
}

/// How many objects `list` asks for at a time.
const LIST_PAGE: usize = 500;

/// The path under `/api/v1` of the page a `Link` header names as next.
fn next_page(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let link = headers.get(reqwest::header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| target.trim().strip_prefix('<')?.strip_suffix('>'))
            .flatten()
            .and_then(|url| url.strip_prefix("/api/v1"))
            .map(str::to_owned)
    })
}

/// A manifest as apply takes it from what `get -o yaml|json` printed: the
/// status and the metadata the control plane sets (uid, creation time)
/// are its own, not the operator's, and are left out as kubectl does.
fn as_manifest(mut document: Value) -> Value {
    if let Some(object) = document.as_object_mut() {
        object.remove("status");
        if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
            for key in [
                "uid",
                "creationTimestamp",
                "resourceVersion",
                "generation",
                "ownerReferences",
            ] {
                metadata.remove(key);
            }
        }
    }
    document
}
