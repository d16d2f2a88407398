//! The attribute's arguments: `key = "..."` (or `keys = ["...", ...]`), `lease = "30s"`,
//! `wait = "1s"`, `watchdog = false`, `on_lost = "cancel" | "ignore"`, `hold_at_least = "30s"`,
//! `mode = "read" | "write"`, `permits = 8`, `fair = true`, `crate = "path"`.
//!
//! Two phases, as in tokio-macros: [`RawArgs`] only splits `name = value, ...` (a syntax error
//! here is the only error that stops the parse), then [`RawArgs::validate`] looks at every
//! argument, collecting all the mistakes it finds, each spanned on the smallest offending token.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, Ident, Lit, LitBool, LitStr, Path, Token};

use crate::duration::parse_millis;
use crate::{combine, similar_name};

/// Every argument the attribute accepts, in the order the docs list them.
const ARGUMENTS: [&str; 11] = [
    "key",
    "keys",
    "lease",
    "wait",
    "watchdog",
    "on_lost",
    "hold_at_least",
    "mode",
    "permits",
    "fair",
    "crate",
];

/// `name = value, ...` before validation.
pub(crate) struct RawArgs {
    args: Vec<RawArg>,
}

struct RawArg {
    name: Ident,
    /// `None` for a bare name such as `watchdog`.
    value: Option<Expr>,
}

impl Parse for RawArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Vec::new();
        while !input.is_empty() {
            // `parse_any` accepts keywords, so `crate = "..."` parses like any other name.
            let name = input.call(Ident::parse_any)?;
            let value = if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                Some(input.parse::<Expr>()?)
            } else if input.is_empty() || input.peek(Token![,]) {
                None
            } else {
                return Err(input.error(format!("expected `=` after `{name}`")));
            };
            args.push(RawArg { name, value });
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(RawArgs { args })
    }
}

/// Validated arguments.
pub(crate) struct Args {
    /// The key templates, still unparsed: `key.rs` needs the function's bindings to check
    /// them. One for `key`, one or more for `keys`.
    pub(crate) keys: Vec<LitStr>,
    /// Whether the keys came from `keys = [..]` (a multi-key lock, even with one key).
    pub(crate) multi: bool,
    /// `None` keeps the default (not fair).
    pub(crate) fair: Option<LitBool>,
    /// Milliseconds; `None` keeps the runtime's default lease.
    pub(crate) lease: Option<u64>,
    /// Milliseconds; `None` keeps the runtime's default wait.
    pub(crate) wait: Option<u64>,
    /// `None` keeps the runtime's default (watchdog on).
    pub(crate) watchdog: Option<LitBool>,
    pub(crate) on_lost: OnLost,
    /// Milliseconds; `None`: released at once.
    pub(crate) hold_at_least: Option<u64>,
    /// `mode = "read"`: a read lock (`false`: the default, a write lock).
    pub(crate) read: bool,
    /// `permits = N`: one permit of a semaphore of N.
    pub(crate) permits: Option<u32>,
    /// `None` means `::dlock_runtime`.
    pub(crate) krate: Option<Path>,
}

/// What happens when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Ignore,
}

