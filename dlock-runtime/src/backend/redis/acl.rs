//! Refusals of the server's ACL, explained as the permission the lock user lacks.
//!
//! Redis answers a command the user may not run with `NOPERM ... 'evalsha' command`, a key or
//! channel outside the user's patterns with `NOPERM ... keys` / `... channels`, and a command
//! a script may not run with an error naming only the script's line (`@user_script:<line>`):
//! the command is read from that line of our own source. The README's Security section lists
//! every permission the lock user needs.

use super::names::Names;
use super::script::Lua;

/// Where the README lists the permissions.
const SEE: &str = "the lock user needs the permissions listed in the README, section Security";

/// If `message` (a server error) is an ACL refusal: what is missing, as the grant that gives
/// it (`+incrby`, `~dlock:*`, `&dlock:*`). `script` is the script that was running, if any;
/// `publish` the publish command of this engine (scripts take it as an argument).
pub(super) fn denial(
    message: &str,
    script: Option<&Lua>,
    names: &Names,
    publish: &str,
) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    let refused = lower.contains("noperm")
        || lower.contains("no permissions")
        || lower.contains("the user executing the script can't");
    if !refused {
        return None;
    }
    let prefix = names.written_prefix();
    let missing = if let Some(command) = quoted_command(&lower) {
        format!("may not run `{command}` (grant `+{command}`)")
    } else if lower.contains("channel") {
        format!("may not use the channels `{prefix}*` (grant `&{prefix}*`)")
    } else if lower.contains("key") {
        format!("may not use the keys `{prefix}*` (grant `~{prefix}*`)")
    } else if let Some(script) = script {
        match script_command(&lower, script.src, publish) {
            Some(command) => format!(
                "may not run `{command}` in the {} script (grant `+{command}`)",
                script.name
            ),
            None => format!("may not run a command of the {} script", script.name),
        }
    } else {
        "refused a command".to_owned()
    };
    Some(format!(
        "permission denied by the server's ACL: this user {missing}; {SEE}"
    ))
}

/// `... run the 'evalsha' command` -> `evalsha` (`cluster|slots` for a subcommand).
fn quoted_command(lower: &str) -> Option<&str> {
    let rest = &lower[lower.find("run the '")? + "run the '".len()..];
    let end = rest.find('\'')?;
    Some(&rest[..end]).filter(|c| !c.is_empty())
}

/// The command on the line `@user_script:<line>` names, read from the script's source:
/// `redis.call('PTTL', ...)` -> `pttl`; a command passed as an argument is the publish command.
fn script_command(lower: &str, src: &str, publish: &str) -> Option<String> {
    let rest = &lower[lower.find("@user_script:")? + "@user_script:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let line = src
        .lines()
        .nth(digits.parse::<usize>().ok()?.checked_sub(1)?)?;
    let call = &line[line.find("call(")? + "call(".len()..];
    match call.strip_prefix('\'') {
        Some(quoted) => Some(quoted[..quoted.find('\'')?].to_ascii_lowercase()),
        None => Some(publish.to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests;
