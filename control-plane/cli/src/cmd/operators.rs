//! `drover operators` (named operators with roles, tokens shown once) and
//! `drover audit` (who changed what, and what was refused).

use agent_core::out;
use anyhow::Result;
use drover::cli::{AuditArgs, OperatorsCommand};
use drover::client::ApiClient;
use drover::get::structured;
use drover::table::{age, print_table, table};
use drover::watch::printable;
use drover_api::operators::{AuditEntry, NewOperator, Operator};
use serde_json::json;

fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_owned(), printable)
}

/// Prints a token made for `name`, once, with how to use it.
fn print_token(answer: &Operator, name: &str) {
    out!("{}", text(answer.token.as_deref()));
    eprintln!(
        "that is operator {name}'s token ({}); it is shown once and stored only as a digest. \
         Give it to them for `drover config set-context … --token-file FILE` or the dashboard's login",
        answer.role.name()
    );
}

pub async fn operators(api: &ApiClient, command: &OperatorsCommand) -> Result<i32> {
    match command {
        OperatorsCommand::List { output } => {
            let operators: Vec<Operator> = api.get("/operators").await?;
            if structured(*output, &operators)? {
                return Ok(0);
            }
            let now = jiff::Timestamp::now();
            let mut shown = table(&["NAME", "ROLE", "TOKEN", "STATE", "CHANGED", "CREATED BY"]);
            for operator in &operators {
                let state = match operator.revoked_at {
                    Some(at) => format!(
                        "revoked {} ago by {}",
                        age(Some(at), now),
                        text(operator.revoked_by.as_deref())
                    ),
                    None => "active".to_owned(),
                };
                let token = if operator.bootstrap {
                    "DATA/operator.token".to_owned()
                } else {
                    format!("own (generation {})", operator.generation)
                };
                shown.add_row(vec![
                    printable(&operator.name),
                    operator.role.name().to_owned(),
                    token,
                    state,
                    age(Some(operator.changed_at), now),
                    printable(&operator.created_by),
                ]);
            }
            print_table(&shown);
        }
        OperatorsCommand::Add { name, role } => {
            let new = NewOperator {
                name: name.clone(),
                role: role.clone(),
            };
            let answer: Operator = api.post("/operators", &new).await?;
            print_token(&answer, name);
        }
        OperatorsCommand::Rotate { name } => {
            let answer: Operator = api
                .post(&format!("/operators/{name}/rotate"), &json!({}))
                .await?;
            print_token(&answer, name);
            eprintln!("its old token and its dashboard sessions no longer work");
        }
        OperatorsCommand::Revoke { name } => {
            api.post::<Operator>(&format!("/operators/{name}/revoke"), &json!({}))
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
    let entries: Vec<AuditEntry> = api.get(&path).await?;
    if args.jsonl {
        for entry in &entries {
            out!("{}", serde_json::to_string(entry)?);
        }
        return Ok(0);
    }
    if structured(args.output, &entries)? {
        return Ok(0);
    }
    let mut shown = table(&["TIME", "WHO", "VIA", "VERB", "OBJECT", "OUTCOME", "REASON"]);
    for entry in &entries {
        let objects: Vec<String> = entry
            .objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}{}",
                    printable(&o.kind),
                    printable(&o.name),
                    o.result
                        .as_deref()
                        .map(|r| format!(" {}", printable(r)))
                        .unwrap_or_default()
                )
            })
            .collect();
        let total = entry.objects_total as usize;
        let object = if !objects.is_empty() {
            let more = total.saturating_sub(objects.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{}{more}", objects.join(", "))
        } else {
            match (entry.kind.as_deref(), entry.name.as_deref()) {
                (Some(kind), Some(name)) => format!("{}/{}", printable(kind), printable(name)),
                (Some(kind), None) => printable(kind),
                _ => "-".to_owned(),
            }
        };
        let when = entry
            .at
            .round(jiff::Unit::Second)
            .map_or_else(|_| entry.at.to_string(), |t| t.to_string());
        shown.add_row(vec![
            when,
            printable(&entry.who),
            printable(&entry.via),
            printable(&entry.verb),
            object,
            format!("{} {}", printable(&entry.outcome), entry.status),
            text(entry.reason.as_deref()),
        ]);
    }
    print_table(&shown);
    Ok(0)
}