impl RawArgs {
    /// Checks every argument. `attribute` is the span used when `key` is missing.
    pub(crate) fn validate(self, attribute: Span) -> syn::Result<Args> {
        let mut errors = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        let mut key = None;
        let mut keys: Option<Vec<LitStr>> = None;
        let mut fair = None;
        let mut lease = None;
        let mut wait = None;
        let mut watchdog = None;
        let mut on_lost = None;
        // With the span of its value: checked against the lease once every argument is read.
        let mut hold_at_least: Option<(u64, Span, String)> = None;
        let mut lease_text = String::new();
        let mut krate = None;
        // With their spans: `permits` and `mode = "read"` exclude each other.
        let mut read: Option<(bool, Span)> = None;
        let mut permits: Option<(u32, Span)> = None;

        for RawArg { name, value } in self.args {
            let name_text = name.unraw().to_string();
            if !ARGUMENTS.contains(&name_text.as_str()) {
                errors.push(syn::Error::new(name.span(), unknown_argument(&name_text)));
                continue;
            }
            if seen.contains(&name_text) {
                errors.push(syn::Error::new(
                    name.span(),
                    format!("duplicate argument `{name_text}`"),
                ));
                continue;
            }
            let other = match name_text.as_str() {
                "key" => Some("keys"),
                "keys" => Some("key"),
                _ => None,
            };
            if let Some(other) = other.filter(|other| seen.iter().any(|n| n == other)) {
                errors.push(syn::Error::new(
                    name.span(),
                    format!(
                        "`key` and `keys` cannot be used together; `{other}` is already given: \
                         use `keys = [..]` alone for several keys, e.g. \
                         `keys = [\"acct:{{from}}\", \"acct:{{to}}\"]`"
                    ),
                ));
                continue;
            }
            seen.push(name_text.clone());
            let Some(value) = value else {
                errors.push(syn::Error::new(
                    name.span(),
                    format!(
                        "argument `{name_text}` needs a value, e.g. `{}`",
                        example(&name_text)
                    ),
                ));
                continue;
            };
            let value = ungroup(value);
            let checked = match name_text.as_str() {
                "key" => key_literal(&value).map(|lit| key = Some(lit)),
                "keys" => key_list(&value).map(|list| keys = Some(list)),
                "fair" => bool_literal(&value, "fair").map(|lit| fair = Some(lit)),
                "lease" => duration(&value, "lease").and_then(|millis| {
                    check_lease(millis, value.span())?;
                    lease = Some(millis);
                    lease_text = duration_text(&value);
                    Ok(())
                }),
                "wait" => duration(&value, "wait").map(|millis| wait = Some(millis)),
                "watchdog" => bool_literal(&value, "watchdog").map(|lit| watchdog = Some(lit)),
                "on_lost" => on_lost_value(&value).map(|policy| on_lost = Some(policy)),
                "hold_at_least" => duration(&value, "hold_at_least").map(|millis| {
                    hold_at_least = Some((millis, value.span(), duration_text(&value)))
                }),
                "mode" => mode_value(&value).map(|is_read| read = Some((is_read, value.span()))),
                "permits" => permits_value(&value).map(|n| permits = Some((n, value.span()))),
                // The only name left in `ARGUMENTS`.
                _ => crate_path(&value).map(|path| krate = Some(path)),
            };
            if let Err(error) = checked {
                errors.push(error);
            }
        }

        // A missing key is only worth reporting when `key` was not given at all: a `key` with a
        // bad value already has its own error.
        if key.is_none() && !seen.iter().any(|name| name == "key" || name == "keys") {
            errors.push(syn::Error::new(
                attribute,
                "missing required argument `key`, e.g. `#[distributed_lock(key = \"stock:{id}\")]`",
            ));
        }
        if let (Some((hold, span, hold_text)), Some(lease)) = (&hold_at_least, lease)
            && *hold > lease
        {
            errors.push(syn::Error::new(
                *span,
                hold_longer_than_lease(hold_text, &lease_text),
            ));
        }
        if let (Some((true, span)), Some(_)) = (read, permits) {
            errors.push(syn::Error::new(
                span,
                "`permits` makes a semaphore, which has no `mode = \"read\"`; remove one of them",
            ));
        }
        if let (Some((_, span)), Some(_)) = (permits, &keys) {
            errors.push(syn::Error::new(
                span,
                "`permits` makes a semaphore of one key; with `keys = [..]` remove one of them",
            ));
        }
        if let Some(fair_lit) = &fair
            && fair_lit.value
            && (permits.is_some() || matches!(read, Some((true, _))))
        {
            errors.push(syn::Error::new(
                fair_lit.span(),
                "`fair = true` applies to exclusive locks, not to `mode = \"read\"` or `permits`; \
                 remove one of them",
            ));
        }
        if let Some(error) = combine(errors) {
            return Err(error);
        }
        let (keys, multi) = match (key, keys) {
            (Some(key), _) => (Some(vec![key]), false),
            (None, keys) => (keys, true),
        };
        match keys {
            Some(keys) => Ok(Args {
                keys,
                multi,
                fair,
                lease,
                wait,
                watchdog,
                on_lost: on_lost.unwrap_or(OnLost::Cancel),
                hold_at_least: hold_at_least.map(|(millis, _, _)| millis),
                read: read.is_some_and(|(is_read, _)| is_read),
                permits: permits.map(|(n, _)| n),
                krate,
            }),
            // Unreachable: a missing or invalid key pushed an error above.
            None => Err(syn::Error::new(
                attribute,
                "missing required argument `key`",
            )),
        }
    }
}

/// The runtime's `MAX_LEASE` (one year), in milliseconds: a longer lease is rejected at run
/// time with `LockError::InvalidConfig`, so it is rejected here first.
const MAX_LEASE_MILLIS: u64 = 365 * 24 * 3_600_000;

