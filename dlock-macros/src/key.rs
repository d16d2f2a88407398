//! Key templates: `"stock:{id}"`, `"order:<order.user.id>"`, `"{self.tenant}:{{literal}}"`.
//!
//! Two phases, like the rest of the crate:
//!
//! 1. [`parse_template`] turns the literal's text into [`Segment`]s. It knows nothing about the
//!    function, so it is unit-tested on plain strings.
//! 2. [`resolve`] checks each placeholder's first name against the bindings introduced by the
//!    function's parameters ([`Bindings`]) and returns [`KeyPart`]s that `expand.rs` turns into
//!    one `format!` call.
//!
//! Grammar of the text:
//!
//! ```text
//! template    = { text | escape | placeholder }
//! escape      = "{{" | "}}" | "<<" | ">>"          (one literal brace or angle bracket)
//! placeholder = "{" path "}" | "<" path ">"
//! path        = root { "." member }
//! root        = "self" | identifier                (a parameter binding)
//! member      = identifier | digits                (a named or tuple field)
//! ```

use std::ops::Range;

use proc_macro2::Span;
use syn::{FnArg, Ident, Index, LitStr, Member, Pat, Signature, Token};

use crate::{combine, similar_name};

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Literal text, escapes already resolved (`{{` is stored as `{`).
    Text(String),
    /// A `{path}` or `<path>`.
    Placeholder(Placeholder),
}

/// A placeholder as written in the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    /// The placeholder with its delimiters, exactly as written: `{order.id}` or `<id>`.
    pub(crate) written: String,
    /// `["order", "id"]`; the first element is `self` or a binding name.
    pub(crate) path: Vec<String>,
    /// Byte range of `written` inside the template text.
    pub(crate) range: Range<usize>,
}

/// A mistake in the template text, with the byte range it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    pub(crate) message: String,
    pub(crate) range: Range<usize>,
}

/// Parses the template text, collecting every mistake rather than stopping at the first.
pub(crate) fn parse_template(text: &str) -> Result<Vec<Segment>, Vec<TemplateError>> {
    let mut segments = Vec::new();
    let mut errors = Vec::new();
    let mut literal = String::new();
    let mut rest = text.char_indices().peekable();

    while let Some((start, c)) = rest.next() {
        let close = match c {
            '{' => '}',
            '<' => '>',
            '}' | '>' => {
                if rest.next_if(|&(_, next)| next == c).is_some() {
                    literal.push(c);
                } else {
                    errors.push(TemplateError {
                        message: format!(
                            "unmatched `{c}` in key; write `{c}{c}` for a literal `{c}`"
                        ),
                        range: start..start + 1,
                    });
                }
                continue;
            }
            _ => {
                literal.push(c);
                continue;
            }
        };
        if rest.next_if(|&(_, next)| next == c).is_some() {
            literal.push(c);
            continue;
        }
        let body_start = start + 1;
        let Some(body_len) = text[body_start..].find(close) else {
            errors.push(TemplateError {
                message: format!(
                    "unclosed key placeholder `{}`; add `{close}`, or write `{c}{c}` for a literal `{c}`",
                    &text[start..]
                ),
                range: start..text.len(),
            });
            break;
        };
        // Skip the body and the closing delimiter.
        let end = body_start + body_len + 1;
        while rest.next_if(|&(index, _)| index < end).is_some() {}

        let written = &text[start..end];
        let body = &text[body_start..end - 1];
        match parse_path(body, written, c, close) {
            Ok(path) => {
                if !literal.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut literal)));
                }
                segments.push(Segment::Placeholder(Placeholder {
                    written: written.to_owned(),
                    path,
                    range: start..end,
                }));
            }
            Err(message) => errors.push(TemplateError {
                message,
                range: start..end,
            }),
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Text(literal));
    }
    if errors.is_empty() {
        Ok(segments)
    } else {
        Err(errors)
    }
}

