//! Median, minimum and maximum of repeated measurements: how every figure
//! the simulator prints is shown.

/// Median, minimum and maximum of some measurements (NaN ignored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Self {
            min: values[0],
            median,
            max: values[n - 1],
        })
    }

    /// `median (min–max)`, or the one value when all are the same.
    pub fn show(&self, decimals: usize) -> String {
        let (min, median, max) = (
            format!("{:.*}", decimals, self.min),
            format!("{:.*}", decimals, self.median),
            format!("{:.*}", decimals, self.max),
        );
        if min == max {
            median
        } else {
            format!("{median} ({min}–{max})")
        }
    }
}
