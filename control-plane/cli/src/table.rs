//! The pieces every listing prints with: rows keyed by name, kubectl's
//! borderless table, ages and counts as an operator reads them.

use agent_core::out;
use serde_json::Value;

/// One row of a listing, keyed by the object's name.
pub struct Row {
    pub key: String,
    pub cells: Vec<String>,
}

/// A resource's rows and how to print them.
pub struct Listing {
    pub headers: Vec<&'static str>,
    pub rows: Vec<Row>,
    /// Columns that change with the clock alone (ages): under `--watch` a
    /// row is not printed again for them.
    pub volatile: Vec<usize>,
    /// Printed under the table (a run's latest error).
    pub note: Option<String>,
}

/// A table in kubectl's style: no borders, columns two spaces apart, each
/// as wide as its widest cell whatever the cell holds.
pub fn table(headers: &[&str]) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(headers.iter().copied());
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

pub fn print_table(table: &comfy_table::Table) {
    for line in table.lines() {
        out!("{}", line.trim_end());
    }
}

/// How long ago `at` was, in the largest unit that fits: 45s, 12m, 3h, 9d.
pub fn age(at: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    let Some(at) = at else {
        return "-".into();
    };
    let seconds = now.duration_since(at).as_secs().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A count from the API, or "-" when absent.
pub fn number(value: &Value) -> String {
    value.as_u64().map_or_else(|| "-".into(), |n| n.to_string())
}
