//! Who is signed in to the approvals console: one-time login links and the sessions they open
//! (issue 14), in `toolgate.db` beside the approvals they decide.
//!
//! Owns the `console_logins` and `console_sessions` tables and two rules: a login link opens at
//! most one session, ever, whichever process or replica redeems it; and a session that expired or
//! was ended identifies nobody. It does not make the secrets (the console draws them from the
//! operating system), check who may decide what (the approval queue does, with the identity and
//! groups a session carries), or speak HTTP.
//!
//! Design decision: only SHA-256 digests of the link tokens and session ids are stored, so the
//! database, a backup of it, or a process that can read it learns nobody's session. "Once" is
//! the `used_at IS NULL` condition of the one `UPDATE … RETURNING` that redeems a link: two
//! browsers racing on one link get one session between them, as with the approvals' own rules.

#[cfg(test)]
mod tests;

use crate::db::{Db, WritePool, on_db};
use crate::error::StoreError;

/// How a session was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A one-time login link printed by `toolgate console` (one person on their machine).
    Link,
    /// OpenID Connect against the team's identity provider.
    Oidc,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Self::Link => "link",
            Self::Oidc => "oidc",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "link" => Some(Self::Link),
            "oidc" => Some(Self::Oidc),
            _ => None,
        }
    }
}

/// A signed-in person, as a session row holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The identity decisions are recorded under (`human:dana` from a link, `user:SUB` from a
    /// login).
    pub identity: String,
    /// Groups the login vouched for, matched against the policy's `group:NAME` approvers.
    pub groups: Vec<String>,
    /// How the session was opened.
    pub via: Via,
    /// When it stops identifying anyone (unix milliseconds).
    pub expires_at: i64,
}

/// What an OpenID Connect callback needs of the sign-in it finishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OidcLogin {
    /// The nonce the ID token must carry.
    pub nonce: String,
    /// The PKCE code verifier the token request sends.
    pub code_verifier: String,
    /// Where to send the person once signed in.
    pub next: String,
}

/// The console's logins in the shared database (SQLite or PostgreSQL); cheap to clone.
#[derive(Clone, Debug)]
pub struct ConsoleStore {
    db: Db,
}

/// What a console store on the in-memory backend answers: a login link is redeemed by another
/// process than the one that minted it.
fn in_memory() -> StoreError {
    StoreError::NotInMemory {
        what: "console's logins",
    }
}

impl ConsoleStore {
    /// The console's logins over the approval queue's connections.
    #[must_use]
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Self {
        Self {
            db: approvals.db().clone(),
        }
    }

