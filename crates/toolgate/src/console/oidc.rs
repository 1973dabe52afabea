//! Signing in to the console with the team's identity provider: OpenID Connect, authorization
//! code flow with PKCE (S256), as a relying party (OpenID Connect Core 1.0 §3.1; RFC 7636).
//!
//! Owns the provider's discovered endpoints, the token request, and every check of the ID token
//! that comes back: signature by a key of the provider's JWKS with a pinned algorithm, issuer,
//! audience (this client; `azp` when there are several), expiry, `iat` not in the future, and the
//! nonce this sign-in sent. The `state` (bound to the browser by a cookie, used once by the
//! store) is the console's, in `mod.rs`. The identity is `user:SUB`, with the groups of the ID
//! token's `groups` claim, matched against the policy's `group:NAME` approvers.
//!
//! Design decision: the JWKS handling is the resource server's own (`http::auth::Verifier`, with
//! the client id as the audience), so an ID token meets the same key, algorithm and one-reading
//! rules as an access token, from one implementation.

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use toolgate_core::secret::Secret;

use crate::http::auth::{self, AuthConfig, KeySource, Rejection, Verifier};

/// The scopes asked for: the identity, and the groups the approver rules name.
const SCOPES: &str = "openid profile email groups";
/// Longest discovery document or token response read.
const MAX_RESPONSE: usize = 64 * 1024;

/// How the console signs people in with an OpenID provider.
#[derive(Clone, Debug)]
pub struct OidcConfig {
    /// The provider's issuer URL (https, or http on loopback); discovery is at
    /// `ISSUER/.well-known/openid-configuration`.
    pub issuer: String,
    /// This console's client id at the provider.
    pub client_id: String,
    /// Its client secret (sent with HTTP Basic); `None` for a public client (PKCE only).
    pub client_secret: Option<Secret>,
    /// Groups allowed to sign in at all (any one of them); empty: anyone the provider vouches for.
    pub allowed_groups: Vec<String>,
}

/// Why the provider could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The issuer, or an endpoint it names, is neither https nor http on loopback.
    #[error("{0} must be https (or http on a loopback address)")]
    InsecureUrl(String),
    /// The discovery document could not be fetched or read.
    #[error("cannot read the provider's discovery document at {url}: {reason}")]
    Discovery {
        /// Where it was looked for.
        url: String,
        /// Why it could not be used.
        reason: String,
    },
    /// The document names another issuer than the one configured (OpenID Discovery §4.3).
    #[error("the discovery document names issuer {found}, not {expected}")]
    IssuerMismatch {
        /// The configured issuer.
        expected: String,
        /// What the document says.
        found: String,
    },
    /// The provider does not offer PKCE with S256.
    #[error("the provider does not support PKCE with S256")]
    NoS256,
    /// The provider's keys could not be loaded.
    #[error("cannot load the provider's keys")]
    Keys(#[from] auth::ConfigError),
}

/// Why a sign-in was refused: shown to the person on the page, and logged.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The token endpoint did not give an ID token for the code.
    #[error("the identity provider did not accept the sign-in ({0})")]
    Token(String),
    /// The ID token failed a check.
    #[error("the ID token was refused: {}", .0.as_str())]
    IdToken(Rejection),
    /// Its nonce is not the one this sign-in sent.
    #[error("the ID token was refused: it was not issued for this sign-in (nonce)")]
    Nonce,
    /// Several audiences, and `azp` is not this client.
    #[error("the ID token was refused: it was issued to another client (azp)")]
    AuthorizedParty,
}

