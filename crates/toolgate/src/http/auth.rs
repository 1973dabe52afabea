//! Bearer token verification: the OAuth 2.1 resource server's half of the bargain (MCP
//! authorization, RFC 9068-style JWT access tokens, RFC 8707 audience binding).
//!
//! A token is accepted only when it is a JWS signed with one of the algorithms the operator pinned
//! (RS256 / ES256 / EdDSA family; `none` and every HMAC algorithm are refused at configuration, so
//! a public key can never be used as an HMAC secret), by a key from the configured JWKS (a local file
//! or a URL, never a location or key named by the token: `jku`, `x5u` and embedded `jwk` headers are
//! ignored, `kid` only picks among the configured keys), issued by the configured issuer, for this
//! server's canonical resource URI, inside `exp`/`nbf` with a small leeway and not issued (`iat`)
//! beyond it in the future, with a `sub`, not typed as some other kind of JWT (an ID token is not
//! an access token), at most [`MAX_TOKEN_BYTES`] long, and with a JOSE header and claims that are
//! each one JSON object with a single reading (`strict.rs`), in every member and not only in
//! those read here: a token that the issuer, jsonwebtoken and a log pipeline could read three
//! ways is no credential.
//!
//! Why a cache of verified tokens: a signature check costs about 200 µs of CPU (ES256 or RS256 with
//! the RustCrypto backend), and an agent sends the same token with every call. A verified token's principal is kept (keyed by the token's
//! SHA-256) until it expires or for at most a minute, so a key removed from the JWKS stops working
//! within that minute.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use toolgate_core::principal::Principal;

/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: u64 = 30;
/// Longer tokens are refused unread: far above what an issuer mints (a few hundred bytes to a
/// couple of KiB), far below the header cap.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Least time between two JWKS fetches caused by unknown `kid`s (an attacker can mint those).
const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(30);
/// A fetched JWKS is fetched again after this, so rotated keys arrive without an unknown `kid`.
const JWKS_MAX_AGE: Duration = Duration::from_secs(600);
/// Upper bound on a JWKS document.
const JWKS_MAX_BYTES: usize = 256 * 1024;
/// How long a verified token is trusted without checking its signature again.
const CACHE_MAX_AGE: Duration = Duration::from_secs(60);
/// Verified tokens remembered at most (the cache is cleared when full).
const CACHE_MAX_ENTRIES: usize = 10_000;

/// Where the verification keys come from.
#[derive(Clone, Debug)]
pub enum KeySource {
    /// A JWKS document on disk, read at start.
    File(PathBuf),
    /// A JWKS URL (https, or http on a loopback address), fetched at start and refreshed.
    Url(url::Url),
}

/// What a token must satisfy.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// This server's canonical resource URI: every token's `aud` must name it.
    pub resource: String,
    /// Signature algorithms accepted (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    /// Where the keys that verify signatures come from.
    pub keys: KeySource,
    /// Authorization servers named in the protected resource metadata (default: the issuer).
    pub authorization_servers: Vec<String>,
}

/// Why a configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// An algorithm name that is unknown, or an HMAC algorithm (`HS256`, `HS384`, `HS512`),
    /// which would verify with a shared secret; holds the name.
    #[error(
        "algorithm {0} is not accepted: only RS*, PS*, ES256, ES384 and EdDSA verify with a public key"
    )]
    Algorithm(String),
    /// [`AuthConfig::algorithms`] is empty.
    #[error("no signature algorithm configured")]
    NoAlgorithm,
    /// The JWKS could not be read, fetched (an error, a non-2xx status, more than 256 KiB) or
    /// parsed, or it holds no public key; holds the reason.
    #[error("cannot read the JWKS: {0}")]
    Jwks(String),
    /// The JWKS URL is neither `https` nor `http` to a loopback host; holds the URL.
    #[error("the JWKS URL must be https (or http on a loopback address): {0}")]
    InsecureJwksUrl(String),
}