fn check_lease(millis: u64, span: Span) -> syn::Result<()> {
    if millis == 0 {
        return Err(syn::Error::new(
            span,
            "`lease` must be greater than zero, e.g. `lease = \"30s\"`",
        ));
    }
    if millis > MAX_LEASE_MILLIS {
        return Err(syn::Error::new(
            span,
            "`lease` must be at most one year (\"8760h\"); with the watchdog on, a shorter lease \
             is renewed for as long as the function runs",
        ));
    }
    Ok(())
}

/// `hold_at_least` beyond the lease: the lease (with `watchdog = false`, the "at most") is the
/// longest the key stays taken, and the runtime rejects it too.
fn hold_longer_than_lease(hold: &str, lease: &str) -> String {
    format!(
        "`hold_at_least = \"{hold}\"` is longer than `lease = \"{lease}\"`; the key stays taken \
         at most for the lease: shorten `hold_at_least` or lengthen `lease`"
    )
}

/// The text of a duration literal already parsed by [`duration`].
fn duration_text(value: &Expr) -> String {
    match literal(value) {
        Some(Lit::Str(lit)) => lit.value(),
        _ => String::new(),
    }
}

fn unknown_argument(name: &str) -> String {
    match similar_name(name, ARGUMENTS.iter().map(|s| (*s).to_owned())) {
        Some(similar) => format!("unknown argument `{name}`; did you mean `{similar}`?"),
        None => format!(
            "unknown argument `{name}`; expected one of {}",
            ARGUMENTS
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A well-formed use of each argument, for suggestions.
fn example(name: &str) -> &'static str {
    match name {
        "key" => "key = \"stock:{id}\"",
        "lease" => "lease = \"30s\"",
        "wait" => "wait = \"1s\"",
        "watchdog" => "watchdog = false",
        "on_lost" => "on_lost = \"ignore\"",
        "hold_at_least" => "hold_at_least = \"30s\"",
        "mode" => "mode = \"read\"",
        "permits" => "permits = 8",
        "keys" => "keys = [\"acct:{from}\", \"acct:{to}\"]",
        "fair" => "fair = true",
        _ => "crate = \"dlock_runtime\"",
    }
}

/// Looks through the invisible groups `macro_rules!` puts around `$value:expr`.
fn ungroup(mut value: Expr) -> Expr {
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    value
}

fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        _ => None,
    }
}

/// The single identifier of a path expression such as `id` or `ignore`.
fn lone_identifier(value: &Expr) -> Option<&Ident> {
    match value {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
        _ => None,
    }
}

fn key_literal(value: &Expr) -> syn::Result<LitStr> {
    if let Some(Lit::Str(lit)) = literal(value) {
        return Ok(lit.clone());
    }
    let message = match lone_identifier(value) {
        Some(ident) => format!(
            "expected a string literal for `key`; to use the parameter `{ident}` write \
             `key = \"{{{ident}}}\"`"
        ),
        None => "expected a string literal for `key`, e.g. `key = \"stock:{id}\"`".to_owned(),
    };
    Err(syn::Error::new(value.span(), message))
}

/// `keys = ["..", ..]`: a non-empty array of string literals.
fn key_list(value: &Expr) -> syn::Result<Vec<LitStr>> {
    let Expr::Array(ExprArray { elems, .. }) = value else {
        let hint = match literal(value) {
            Some(Lit::Str(lit)) => format!(
                "expected an array of string literals for `keys`; write `keys = [{:?}]`, or \
                 `key = {:?}` for one key",
                lit.value(),
                lit.value()
            ),
            _ => "expected an array of string literals for `keys`, e.g. \
                  `keys = [\"acct:{from}\", \"acct:{to}\"]`"
                .to_owned(),
        };
        return Err(syn::Error::new(value.span(), hint));
    };
    if elems.is_empty() {
        return Err(syn::Error::new(
            value.span(),
            "`keys` needs at least one key, e.g. `keys = [\"acct:{from}\", \"acct:{to}\"]`",
        ));
    }
    let mut errors = Vec::new();
    let mut keys = Vec::new();
    for elem in elems {
        match literal(&ungroup(elem.clone())) {
            Some(Lit::Str(lit)) => keys.push(lit.clone()),
            _ => errors.push(syn::Error::new(
                elem.span(),
                "expected a string literal in `keys`, e.g. `\"acct:{from}\"`",
            )),
        }
    }
    match combine(errors) {
        Some(error) => Err(error),
        None => Ok(keys),
    }
}