/// A provider found by discovery, ready to sign people in.
#[derive(Debug)]
pub struct Oidc {
    config: OidcConfig,
    authorization_endpoint: url::Url,
    token_endpoint: url::Url,
    redirect_uri: String,
    verifier: Verifier,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    code_challenge_methods_supported: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct TokenResponse {
    id_token: Option<String>,
    error: Option<String>,
}

/// `aud` as far as the console reads it: the verifier has checked that it names this client;
/// what is left is whether it names others too (then `azp` must be this client).
#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    Many(Vec<String>),
    One(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct IdClaims {
    sub: String,
    aud: Audience,
    azp: Option<String>,
    nonce: Option<String>,
    iat: Option<u64>,
    #[serde(default)]
    groups: Vec<String>,
}

/// Who signed in.
#[derive(Debug)]
pub(super) struct Identity {
    /// `user:SUB`.
    pub(super) id: String,
    pub(super) groups: Vec<String>,
}

impl Oidc {
    /// Reads the provider's discovery document and keys; `redirect_uri` is this console's
    /// callback (`…/oidc/callback`) as registered with the provider.
    ///
    /// # Errors
    /// An insecure URL, an unreadable document, another issuer, no S256, or unusable keys.
    pub async fn discover(config: OidcConfig, redirect_uri: String) -> Result<Self, OidcError> {
        let issuer = secure(&config.issuer)?;
        let http = auth::client(Duration::from_secs(10)).map_err(|e| OidcError::Discovery {
            url: config.issuer.clone(),
            reason: e.to_string(),
        })?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.as_str().trim_end_matches('/')
        );
        let failed = |reason: String| OidcError::Discovery {
            url: url.clone(),
            reason,
        };
        let response = http
            .get(&url)
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("HTTP {}", response.status())));
        }
        let body = read_capped(response).await.map_err(failed)?;
        let found: Discovery = serde_json::from_slice(&body).map_err(|e| failed(e.to_string()))?;
        if found.issuer != config.issuer {
            return Err(OidcError::IssuerMismatch {
                expected: config.issuer.clone(),
                found: found.issuer,
            });
        }
        if let Some(methods) = &found.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            return Err(OidcError::NoS256);
        }
        let authorization_endpoint = secure(&found.authorization_endpoint)?;
        let token_endpoint = secure(&found.token_endpoint)?;
        let jwks = secure(&found.jwks_uri)?;
        let verifier = Verifier::new(AuthConfig {
            issuer: config.issuer.clone(),
            // An ID token's audience is the client it was issued to.
            resource: config.client_id.clone(),
            algorithms: ["RS256", "ES256", "EdDSA"]
                .into_iter()
                .map(auth::algorithm)
                .collect::<Result<_, _>>()?,
            keys: KeySource::Url(jwks),
            authorization_servers: Vec::new(),
        })
        .await?;
        Ok(Self {
            config,
            authorization_endpoint,
            token_endpoint,
            redirect_uri,
            verifier,
            http,
        })
    }

    /// The provider's issuer, for the sign-in button.
    pub(super) fn issuer(&self) -> &str {
        &self.config.issuer
    }

    /// Where to send the browser to sign in: the authorization request with this sign-in's
    /// `state`, `nonce` and the S256 challenge of `code_verifier`.
    pub(super) fn authorize_url(
        &self,
        state: &str,
        nonce: &str,
        code_verifier: &str,
        login_hint: Option<&str>,
    ) -> String {
        let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(Sha256::digest(code_verifier.as_bytes()));
        let mut url = self.authorization_endpoint.clone();
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("response_type", "code")
                .append_pair("client_id", &self.config.client_id)
                .append_pair("redirect_uri", &self.redirect_uri)
                .append_pair("scope", SCOPES)
                .append_pair("state", state)
                .append_pair("nonce", nonce)
                .append_pair("code_challenge", &challenge)
                .append_pair("code_challenge_method", "S256");
            if let Some(hint) = login_hint {
                query.append_pair("login_hint", hint);
            }
        }
        url.into()
    }

    /// Exchanges the callback's `code` for an ID token and checks it: who signed in.
    pub(super) async fn identify(
        &self,
        code: &str,
        code_verifier: &str,
        nonce: &str,
    ) -> Result<Identity, Refusal> {
        let id_token = self.exchange(code, code_verifier).await?;
        let claims: IdClaims = self
            .verifier
            .decode(&id_token)
            .await
            .map_err(Refusal::IdToken)?;
        let now = jsonwebtoken::get_current_timestamp();
        if claims
            .iat
            .is_some_and(|iat| iat > now.saturating_add(auth::LEEWAY_SECS))
        {
            return Err(Refusal::IdToken(Rejection::IssuedInFuture));
        }
        if !claims
            .nonce
            .as_deref()
            .is_some_and(|n| super::login::same_token(n, nonce))
        {
            return Err(Refusal::Nonce);
        }
        if let Audience::Many(audiences) = &claims.aud
            && audiences.len() > 1
            && claims.azp.as_deref() != Some(self.config.client_id.as_str())
        {
            return Err(Refusal::AuthorizedParty);
        }
        if claims.sub.is_empty() {
            return Err(Refusal::IdToken(Rejection::Claims));
        }
        Ok(Identity {
            id: format!("user:{}", claims.sub),
            groups: claims.groups,
        })
    }

    /// Whether `identity` may sign in at all.
    pub(super) fn admits(&self, identity: &Identity) -> bool {
        self.config.allowed_groups.is_empty()
            || identity
                .groups
                .iter()
                .any(|g| self.config.allowed_groups.contains(g))
    }

    async fn exchange(&self, code: &str, code_verifier: &str) -> Result<String, Refusal> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", &self.redirect_uri)
            .append_pair("client_id", &self.config.client_id)
            .append_pair("code_verifier", code_verifier)
            .finish();
        let mut request = self
            .http
            .post(self.token_endpoint.clone())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(body);
        if let Some(secret) = &self.config.client_secret {
            // RFC 6749 §2.3.1: each part form-encoded, then Basic.
            let encode =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                encode(&self.config.client_id),
                encode(secret.expose())
            ));
            request = request.header(http::header::AUTHORIZATION, format!("Basic {basic}"));
        }
        let response = request
            .send()
            .await
            .map_err(|e| Refusal::Token(format!("the token endpoint did not answer: {e}")))?;
        let status = response.status();
        let body = read_capped(response).await.map_err(Refusal::Token)?;
        let answer: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| Refusal::Token(format!("HTTP {status}, not a token response")))?;
        match (answer.id_token, answer.error) {
            (Some(id_token), None) if status.is_success() => Ok(id_token),
            (_, Some(error)) => Err(Refusal::Token(error)),
            _ => Err(Refusal::Token(format!("HTTP {status} without an ID token"))),
        }
    }
}

/// `text` as a URL that is https, or http to a loopback host.
fn secure(text: &str) -> Result<url::Url, OidcError> {
    url::Url::parse(text)
        .ok()
        .filter(auth::secure_url)
        .ok_or_else(|| OidcError::InsecureUrl(text.to_owned()))
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_RESPONSE {
            return Err(format!("larger than {MAX_RESPONSE} bytes"));
        }
    }
    Ok(body)
}