/// Why a token was refused: for the server's log only. Clients all get the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Longer than [`MAX_TOKEN_BYTES`]; refused unread.
    TooLong,
    /// Not a compact JWS whose header and claims are each one JSON object with a single
    /// reading, or unreadable in some other way.
    Malformed,
    /// Its `alg` is not one of [`AuthConfig::algorithms`].
    Algorithm,
    /// No configured key fits its `alg` and, when it names one, its `kid` (a JWKS URL is
    /// fetched again first, at most every 30 s).
    UnknownKey,
    /// No candidate key verifies its signature.
    Signature,
    /// `exp` is past, beyond [`LEEWAY_SECS`].
    Expired,
    /// `nbf` is still ahead, beyond [`LEEWAY_SECS`].
    NotYetValid,
    /// `iat` is ahead, beyond [`LEEWAY_SECS`].
    IssuedInFuture,
    /// `iss` is not [`AuthConfig::issuer`].
    Issuer,
    /// `aud` does not name [`AuthConfig::resource`].
    Audience,
    /// A required claim (`exp`, `iss`, `aud`, `sub`) is missing, `sub` is empty, or a claim
    /// has the wrong JSON type.
    Claims,
    /// Its `typ` header names some other kind of JWT (only `at+jwt`, `application/at+jwt` and
    /// `JWT` are access tokens; none at all is accepted too).
    Type,
}

impl Rejection {
    /// A short phrase for the server's log, e.g. `wrong audience`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooLong => "longer than 8 KiB",
            Self::Malformed => "malformed",
            Self::Algorithm => "algorithm not accepted",
            Self::UnknownKey => "no configured key fits",
            Self::Signature => "bad signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not yet valid",
            Self::IssuedInFuture => "issued in the future",
            Self::Issuer => "wrong issuer",
            Self::Audience => "wrong audience",
            Self::Claims => "missing or malformed claims",
            Self::Type => "not an access token (typ)",
        }
    }
}

/// Parses an algorithm name from the command line; HMAC and `none` are refused.
///
/// # Errors
/// The name is not an asymmetric JWS algorithm.
pub fn algorithm(name: &str) -> Result<Algorithm, ConfigError> {
    let parsed: Algorithm = name
        .parse()
        .map_err(|_| ConfigError::Algorithm(name.to_owned()))?;
    if symmetric(parsed) {
        return Err(ConfigError::Algorithm(name.to_owned()));
    }
    Ok(parsed)
}