/// Splits a placeholder body (`order.user.id`) into its members.
fn parse_path(body: &str, written: &str, open: char, close: char) -> Result<Vec<String>, String> {
    if body.is_empty() {
        return Err(format!(
            "empty key placeholder `{written}`; name a parameter, e.g. `{open}id{close}`, \
             or write `{open}{open}{close}{close}` for literal `{open}{close}`"
        ));
    }
    if let Some((name, _spec)) = body.split_once(':') {
        return Err(format!(
            "key placeholder `{written}` has a format spec, but keys are always formatted with \
             `Display`; write `{open}{name}{close}`"
        ));
    }
    let path: Vec<String> = body.split('.').map(str::to_owned).collect();
    let valid = path.iter().enumerate().all(|(position, member)| {
        let lexically_plain = !member.is_empty()
            && member
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '#');
        lexically_plain
            && if position == 0 {
                member == "self" || is_identifier(member)
            } else {
                is_identifier(member) || is_tuple_index(member)
            }
    });
    if valid {
        Ok(path)
    } else {
        Err(format!(
            "invalid key placeholder `{written}`: expected a parameter name or a field path, \
             e.g. `{open}order.id{close}`"
        ))
    }
}

fn is_identifier(text: &str) -> bool {
    syn::parse_str::<Ident>(text).is_ok()
}

/// `0`, `1`, `12`, ... as rustc accepts them after a `.` (no leading zeros).
fn is_tuple_index(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'))
        && text.parse::<u32>().is_ok()
}

/// The names a function's parameters bind, in order, plus its receiver.
pub(crate) struct Bindings {
    fn_name: Ident,
    receiver: Option<Token![self]>,
    names: Vec<Ident>,
}

impl Bindings {
    /// Collects every binding of `sig`'s parameters, including those inside patterns such as
    /// `Path(id): Path<u64>`, `(a, b): (u8, u8)`, `Point { x, y: ref py }` or `mut n: u32`.
    pub(crate) fn of(sig: &Signature) -> Self {
        let mut bindings = Bindings {
            fn_name: sig.ident.clone(),
            receiver: None,
            names: Vec::new(),
        };
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(receiver) => bindings.receiver = Some(receiver.self_token),
                FnArg::Typed(typed) => collect_pattern_bindings(&typed.pat, &mut bindings.names),
            }
        }
        bindings
    }

    fn find(&self, name: &str) -> Option<&Ident> {
        self.names.iter().find(|ident| *ident == name)
    }
}

fn collect_pattern_bindings(pat: &Pat, names: &mut Vec<Ident>) {
    let mut push = |ident: &Ident| {
        if !names.contains(ident) {
            names.push(ident.clone());
        }
    };
    match pat {
        Pat::Ident(binding) => {
            push(&binding.ident);
            if let Some((_, sub)) = &binding.subpat {
                collect_pattern_bindings(sub, names);
            }
        }
        Pat::Or(or) => or
            .cases
            .iter()
            .for_each(|case| collect_pattern_bindings(case, names)),
        Pat::Paren(paren) => collect_pattern_bindings(&paren.pat, names),
        Pat::Reference(reference) => collect_pattern_bindings(&reference.pat, names),
        Pat::Slice(syn::PatSlice { elems, .. })
        | Pat::Tuple(syn::PatTuple { elems, .. })
        | Pat::TupleStruct(syn::PatTupleStruct { elems, .. }) => elems
            .iter()
            .for_each(|elem| collect_pattern_bindings(elem, names)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| collect_pattern_bindings(&field.pat, names)),
        Pat::Type(typed) => collect_pattern_bindings(&typed.pat, names),
        Pat::Guard(guarded) => collect_pattern_bindings(&guarded.pat, names),
        // Literals, ranges, paths, wildcards, rest patterns, constants and macros bind nothing
        // we can see.
        _ => {}
    }
}

/// One piece of the key as `expand.rs` emits it.
pub(crate) enum KeyPart {
    /// Literal text, unescaped.
    Text(String),
    /// A value formatted with `Display`: `root.member.member`.
    Value { root: Root, members: Vec<Member> },
}

/// What a placeholder's first name refers to.
pub(crate) enum Root {
    /// `self`, spanned so that it resolves like the receiver.
    SelfValue(Token![self]),
    /// A parameter binding, spanned so that it resolves like the binding.
    Binding(Ident),
}

