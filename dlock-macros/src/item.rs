//! The function under the attribute: parsed as little as possible, and checked for what rules
//! out a guarded function.

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, GenericParam, Signature, Token, Visibility, braced};

/// The item under the attribute, parsed as little as possible (tracing-attributes'
/// `MaybeItemFn`): the body is kept as tokens and emitted untouched.
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) defaultness: Option<Token![default]>,
    pub(crate) sig: Signature,
    /// `#![...]` at the top of the body; they stay at the top of the new body.
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) body: TokenStream,
    /// The `;` of a body-less declaration such as `async fn f(&self);` in a trait.
    pub(crate) missing_body: Option<Token![;]>,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let defaultness: Option<Token![default]> = input.parse()?;
        if input.fork().parse::<Signature>().is_err() {
            return Err(input.error(
                "`#[distributed_lock]` can only be used on an `async fn`, e.g. \
                 `async fn buy(id: u64) -> Result<(), ShopError>`",
            ));
        }
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Ok(LockedFn {
                attrs,
                vis,
                defaultness,
                sig,
                inner_attrs: Vec::new(),
                body: TokenStream::new(),
                missing_body: Some(input.parse()?),
            });
        }
        let content;
        braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body: TokenStream = content.parse()?;
        Ok(LockedFn {
            attrs,
            vis,
            defaultness,
            sig,
            inner_attrs,
            body,
            missing_body: None,
        })
    }
}

/// Everything about the signature that rules out a guarded function.
pub(crate) fn check_signature(func: &LockedFn) -> Vec<syn::Error> {
    let sig = &func.sig;
    let mut errors = Vec::new();
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[distributed_lock]` cannot be used on a `const fn`; remove `const`",
        ));
    }
    if let Some(abi) = &sig.abi {
        let written = match &abi.name {
            Some(name) => format!("extern {:?}", name.value()),
            None => "extern".to_owned(),
        };
        errors.push(syn::Error::new_spanned(
            abi,
            format!("`#[distributed_lock]` cannot be used on an `{written}` function; remove `{written}`"),
        ));
    }
    if sig.asyncness.is_none() && errors.is_empty() {
        let message = if is_async_trait_output(sig) {
            "`#[distributed_lock]` cannot be used inside `#[async_trait]`; use a native `async fn` \
             in the trait instead"
        } else {
            "`#[distributed_lock]` can only be used on an `async fn`; add `async` before `fn`"
        };
        errors.push(syn::Error::new(sig.fn_token.span, message));
    }
    if let Some(semi) = &func.missing_body {
        errors.push(syn::Error::new(
            semi.span,
            format!(
                "`#[distributed_lock]` needs a function body; put it on the implementations of `{}`",
                sig.ident
            ),
        ));
    }
    errors
}

/// `#[async_trait]` has already turned the method into `fn f<'async_trait>(..) -> Pin<Box<..>>`.
fn is_async_trait_output(sig: &Signature) -> bool {
    sig.generics.params.iter().any(|param| {
        matches!(param, GenericParam::Lifetime(lifetime) if lifetime.lifetime.ident == "async_trait")
    })
}