/// HMAC: the key would be a shared secret, and a public key must never serve as one.
fn symmetric(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// A configured key, with its verifying form made once when the set is loaded.
#[derive(Debug)]
struct Key {
    jwk: Jwk,
    decoding: DecodingKey,
}

#[derive(Debug)]
struct Keys {
    set: Vec<Key>,
    fetched: Instant,
    /// When an unknown `kid` last caused a fetch.
    last_forced: Option<Instant>,
}

/// Verifies bearer tokens; shared by every request.
#[derive(Debug)]
pub struct Verifier {
    config: AuthConfig,
    keys: tokio::sync::RwLock<Keys>,
    http: Option<reqwest::Client>,
    /// Held while the JWKS URL is fetched, so concurrent refreshes become one.
    fetching: tokio::sync::Mutex<()>,
    cache: Mutex<HashMap<[u8; 32], (Principal, Instant)>>,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    exp: u64,
    /// Not checked by jsonwebtoken: a token minted "later" comes from a clock that is wrong, or
    /// from someone who mints tokens to be used later.
    iat: Option<u64>,
    /// RFC 8693 / RFC 9068: space-separated scopes.
    scope: Option<String>,
    /// Some issuers send scopes as an array.
    scp: Option<Vec<String>>,
    client_id: Option<String>,
    azp: Option<String>,
}

impl Verifier {
    /// Loads the keys (a file is read now; a URL is fetched now and must answer).
    ///
    /// # Errors
    /// A refused algorithm, an unreadable or invalid JWKS, or an insecure JWKS URL.
    pub async fn new(config: AuthConfig) -> Result<Self, ConfigError> {
        if config.algorithms.is_empty() {
            return Err(ConfigError::NoAlgorithm);
        }
        if let Some(hmac) = config.algorithms.iter().find(|a| symmetric(**a)) {
            return Err(ConfigError::Algorithm(format!("{hmac:?}")));
        }
        let http = match &config.keys {
            KeySource::File(_) => None,
            KeySource::Url(url) => {
                if !secure_url(url) {
                    return Err(ConfigError::InsecureJwksUrl(url.to_string()));
                }
                let client =
                    client(Duration::from_secs(5)).map_err(|e| ConfigError::Jwks(e.to_string()))?;
                Some(client)
            }
        };
        let set = load(&config.keys, http.as_ref()).await?;
        Ok(Self {
            config,
            keys: tokio::sync::RwLock::new(Keys {
                set,
                fetched: Instant::now(),
                last_forced: None,
            }),
            http,
            fetching: tokio::sync::Mutex::new(()),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration it verifies against.
    #[must_use]
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// The principal a bearer token stands for.
    ///
    /// # Errors
    /// The token is not acceptable; the reason is for the log.
    pub async fn verify(&self, token: &str) -> Result<Principal, Rejection> {
        if token.len() > MAX_TOKEN_BYTES {
            // Before hashing it for the cache.
            return Err(Rejection::TooLong);
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(principal) = self.cached(&digest) {
            return Ok(principal);
        }
        self.verify_uncached(token, digest).await
    }

    /// The principal of a token verified within the last minute, without checking it again.
    #[must_use]
    pub fn recently_verified(&self, token: &str) -> Option<Principal> {
        self.cached(&Sha256::digest(token.as_bytes()).into())
    }

    async fn verify_uncached(&self, token: &str, digest: [u8; 32]) -> Result<Principal, Rejection> {
        let claims: Claims = self.decode(token).await?;
        let now = jsonwebtoken::get_current_timestamp();
        let (principal, exp) = principal(claims, now)?;
        self.remember(digest, principal.clone(), exp);
        Ok(principal)
    }

    /// The claims of a token that passes every check but the meaning of its claims: size, one
    /// reading, a pinned algorithm, a JWT type, a configured key's signature, `exp`/`nbf` with
    /// the leeway, the issuer, and an `aud` naming [`AuthConfig::resource`] (for an ID token,
    /// the client id). What the claims mean is the caller's: an access token's principal here,
    /// an ID token's nonce and groups in the approvals console.
    ///
    /// # Errors
    /// The token is not acceptable; the reason is for the log.
    pub async fn decode<T: serde::de::DeserializeOwned>(
        &self,
        token: &str,
    ) -> Result<T, Rejection> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Rejection::TooLong);
        }
        if !strict_json_segments(token) {
            return Err(Rejection::Malformed);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Rejection::Malformed)?;
        if !self.config.algorithms.contains(&header.alg) {
            return Err(Rejection::Algorithm);
        }
        if !access_token_type(header.typ.as_deref()) {
            return Err(Rejection::Type);
        }
        let kid = header.kid.as_deref();
        let mut candidates = self.candidates(header.alg, kid).await;
        if candidates.is_empty() && kid.is_some() && self.refresh(true).await {
            candidates = self.candidates(header.alg, kid).await;
        }
        if candidates.is_empty() {
            return Err(Rejection::UnknownKey);
        }
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.set_issuer(&[self.config.issuer.as_str()]);
        validation.set_audience(&[self.config.resource.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let mut last = Rejection::Signature;
        for key in candidates {
            match jsonwebtoken::decode::<T>(token, &key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(error) => {
                    last = rejection(error.kind());
                    if last != Rejection::Signature {
                        // The signature was good: the claims decide, whichever key comes next.
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Principal> {
        let cache = crate::lock(&self.cache);
        cache
            .get(digest)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(principal, _)| principal.clone())
    }

    fn remember(&self, digest: [u8; 32], principal: Principal, exp: u64) {
        let now = u64::try_from(toolgate_core::time::now_ms() / 1000).unwrap_or(0);
        let left = Duration::from_secs(exp.saturating_sub(now));
        let until = Instant::now() + left.min(CACHE_MAX_AGE);
        let mut cache = crate::lock(&self.cache);
        if cache.len() >= CACHE_MAX_ENTRIES {
            cache.clear();
        }
        cache.insert(digest, (principal, until));
    }

    /// Keys that may have signed a token with `alg` and `kid`: the one with that `kid`, or every
    /// key of the right type when the token names none. A stale URL set is fetched again first.
    async fn candidates(&self, alg: Algorithm, kid: Option<&str>) -> Vec<DecodingKey> {
        let stale = self.http.is_some() && self.keys.read().await.fetched.elapsed() > JWKS_MAX_AGE;
        if stale {
            self.refresh(false).await;
        }
        let keys = self.keys.read().await;
        keys.set
            .iter()
            .filter(|key| match kid {
                Some(kid) => key.jwk.common.key_id.as_deref() == Some(kid),
                None => true,
            })
            .filter(|key| fits(&key.jwk, alg))
            .map(|key| key.decoding.clone())
            .collect()
    }

    /// Fetches the JWKS URL again; `forced` (an unknown `kid`) at most once per interval. False
    /// when nothing new could be loaded.
    ///
    /// One fetch at a time, and the keys stay readable while it runs: tokens with a known `kid`
    /// are not held up by a slow issuer.
    async fn refresh(&self, forced: bool) -> bool {
        let Some(http) = &self.http else {
            return false;
        };
        let _one_fetch = self.fetching.lock().await;
        {
            let mut keys = self.keys.write().await;
            if forced {
                if keys
                    .last_forced
                    .is_some_and(|at| at.elapsed() < REFRESH_MIN_INTERVAL)
                {
                    return false;
                }
                keys.last_forced = Some(Instant::now());
            } else if keys.fetched.elapsed() <= JWKS_MAX_AGE {
                return true; // another request refreshed it meanwhile
            }
        }
        let loaded = load(&self.config.keys, Some(http)).await;
        let mut keys = self.keys.write().await;
        keys.fetched = Instant::now();
        match loaded {
            Ok(set) => {
                keys.set = set;
                true
            }
            Err(error) => {
                // Keep the keys we have; try again after the interval.
                tracing::warn!(error = %error, "JWKS refresh failed; keeping the keys already loaded");
                false
            }
        }
    }
}

/// RFC 9068 §4 wants `at+jwt`; many issuers still send `JWT` or nothing, which is accepted. Any
/// other type (an ID token, a DPoP proof, a logout token) is some other credential, never ours.
fn access_token_type(typ: Option<&str>) -> bool {
    match typ {
        None => true,
        Some(typ) => ["at+jwt", "application/at+jwt", "jwt"]
            .iter()
            .any(|t| typ.eq_ignore_ascii_case(t)),
    }
}

/// Whether `jwk` can verify `alg`: its type and curve fit, and its own `alg`, when it has one,
/// is the same.
fn fits(jwk: &Jwk, alg: Algorithm) -> bool {
    if let Some(own) = jwk.common.key_algorithm
        && format!("{own:?}") != format!("{alg:?}")
    {
        return false;
    }
    match (&jwk.algorithm, alg) {
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512,
        ) => true,
        (AlgorithmParameters::EllipticCurve(ec), Algorithm::ES256) => {
            ec.curve == EllipticCurve::P256
        }
        (AlgorithmParameters::EllipticCurve(ec), Algorithm::ES384) => {
            ec.curve == EllipticCurve::P384
        }
        (AlgorithmParameters::OctetKeyPair(okp), Algorithm::EdDSA) => {
            okp.curve == EllipticCurve::Ed25519
        }
        _ => false,
    }
}

/// The JOSE header and the claims of a compact JWS are each one JSON object with a single reading.
fn strict_json_segments(token: &str) -> bool {
    use base64::Engine as _;
    let mut segments = token.split('.');
    let (Some(header), Some(claims), Some(_signature), None) = (
        segments.next(),
        segments.next(),
        segments.next(),
        segments.next(),
    ) else {
        return false;
    };
    [header, claims].into_iter().all(|segment| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(segment)
            .ok()
            .and_then(|json| toolgate_core::json::parse(&json).ok())
            .is_some_and(|value| value.is_object())
    })
}

/// The principal of verified claims, and when it expires; `now` in seconds since the epoch.
fn principal(claims: Claims, now: u64) -> Result<(Principal, u64), Rejection> {
    if claims
        .iat
        .is_some_and(|iat| iat > now.saturating_add(LEEWAY_SECS))
    {
        return Err(Rejection::IssuedInFuture);
    }
    let sub = claims
        .sub
        .filter(|s| !s.is_empty())
        .ok_or(Rejection::Claims)?;
    let mut scopes: Vec<String> = claims
        .scope
        .as_deref()
        .unwrap_or_default()
        .split_ascii_whitespace()
        .map(str::to_owned)
        .collect();
    scopes.extend(claims.scp.unwrap_or_default());
    scopes.sort();
    scopes.dedup();
    let client = claims.client_id.or(claims.azp);
    Ok((Principal::from_token(sub, scopes, client), claims.exp))
}

fn rejection(kind: &jsonwebtoken::errors::ErrorKind) -> Rejection {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::InvalidSignature => Rejection::Signature,
        ErrorKind::ExpiredSignature => Rejection::Expired,
        ErrorKind::ImmatureSignature => Rejection::NotYetValid,
        ErrorKind::InvalidIssuer => Rejection::Issuer,
        ErrorKind::InvalidAudience => Rejection::Audience,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => Rejection::Algorithm,
        ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidSubject | ErrorKind::Json(_) => {
            Rejection::Claims
        }
        ErrorKind::InvalidKeyFormat | ErrorKind::InvalidRsaKey(_) | ErrorKind::InvalidEcdsaKey => {
            Rejection::UnknownKey
        }
        _ => Rejection::Malformed,
    }
}

/// The client for the issuer's documents (a JWKS, OpenID discovery, the token endpoint): no
/// proxy from the environment, no redirect followed (a document is where it was configured to
/// be), 3 s to connect and `timeout` in all.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    crate::install_tls_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(3))
        .timeout(timeout)
        .build()
}

/// https, or http to a loopback address (a local test issuer).
pub(crate) fn secure_url(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            None => false,
        },
        _ => false,
    }
}

async fn load(source: &KeySource, http: Option<&reqwest::Client>) -> Result<Vec<Key>, ConfigError> {
    let bytes = match (source, http) {
        (KeySource::File(path), _) => std::fs::read(path)
            .map_err(|e| ConfigError::Jwks(format!("{}: {e}", path.display())))?,
        (KeySource::Url(url), Some(http)) => fetch(http, url).await?,
        (KeySource::Url(_), None) => return Err(ConfigError::Jwks("no HTTP client".to_owned())),
    };
    let set: JwkSet =
        serde_json::from_slice(&bytes).map_err(|e| ConfigError::Jwks(e.to_string()))?;
    // Symmetric keys never verify here: an `oct` key in the set is dropped, not trusted.
    let keys = set
        .keys
        .into_iter()
        .filter(|k| !matches!(k.algorithm, AlgorithmParameters::OctetKey(_)))
        .collect::<Vec<_>>();
    if keys.is_empty() {
        return Err(ConfigError::Jwks("no public keys in the set".to_owned()));
    }
    // A key whose parameters do not make a verifying key can never verify: left out.
    Ok(keys
        .into_iter()
        .filter_map(|jwk| {
            let decoding = DecodingKey::from_jwk(&jwk).ok()?;
            Some(Key { jwk, decoding })
        })
        .collect())
}

async fn fetch(http: &reqwest::Client, url: &url::Url) -> Result<Vec<u8>, ConfigError> {
    let failed = |e: reqwest::Error| ConfigError::Jwks(format!("{url}: {e}"));
    let mut response = http.get(url.clone()).send().await.map_err(failed)?;
    if !response.status().is_success() {
        return Err(ConfigError::Jwks(format!(
            "{url}: HTTP {}",
            response.status()
        )));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        body.extend_from_slice(&chunk);
        if body.len() > JWKS_MAX_BYTES {
            return Err(ConfigError::Jwks(format!(
                "{url}: larger than {JWKS_MAX_BYTES} bytes"
            )));
        }
    }
    Ok(body)
}