    /// Records a login link for `identity`, usable once until `expires_at`, and forgets links
    /// and sessions that can no longer be used.
    ///
    /// # Errors
    /// The database could not answer (then no link exists).
    pub async fn mint_login(
        &self,
        token_sha256: &str,
        identity: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let mut tx = pool
                    .begin_write()
                    .await
                    .map_err(StoreError::query("cannot start a login link"))?;
                sqlx::query(
                    "DELETE FROM console_logins WHERE expires_at <= $1 OR used_at IS NOT NULL",
                )
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query("cannot forget used login links"))?;
                sqlx::query(
                    "DELETE FROM console_sessions WHERE expires_at <= $1 OR ended_at IS NOT NULL",
                )
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query("cannot forget ended sessions"))?;
                sqlx::query(
                    "INSERT INTO console_logins (token_sha256, identity, created_at, expires_at)
             VALUES ($1, $2, $3, $4)",
                )
                .bind(token_sha256)
                .bind(identity)
                .bind(now)
                .bind(expires_at)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query("cannot record the login link"))?;
                tx.commit()
                    .await
                    .map_err(StoreError::query("cannot commit the login link"))
            },
            |_tables| Err(in_memory()),
        )
    }

    /// Uses the login link whose token has this digest: the identity it was minted for, exactly
    /// once; `None` for an unknown, used or expired link.
    ///
    /// # Errors
    /// The database could not answer (then the link was not used).
    pub async fn redeem_login(
        &self,
        token_sha256: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let row: Option<(String,)> = sqlx::query_as(
                    "UPDATE console_logins SET used_at = $2
             WHERE token_sha256 = $1 AND used_at IS NULL AND expires_at > $2
             RETURNING identity",
                )
                .bind(token_sha256)
                .bind(now)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot redeem the login link"))?;
                Ok(row.map(|(identity,)| identity))
            },
            |_tables| Err(in_memory()),
        )
    }

    /// Records an OpenID Connect sign-in under way, keyed by its state's digest, until
    /// `expires_at`; forgets the ones past their time.
    ///
    /// # Errors
    /// The database could not answer (then the sign-in cannot finish).
    pub async fn begin_oidc(
        &self,
        state_sha256: &str,
        login: &OidcLogin,
        expires_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query("DELETE FROM console_oidc_logins WHERE expires_at <= $1")
                    .bind(now)
                    .execute(pool)
                    .await
                    .map_err(StoreError::query("cannot forget stale sign-ins"))?;
                sqlx::query(
            "INSERT INTO console_oidc_logins (state_sha256, nonce, code_verifier, next, expires_at)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(state_sha256)
        .bind(&login.nonce)
        .bind(&login.code_verifier)
        .bind(&login.next)
        .bind(expires_at)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot record the sign-in"))?;
                Ok(())
            },
            |_tables| Err(in_memory()),
        )
    }

    /// Takes the sign-in whose state has this digest, exactly once: `None` for an unknown,
    /// replayed or expired state.
    ///
    /// # Errors
    /// The database could not answer (then the sign-in was not used).
    pub async fn finish_oidc(
        &self,
        state_sha256: &str,
        now: i64,
    ) -> Result<Option<OidcLogin>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let row: Option<(String, String, String, i64)> = sqlx::query_as(
                    "DELETE FROM console_oidc_logins WHERE state_sha256 = $1
             RETURNING nonce, code_verifier, next, expires_at",
                )
                .bind(state_sha256)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot finish the sign-in"))?;
                Ok(row.filter(|(_, _, _, expires_at)| *expires_at > now).map(
                    |(nonce, code_verifier, next, _)| OidcLogin {
                        nonce,
                        code_verifier,
                        next,
                    },
                ))
            },
            |_tables| Err(in_memory()),
        )
    }

    /// Opens a session whose id has this digest.
    ///
    /// # Errors
    /// The database could not answer (then no session exists).
    pub async fn open_session(
        &self,
        id_sha256: &str,
        session: &Session,
        now: i64,
    ) -> Result<(), StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query(
            "INSERT INTO console_sessions (id_sha256, identity, groups, via, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id_sha256)
        .bind(&session.identity)
        .bind(serde_json::Value::from(session.groups.clone()).to_string())
        .bind(session.via.as_str())
        .bind(now)
        .bind(session.expires_at)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot open the session"))?;
                Ok(())
            },
            |_tables| Err(in_memory()),
        )
    }

    /// The live session whose id has this digest; `None` if unknown, expired or ended.
    ///
    /// # Errors
    /// The database could not answer (the caller must then treat the request as signed out).
    pub async fn session(&self, id_sha256: &str, now: i64) -> Result<Option<Session>, StoreError> {
        on_db!(
            &self.db,
            |pool| {
                let row: Option<(String, String, String, i64)> = sqlx::query_as(
                    "SELECT identity, groups, via, expires_at FROM console_sessions
             WHERE id_sha256 = $1 AND ended_at IS NULL AND expires_at > $2",
                )
                .bind(id_sha256)
                .bind(now)
                .fetch_optional(pool)
                .await
                .map_err(StoreError::query("cannot read the session"))?;
                let Some((identity, groups, via, expires_at)) = row else {
                    return Ok(None);
                };
                let corrupt = |column: &'static str, reason: String| StoreError::Corrupt {
                    id: format!("session of {identity}"),
                    column,
                    reason,
                };
                let groups: Vec<String> =
                    serde_json::from_str(&groups).map_err(|e| corrupt("groups", e.to_string()))?;
                let via =
                    Via::parse(&via).ok_or_else(|| corrupt("via", format!("unknown {via:?}")))?;
                Ok(Some(Session {
                    identity,
                    groups,
                    via,
                    expires_at,
                }))
            },
            |_tables| Err(in_memory()),
        )
    }

    /// Ends the session whose id has this digest (signing out); ending it twice is a no-op.
    ///
    /// # Errors
    /// The database could not answer (then the session may still be live).
    pub async fn end_session(&self, id_sha256: &str, now: i64) -> Result<(), StoreError> {
        on_db!(
            &self.db,
            |pool| {
                sqlx::query(
            "UPDATE console_sessions SET ended_at = $2 WHERE id_sha256 = $1 AND ended_at IS NULL",
        )
        .bind(id_sha256)
        .bind(now)
        .execute(pool)
        .await
        .map_err(StoreError::query("cannot end the session"))?;
                Ok(())
            },
            |_tables| Err(in_memory()),
        )
    }
}