/// Parses `key` and checks its placeholders against `bindings`.
///
/// Every error spans the key literal: stable Rust cannot point inside a string literal. When the
/// compiler can (nightly), the span narrows to the offending placeholder.
pub(crate) fn resolve(key: &LitStr, bindings: &Bindings) -> Result<Vec<KeyPart>, syn::Error> {
    let text = key.value();
    let span_of = |range: &Range<usize>| subspan(key, &text, range);
    let segments = match parse_template(&text) {
        Ok(segments) => segments,
        Err(errors) => {
            let errors = errors
                .into_iter()
                .map(|error| syn::Error::new(span_of(&error.range), error.message));
            return Err(
                combine(errors).unwrap_or_else(|| syn::Error::new(key.span(), "invalid key"))
            );
        }
    };
    if segments.is_empty() {
        return Err(syn::Error::new(
            key.span(),
            "empty key; name the resource the lock guards, e.g. `key = \"stock:{id}\"`",
        ));
    }

    let mut errors = Vec::new();
    let mut parts = Vec::with_capacity(segments.len());
    for segment in segments {
        let placeholder = match segment {
            Segment::Text(text) => {
                parts.push(KeyPart::Text(text));
                continue;
            }
            Segment::Placeholder(placeholder) => placeholder,
        };
        let span = span_of(&placeholder.range);
        // `parse_template` guarantees at least one member, but stay total anyway.
        let Some((first, rest)) = placeholder.path.split_first() else {
            continue;
        };
        let root = if first == "self" {
            match bindings.receiver {
                Some(receiver) => Root::SelfValue(Token![self](receiver.span.located_at(span))),
                None => {
                    errors.push(syn::Error::new(
                        span,
                        format!(
                            "key placeholder `{}` uses `self`, but `{}` has no `self` parameter",
                            placeholder.written, bindings.fn_name
                        ),
                    ));
                    continue;
                }
            }
        } else if let Some(binding) = bindings.find(first) {
            let mut ident = binding.clone();
            ident.set_span(binding.span().located_at(span));
            Root::Binding(ident)
        } else {
            errors.push(syn::Error::new(
                span,
                unknown_binding_message(&placeholder, first, bindings),
            ));
            continue;
        };
        let members = rest.iter().map(|member| to_member(member, span)).collect();
        parts.push(KeyPart::Value { root, members });
    }
    match combine(errors) {
        Some(error) => Err(error),
        None => Ok(parts),
    }
}

fn unknown_binding_message(placeholder: &Placeholder, name: &str, bindings: &Bindings) -> String {
    let mut message = format!(
        "key placeholder `{}` names no parameter of `{}`",
        placeholder.written, bindings.fn_name
    );
    let candidates = bindings
        .names
        .iter()
        .map(ToString::to_string)
        .chain(bindings.receiver.map(|_| "self".to_owned()));
    if let Some(similar) = similar_name(name, candidates) {
        let (open, close) = if placeholder.written.starts_with('<') {
            ('<', '>')
        } else {
            ('{', '}')
        };
        let mut path = placeholder.path.clone();
        if let Some(first) = path.first_mut() {
            *first = similar;
        }
        message.push_str(&format!(
            "; did you mean `{open}{}{close}`?",
            path.join(".")
        ));
    }
    message
}

/// `member` was accepted by [`parse_path`]: a tuple index, or an identifier that `syn` parsed,
/// so `Ident::new` and `Ident::new_raw` cannot panic on it.
fn to_member(member: &str, span: Span) -> Member {
    if let Ok(index) = member.parse::<u32>() {
        return Member::Unnamed(Index { index, span });
    }
    let ident = match member.strip_prefix("r#") {
        Some(raw) => Ident::new_raw(raw, span),
        None => Ident::new(member, span),
    };
    Member::Named(ident)
}

/// The span of `range` inside the literal when the compiler can give one, else the literal's.
fn subspan(key: &LitStr, text: &str, range: &Range<usize>) -> Span {
    // Offsets into the value equal offsets into the source only for a plain `"..."` literal
    // without escapes; the opening quote shifts them by one.
    let token = key.token();
    let source = token.to_string();
    if source.len() == text.len() + 2
        && source.get(1..source.len() - 1) == Some(text)
        && let Some(span) = token.subspan(range.start + 1..range.end + 1)
    {
        return span;
    }
    key.span()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod tests;
