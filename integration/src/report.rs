//! How the benchmark drivers report their phases: p50, p90 and max per phase, as a table and as
//! one JSON line (`{"phases": [...]}`) for scripts.

use std::time::Duration;

use serde_json::json;

/// The `p` quantile (0 to 1) of `sorted`, in milliseconds (nearest rank).
pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// Prints each phase's p50, p90 and max (sorting its times), then the JSON line.
pub fn print_phases(phases: &mut [(&str, Vec<Duration>)]) {
    println!(
        "{:<24} {:>5} {:>9} {:>9} {:>9}",
        "phase", "n", "p50 ms", "p90 ms", "max ms"
    );
    let mut report = Vec::new();
    for (name, took) in phases.iter_mut() {
        took.sort();
        let (p50, p90, max) = (pct(took, 0.5), pct(took, 0.9), pct(took, 1.0));
        println!(
            "{:<24} {:>5} {:>9.2} {:>9.2} {:>9.2}",
            name,
            took.len(),
            p50,
            p90,
            max
        );
        report.push(
            json!({"phase": name, "n": took.len(), "p50_ms": p50, "p90_ms": p90, "max_ms": max}),
        );
    }
    println!("{}", json!({ "phases": report }));
}
