//! Unit tests of `key`.

use super::{Bindings, KeyPart, Placeholder, Root, Segment, parse_template, resolve};
use proc_macro2::Span;
use syn::{LitStr, Member, Signature};

fn text(s: &str) -> Segment {
    Segment::Text(s.to_owned())
}

fn placeholder(written: &str, path: &[&str], range: std::ops::Range<usize>) -> Segment {
    Segment::Placeholder(Placeholder {
        written: written.to_owned(),
        path: path.iter().map(|s| (*s).to_owned()).collect(),
        range,
    })
}

fn errors(template: &str) -> Vec<String> {
    match parse_template(template) {
        Ok(segments) => panic!("{template:?} parsed as {segments:?}"),
        Err(errors) => errors.into_iter().map(|e| e.message).collect(),
    }
}

#[test]
fn plain_text_is_one_segment() {
    assert_eq!(
        parse_template("jobs:nightly"),
        Ok(vec![text("jobs:nightly")])
    );
    assert_eq!(parse_template(""), Ok(vec![]));
}

#[test]
fn both_bracket_forms() {
    assert_eq!(
        parse_template("stock:{id}"),
        Ok(vec![text("stock:"), placeholder("{id}", &["id"], 6..10)])
    );
    assert_eq!(
        parse_template("stock:<id>"),
        Ok(vec![text("stock:"), placeholder("<id>", &["id"], 6..10)])
    );
    assert_eq!(
        parse_template("<a>-{b}"),
        Ok(vec![
            placeholder("<a>", &["a"], 0..3),
            text("-"),
            placeholder("{b}", &["b"], 4..7),
        ])
    );
}

#[test]
fn nested_fields_and_self() {
    assert_eq!(
        parse_template("order:{order.user.id}"),
        Ok(vec![
            text("order:"),
            placeholder("{order.user.id}", &["order", "user", "id"], 6..21),
        ])
    );
    assert_eq!(
        parse_template("<self.tenant>:<pair.0>"),
        Ok(vec![
            placeholder("<self.tenant>", &["self", "tenant"], 0..13),
            text(":"),
            placeholder("<pair.0>", &["pair", "0"], 14..22),
        ])
    );
    assert_eq!(
        parse_template("{r#type}"),
        Ok(vec![placeholder("{r#type}", &["r#type"], 0..8)])
    );
}

#[test]
fn escapes() {
    assert_eq!(parse_template("{{}}"), Ok(vec![text("{}")]));
    assert_eq!(parse_template("<<>>"), Ok(vec![text("<>")]));
    assert_eq!(
        parse_template("{{{id}}}"),
        Ok(vec![
            text("{"),
            placeholder("{id}", &["id"], 2..6),
            text("}")
        ])
    );
    assert_eq!(
        parse_template("a<<{id}>>b"),
        Ok(vec![
            text("a<"),
            placeholder("{id}", &["id"], 3..7),
            text(">b")
        ])
    );
    assert_eq!(parse_template("ü{{ü"), Ok(vec![text("ü{ü")]));
}

#[test]
fn empty_placeholder() {
    assert_eq!(
        errors("stock:{}"),
        [
            "empty key placeholder `{}`; name a parameter, e.g. `{id}`, or write `{{}}` for literal `{}`"
        ]
    );
    assert_eq!(
        errors("<>"),
        [
            "empty key placeholder `<>`; name a parameter, e.g. `<id>`, or write `<<>>` for literal `<>`"
        ]
    );
}

#[test]
fn unclosed_placeholder() {
    assert_eq!(
        errors("stock:{id"),
        ["unclosed key placeholder `{id`; add `}`, or write `{{` for a literal `{`"]
    );
    assert_eq!(
        errors("stock:<id"),
        ["unclosed key placeholder `<id`; add `>`, or write `<<` for a literal `<`"]
    );
    let unclosed = parse_template("a{id").unwrap_err();
    assert_eq!(unclosed[0].range, 1..4);
}

#[test]
fn stray_closing_delimiters() {
    assert_eq!(
        errors("stock}"),
        ["unmatched `}` in key; write `}}` for a literal `}`"]
    );
    assert_eq!(
        errors("a>b"),
        ["unmatched `>` in key; write `>>` for a literal `>`"]
    );
    assert_eq!(parse_template("ab}").unwrap_err()[0].range, 2..3);
}

