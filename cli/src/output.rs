//! What the tool prints: an aligned table or `key: value` lines for people, JSON for programs.

use std::io::Write;
use std::time::Duration;

use dlock_runtime::LockInfo;
use serde_json::{Value, json};

/// Writes `text` to standard output; a closed pipe (`dlock list | head`) is not an error.
pub(crate) fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// `29.512s`: a TTL to the millisecond.
pub(crate) fn ttl_text(ttl: Duration) -> String {
    format!("{}.{:03}s", ttl.as_secs(), ttl.subsec_millis())
}

fn fence_text(fence: Option<u64>) -> String {
    fence.map_or_else(|| "-".to_owned(), |f| f.to_string())
}

/// One lock as a JSON object: `key`, `owner`, `ttl_ms`, `holds`, `fence` (or null), `mode`.
pub(crate) fn lock_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "owner": info.owner,
        "ttl_ms": u64::try_from(info.ttl.as_millis()).unwrap_or(u64::MAX),
        "holds": info.holds,
        "fence": info.fence,
        "mode": info.mode,
    })
}

/// A JSON document on one line, then a newline.
pub(crate) fn json_line(value: &Value) -> String {
    format!("{value}\n")
}

/// The locks as a table with a header, columns aligned.
pub(crate) fn table(locks: &[LockInfo]) -> String {
    let header = ["KEY", "OWNER", "TTL", "HOLDS", "FENCE", "MODE"].map(str::to_owned);
    let rows: Vec<[String; 6]> = locks
        .iter()
        .map(|i| {
            [
                i.key.clone(),
                i.owner.clone(),
                ttl_text(i.ttl),
                i.holds.to_string(),
                fence_text(i.fence),
                i.mode.clone(),
            ]
        })
        .collect();
    let mut widths = [0usize; 6];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One lock as aligned `name: value` lines (`show`).
pub(crate) fn details(info: &LockInfo) -> String {
    format!(
        "key:    {}\nowner:  {}\nttl:    {}\nholds:  {}\nfence:  {}\nmode:   {}\n",
        info.key,
        info.owner,
        ttl_text(info.ttl),
        info.holds,
        fence_text(info.fence),
        info.mode
    )
}

/// A `watch` line: when (since the start), the key, and its holder or `free`.
pub(crate) fn watch_line(elapsed: Duration, key: &str, info: Option<&LockInfo>) -> String {
    match info {
        Some(i) => format!(
            "+{} {key} held by {} ttl {}s fence {}\n",
            ttl_text(elapsed),
            i.owner,
            i.ttl.as_secs(),
            fence_text(i.fence)
        ),
        None => format!("+{} {key} free\n", ttl_text(elapsed)),
    }
}

/// A `watch` line as JSON: `elapsed_ms`, `key`, `held`, `lock` (or null).
pub(crate) fn watch_json(elapsed: Duration, key: &str, info: Option<&LockInfo>) -> Value {
    json!({
        "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        "key": key,
        "held": info.is_some(),
        "lock": info.map(lock_json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_show_milliseconds() {
        assert_eq!(ttl_text(Duration::from_millis(29_512)), "29.512s");
        assert_eq!(ttl_text(Duration::from_millis(5)), "0.005s");
    }
}
