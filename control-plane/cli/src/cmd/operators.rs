//! `drover operators` (named operators with roles, tokens shown once) and
//! `drover audit` (who changed what, and what was refused).

use agent_core::out;
use anyhow::Result;
use drover::cli::{AuditArgs, OperatorsCommand};
use drover::client::ApiClient;
use drover::get::structured;
use drover::table::{age, print_table, table};
use drover::watch::printable;
use serde_json::{Value, json};

fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| "-".to_owned(), printable)
}

fn time(value: &Value) -> Option<jiff::Timestamp> {
    value.as_str()?.parse().ok()
}

/// Prints a token made for `name`, once, with how to use it.
fn print_token(answer: &Value, name: &str) {
    out!("{}", text(&answer["token"]));
    eprintln!(
        "that is operator {name}'s token ({}); it is shown once and stored only as a digest. \
         Give it to them for `drover config set-context … --token-file FILE` or the dashboard's login",
        text(&answer["role"])
    );
}

pub async fn operators(api: &ApiClient, command: &OperatorsCommand) -> Result<i32> {
    match command {
        OperatorsCommand::List { output } => {
            let operators: Value = api.get("/operators").await?;
            if structured(*output, &operators)? {
                return Ok(0);
            }
            let now = jiff::Timestamp::now();
            let mut shown = table(&["NAME", "ROLE", "TOKEN", "STATE", "CHANGED", "CREATED BY"]);
            for operator in operators.as_array().into_iter().flatten() {
                let state = match time(&operator["revokedAt"]) {
                    Some(at) => format!(
                        "revoked {} ago by {}",
                        age(Some(at), now),
                        text(&operator["revokedBy"])
                    ),
                    None => "active".to_owned(),
                };
                let token = if operator["bootstrap"] == Value::Bool(true) {
                    "DATA/operator.token".to_owned()
                } else {
                    format!("own (generation {})", operator["generation"])
                };
                shown.add_row(vec![
                    text(&operator["name"]),
                    text(&operator["role"]),
                    token,
                    state,
                    age(time(&operator["changedAt"]), now),
                    text(&operator["createdBy"]),
                ]);
            }
            print_table(&shown);
        }
        OperatorsCommand::Add { name, role } => {
            let answer = api
                .post("/operators", &json!({"name": name, "role": role}))
                .await?;
            print_token(&answer, name);
        }
        OperatorsCommand::Rotate { name } => {
            let answer = api
                .post(&format!("/operators/{name}/rotate"), &json!({}))
                .await?;
            print_token(&answer, name);
            eprintln!("its old token and its dashboard sessions no longer work");
        }
        OperatorsCommand::Revoke { name } => {
            api.post(&format!("/operators/{name}/revoke"), &json!({}))
                .await?;
            out!(
                "operator/{name} revoked: its token and dashboard sessions are refused on every replica"
            );
        }
    }
    Ok(0)
}

pub async fn audit(api: &ApiClient, args: &AuditArgs) -> Result<i32> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(since) = &args.since {
        query.append_pair("since", since);
    }
    if let Some(operator) = &args.operator {
        query.append_pair("operator", operator);
    }
    if let Some(kind) = &args.kind {
        query.append_pair("kind", kind);
    }
    let query = query.finish();
    let path = if query.is_empty() {
        "/audit".to_owned()
    } else {
        format!("/audit?{query}")
    };
    let entries: Value = api.get(&path).await?;
    if args.jsonl {
        for entry in entries.as_array().into_iter().flatten() {
            out!("{entry}");
        }
        return Ok(0);
    }
    if structured(args.output, &entries)? {
        return Ok(0);
    }
    let mut shown = table(&["TIME", "WHO", "VIA", "VERB", "OBJECT", "OUTCOME", "REASON"]);
    for entry in entries.as_array().into_iter().flatten() {
        let objects: Vec<String> = entry["objects"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                format!(
                    "{}/{}{}",
                    text(&o["kind"]),
                    text(&o["name"]),
                    o["result"]
                        .as_str()
                        .map(|r| format!(" {}", printable(r)))
                        .unwrap_or_default()
                )
            })
            .collect();
        let total = entry["objectsTotal"].as_u64().unwrap_or(0) as usize;
        let object = if !objects.is_empty() {
            let more = total.saturating_sub(objects.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{}{more}", objects.join(", "))
        } else {
            match (entry["kind"].as_str(), entry["name"].as_str()) {
                (Some(kind), Some(name)) => format!("{kind}/{}", printable(name)),
                (Some(kind), None) => kind.to_owned(),
                _ => "-".to_owned(),
            }
        };
        let when = time(&entry["at"]).map_or_else(
            || "-".to_owned(),
            |t| {
                t.round(jiff::Unit::Second)
                    .map_or_else(|_| t.to_string(), |t| t.to_string())
            },
        );
        shown.add_row(vec![
            when,
            text(&entry["who"]),
            text(&entry["via"]),
            text(&entry["verb"]),
            object,
            format!("{} {}", text(&entry["outcome"]), entry["status"]),
            text(&entry["reason"]),
        ]);
    }
    print_table(&shown);
    Ok(0)
}
