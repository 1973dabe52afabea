//! Who is asking: the session cookie, the one-time login links that open sessions, and the CSRF
//! token every decision form carries.
//!
//! The secrets come from the operating system's generator (128 bits for a link, 256 for a
//! session); the store keeps only their SHA-256 digests. The CSRF token is derived from the
//! session's secret (a synchronizer token with no table of its own): a page of another origin can
//! make the browser send the cookie, but can neither read it nor the token derived from it.

use toolgate_core::canonical::sha256_hex;
use toolgate_store::approval::StoreError;
use toolgate_store::console::{ConsoleStore, Session};

/// The session cookie's name. Not `session` or `_session`: cookies ignore ports, so an identity
/// provider or another app on the same host would share the name.
pub(super) const COOKIE: &str = "toolgate_console";
/// The cookie that binds an OpenID Connect sign-in's `state` to the browser that started it.
pub(super) const OIDC_COOKIE: &str = "toolgate_console_oidc";

/// What a login link's token is exchanged for: the token's digest in the store.
pub(super) fn digest(secret: &str) -> String {
    sha256_hex(secret.as_bytes())
}

/// The CSRF token of the session whose cookie holds `secret`.
pub(super) fn csrf_token(secret: &str) -> String {
    sha256_hex(format!("toolgate console csrf\0{secret}").as_bytes())
}

/// Compares two tokens in time that depends only on their lengths.
pub(super) fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Why a login link could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The operating system's random generator failed.
    #[error("cannot draw a random login token: {0}")]
    Random(getrandom::Error),
    /// The store could not record the link.
    #[error("cannot record the login link")]
    Store(#[from] StoreError),
}

/// Mints a one-time login link token for `identity`, valid until `expires_at` (unix ms): what
/// goes after `/login?token=`.
///
/// # Errors
/// The generator or the store failed; then no link exists.
pub async fn mint_link(
    store: &ConsoleStore,
    identity: &str,
    expires_at: i64,
    now: i64,
) -> Result<String, LinkError> {
    let token = crate::random_hex(16).map_err(LinkError::Random)?;
    store
        .mint_login(&digest(&token), identity, expires_at, now)
        .await?;
    Ok(token)
}

/// The session cookie's secret in a `Cookie` header, if there is exactly one.
pub(super) fn cookie_secret(headers: &http::HeaderMap) -> Option<String> {
    cookie(headers, COOKIE)
}

/// The value of the one cookie `name` whose value is 64 hex digits (what this console sets);
/// `None` when there is none, or more than one (one planted by a sibling subdomain, say: trust
/// neither).
pub(super) fn cookie(headers: &http::HeaderMap, name: &str) -> Option<String> {
    let mut found = None;
    for header in headers.get_all(http::header::COOKIE) {
        let Ok(text) = header.to_str() else { continue };
        for pair in text.split(';') {
            if let Some((key, value)) = pair.trim().split_once('=')
                && key == name
            {
                if found.is_some() {
                    return None;
                }
                found = Some(value.to_owned());
            }
        }
    }
    found.filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A live session found from a request's cookie, with the secret its CSRF token comes from.
#[derive(Clone, Debug)]
pub(super) struct SignedIn {
    pub(super) session: Session,
    pub(super) secret: String,
}

impl SignedIn {
    pub(super) fn csrf(&self) -> String {
        csrf_token(&self.secret)
    }
}

/// The session of this request, if its cookie names a live one.
///
/// # Errors
/// The store could not answer (the request is then refused, not treated as signed in).
pub(super) async fn signed_in(
    store: &ConsoleStore,
    headers: &http::HeaderMap,
    now: i64,
) -> Result<Option<SignedIn>, StoreError> {
    let Some(secret) = cookie_secret(headers) else {
        return Ok(None);
    };
    Ok(store
        .session(&digest(&secret), now)
        .await?
        .map(|session| SignedIn { session, secret }))
}

/// The `Set-Cookie` value of cookie `name` holding `value` for `max_age_s` seconds on `path`, or
/// of its removal (`None`). HttpOnly always; SameSite=Lax so that a link from a notification, or
/// a provider's redirect back, arrives with it.
pub(super) fn set_cookie(
    name: &str,
    value: Option<&str>,
    max_age_s: i64,
    path: &str,
    secure: bool,
) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let (value, max_age_s) = value.map_or(("", 0), |v| (v, max_age_s));
    format!("{name}={value}; Path={path}; Max-Age={max_age_s}; HttpOnly; SameSite=Lax{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cookie_of_our_name_is_read_and_two_are_trusted_by_nobody() {
        let secret = "ab".repeat(32);
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            format!("other=1; {COOKIE}={secret}; x=y").parse().unwrap(),
        );
        assert_eq!(cookie_secret(&headers), Some(secret.clone()));
        headers.append(
            http::header::COOKIE,
            format!("{COOKIE}={}", "cd".repeat(32)).parse().unwrap(),
        );
        assert_eq!(cookie_secret(&headers), None);
        let mut short = http::HeaderMap::new();
        short.insert(
            http::header::COOKIE,
            format!("{COOKIE}=abc").parse().unwrap(),
        );
        assert_eq!(cookie_secret(&short), None);
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        let token = csrf_token("s");
        assert!(same_token(&token, &csrf_token("s")));
        assert!(!same_token(&token, &csrf_token("t")));
        assert!(!same_token(&token, ""));
        assert_ne!(csrf_token("s"), digest("s"));
    }
}