#[test]
fn invalid_paths() {
    for template in [
        "{ id }",
        "{a..b}",
        "{.a}",
        "{a.}",
        "{0}",
        "{a-b}",
        "{a.b c}",
        "{a{b}",
        "{a.00}",
        "{a.self}",
        "{a._}",
        "{type}",
        "{a.r#self}",
    ] {
        let errors = errors(template);
        assert_eq!(errors.len(), 1, "{template:?}: {errors:?}");
        assert!(
            errors[0].starts_with("invalid key placeholder"),
            "{template:?}: {errors:?}"
        );
    }
    assert_eq!(
        errors("{id:?}"),
        [
            "key placeholder `{id:?}` has a format spec, but keys are always formatted with `Display`; write `{id}`"
        ]
    );
}

#[test]
fn collects_every_error() {
    let all = parse_template("{}:}:{a b}:{ok}:{x").unwrap_err();
    let ranges: Vec<_> = all.iter().map(|e| e.range.clone()).collect();
    assert_eq!(ranges, [0..2, 3..4, 5..10, 16..18]);
}

fn bindings(sig: &str) -> Bindings {
    let sig: Signature = syn::parse_str(sig).unwrap();
    Bindings::of(&sig)
}

fn names(sig: &str) -> Vec<String> {
    bindings(sig)
        .names
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn bindings_inside_patterns() {
    assert_eq!(names("async fn f(id: u64, qty: u32)"), ["id", "qty"]);
    assert_eq!(names("async fn f(Path(id): Path<u64>)"), ["id"]);
    assert_eq!(names("async fn f((a, b): (u8, u8))"), ["a", "b"]);
    assert_eq!(
        names("async fn f(Point { x, y: ref mut py, .. }: Point)"),
        ["x", "py"]
    );
    assert_eq!(
        names("async fn f(mut n: u32, _: u8, ref r: u8)"),
        ["n", "r"]
    );
    assert_eq!(
        names("async fn f(&(a, [b, ..]): &(u8, [u8; 2]))"),
        ["a", "b"]
    );
    assert_eq!(
        names("async fn f(whole @ Pair(x, _): Pair)"),
        ["whole", "x"]
    );
    assert!(bindings("async fn f(&self)").receiver.is_some());
    assert!(
        bindings("async fn f(self: Arc<Self>, id: u8)")
            .receiver
            .is_some()
    );
    assert!(bindings("async fn f(id: u8)").receiver.is_none());
}

fn resolve_errors(key: &str, sig: &str) -> Vec<String> {
    let key = LitStr::new(key, Span::call_site());
    match resolve(&key, &bindings(sig)) {
        Ok(_) => panic!("{:?} resolved", key.value()),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn resolves_roots_and_members() {
    let key = LitStr::new("t:{self.a.0}:<id>", Span::call_site());
    let parts = resolve(&key, &bindings("async fn f(&self, id: u8)")).unwrap();
    assert_eq!(parts.len(), 4);
    match &parts[1] {
        KeyPart::Value {
            root: Root::SelfValue(_),
            members,
        } => {
            assert!(matches!(&members[0], Member::Named(name) if name == "a"));
            assert!(matches!(&members[1], Member::Unnamed(index) if index.index == 0));
        }
        _ => panic!("expected `self.a.0`"),
    }
    assert!(
        matches!(&parts[3], KeyPart::Value { root: Root::Binding(id), members } if id == "id" && members.is_empty())
    );
}

#[test]
fn unknown_binding_suggests_a_close_name() {
    assert_eq!(
        resolve_errors("stock:{idd}", "async fn buy(id: u64, qty: u32)"),
        ["key placeholder `{idd}` names no parameter of `buy`; did you mean `{id}`?"]
    );
    assert_eq!(
        resolve_errors("stock:<ordr.id>", "async fn buy(order: Order)"),
        ["key placeholder `<ordr.id>` names no parameter of `buy`; did you mean `<order.id>`?"]
    );
    assert_eq!(
        resolve_errors("stock:{sku}", "async fn buy(id: u64)"),
        ["key placeholder `{sku}` names no parameter of `buy`"]
    );
}

#[test]
fn self_needs_a_receiver() {
    assert_eq!(
        resolve_errors("{self.id}", "async fn buy(id: u64)"),
        ["key placeholder `{self.id}` uses `self`, but `buy` has no `self` parameter"]
    );
}

#[test]
fn empty_key_is_rejected() {
    assert_eq!(
        resolve_errors("", "async fn f()"),
        ["empty key; name the resource the lock guards, e.g. `key = \"stock:{id}\"`"]
    );
}

#[test]
fn reports_every_bad_placeholder() {
    assert_eq!(resolve_errors("{a}:{b}", "async fn f()").len(), 2);
}
