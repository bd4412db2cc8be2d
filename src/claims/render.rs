//! `resumeguard claims list`: the store as a table an operator can read.

use super::model::{format_ms, ClaimRecord};

const HEADERS: [&str; 14] = [
    "THREAD",
    "NS",
    "CHECKPOINT",
    "INTERRUPT",
    "STATE",
    "EPOCH",
    "HOLDER",
    "CLIENT",
    "APPLICATION",
    "CLAIMED",
    "LAPSES",
    "CONSUMED",
    "REFUSED",
    "TAKEOVERS",
];

/// One line per claim, columns padded to their widest cell, then the
/// evidence of consumed claims (free text, so kept out of the grid).
pub fn render_claims(records: &[ClaimRecord]) -> String {
    if records.is_empty() {
        return "no claims\n".to_string();
    }
    let rows: Vec<[String; 14]> = records.iter().map(cells).collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    push_line(&mut out, &HEADERS.map(String::from), &widths);
    for row in &rows {
        push_line(&mut out, row, &widths);
    }
    let evidence: Vec<String> = records
        .iter()
        .filter_map(|r| {
            r.evidence.as_ref().map(|e| {
                format!(
                    "  {} {} {}: {} ({})",
                    r.key.at.thread_id,
                    r.key.at.checkpoint_id,
                    r.key.short_fingerprint(),
                    e,
                    r.state.as_str()
                )
            })
        })
        .collect();
    if !evidence.is_empty() {
        out.push_str("evidence:\n");
        for line in evidence {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

fn cells(r: &ClaimRecord) -> [String; 14] {
    let ns = if r.key.at.checkpoint_ns.is_empty() {
        "''".to_string()
    } else {
        r.key.at.checkpoint_ns.clone()
    };
    [
        r.key.at.thread_id.clone(),
        ns,
        r.key.at.checkpoint_id.clone(),
        r.key.short_fingerprint().to_string(),
        r.state.as_str().to_string(),
        r.epoch.to_string(),
        format!("{}/{}", r.holder.proxy_id, r.holder.session_id),
        r.holder.client_addr.clone(),
        r.holder.application_name.clone(),
        format_ms(r.claimed_at_ms),
        format_ms(r.lapse_at_ms),
        r.consumed_at_ms
            .map(format_ms)
            .unwrap_or_else(|| "-".into()),
        r.refusals.to_string(),
        r.takeovers.to_string(),
    ]
}

fn push_line(out: &mut String, cells: &[String; 14], widths: &[usize; 14]) {
    let line: Vec<String> = cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    out.push_str(line.join("  ").trim_end());
    out.push('\n');
}