fn duration(value: &Expr, name: &str) -> syn::Result<u64> {
    match literal(value) {
        Some(Lit::Str(lit)) => parse_millis(&lit.value())
            .map_err(|error| syn::Error::new(lit.span(), error.message(&lit.value()))),
        Some(Lit::Int(int)) => Err(syn::Error::new(
            int.span(),
            format!(
                "expected a string literal with a unit for `{name}`, e.g. `{name} = \"{}s\"`",
                int.base10_digits()
            ),
        )),
        _ => Err(syn::Error::new(
            value.span(),
            format!(
                "expected a string literal for `{name}`, e.g. `{}`",
                example(name)
            ),
        )),
    }
}

fn bool_literal(value: &Expr, name: &str) -> syn::Result<LitBool> {
    match literal(value) {
        Some(Lit::Bool(lit)) => Ok(lit.clone()),
        Some(Lit::Str(lit)) if matches!(lit.value().as_str(), "true" | "false") => {
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "expected `true` or `false` for `{name}`, found a string literal; write \
                     `{name} = {}` without quotes",
                    lit.value()
                ),
            ))
        }
        _ => Err(syn::Error::new(
            value.span(),
            format!("expected `true` or `false` for `{name}`"),
        )),
    }
}

fn on_lost_value(value: &Expr) -> syn::Result<OnLost> {
    match literal(value) {
        Some(Lit::Str(lit)) => match lit.value().as_str() {
            "cancel" => Ok(OnLost::Cancel),
            "ignore" => Ok(OnLost::Ignore),
            other => Err(syn::Error::new(
                lit.span(),
                format!("invalid value {other:?} for `on_lost`; expected \"cancel\" or \"ignore\""),
            )),
        },
        _ => {
            let message = match lone_identifier(value) {
                Some(ident) if ident == "cancel" || ident == "ignore" => format!(
                    "expected a string literal for `on_lost`; write `on_lost = \"{ident}\"`"
                ),
                _ => "expected a string literal for `on_lost`: \"cancel\" or \"ignore\"".to_owned(),
            };
            Err(syn::Error::new(value.span(), message))
        }
    }
}

/// `"read"` (`true`) or `"write"` (`false`).
fn mode_value(value: &Expr) -> syn::Result<bool> {
    match literal(value) {
        Some(Lit::Str(lit)) => match lit.value().as_str() {
            "read" => Ok(true),
            "write" => Ok(false),
            other => Err(syn::Error::new(
                lit.span(),
                format!("invalid value {other:?} for `mode`; expected \"read\" or \"write\""),
            )),
        },
        _ => {
            let message = match lone_identifier(value) {
                Some(ident) if ident == "read" || ident == "write" => {
                    format!("expected a string literal for `mode`; write `mode = \"{ident}\"`")
                }
                _ => "expected a string literal for `mode`: \"read\" or \"write\"".to_owned(),
            };
            Err(syn::Error::new(value.span(), message))
        }
    }
}

/// A whole number of permits, at least 1.
fn permits_value(value: &Expr) -> syn::Result<u32> {
    let Some(Lit::Int(int)) = literal(value) else {
        return Err(syn::Error::new(
            value.span(),
            "expected a whole number for `permits`, e.g. `permits = 8`",
        ));
    };
    match int.base10_parse::<u32>() {
        Ok(0) => Err(syn::Error::new(
            int.span(),
            "`permits` must be at least 1: a semaphore of 0 permits can never be held",
        )),
        Ok(n) => Ok(n),
        Err(_) => Err(syn::Error::new(
            int.span(),
            format!("`permits` must be a whole number up to {}", u32::MAX),
        )),
    }
}

fn crate_path(value: &Expr) -> syn::Result<Path> {
    match literal(value) {
        Some(Lit::Str(lit)) => lit.parse_with(Path::parse_mod_style).map_err(|_| {
            syn::Error::new(
                lit.span(),
                format!(
                    "invalid path {:?} for `crate`; expected a path such as \"dlock_runtime\"",
                    lit.value()
                ),
            )
        }),
        _ => {
            let message = match value {
                Expr::Path(path) if path.qself.is_none() => format!(
                    "expected a string literal for `crate`; write `crate = \"{}\"`",
                    path_text(&path.path)
                ),
                _ => "expected a string literal for `crate`, e.g. `crate = \"dlock_runtime\"`"
                    .to_owned(),
            };
            Err(syn::Error::new(value.span(), message))
        }
    }
}

fn path_text(path: &Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    let prefix = if path.leading_colon.is_some() {
        "::"
    } else {
        ""
    };
    format!("{prefix}{}", segments.join("::"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod tests;
