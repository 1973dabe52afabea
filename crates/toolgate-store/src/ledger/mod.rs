//! The central audit ledger: one SHA-256 chain in PostgreSQL that every replica appends to, for a
//! fleet whose replicas' local logs would each verify and together prove nothing (seed 000: "the
//! next step is a central transactional ledger, defined retention, and external anchoring of the
//! final hash").
//!
//! Owns the `audit_ledger` table (one row per record: its position, its canonical line, its hash),
//! the `audit_head` row (the chain's count and head), and the `audit_checkpoints` table (signed
//! statements "the chain had COUNT records ending at HEAD at TIME", see [`Checkpoint`]). The line
//! is exactly the one a local `audit.jsonl` would hold, sealed by [`Chain::seal`] with the same
//! canonical hashing, so `toolgate audit export` writes a file that `toolgate audit verify` checks.
//! It does not sign checkpoints or push them anywhere (the server does, with its key); it stores
//! them, and lets a chain be pruned only down to one.
//!
//! Design decision, group commit across replicas: each process has one writer task that takes
//! every record queued while the previous batch committed and appends them in one transaction,
//! which first locks the head row; a batch is therefore in commit order behind every batch of every
//! other replica, links onto the head the last one left, and is durable (PostgreSQL's commit)
//! before any caller of the batch is answered. A batch that fails to commit wrote nothing, and
//! each of its callers is told so.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};
use toolgate_core::audit::{Chain, Event};

use crate::db::Db;
use crate::error::StoreError;

/// Most records one transaction appends.
const MAX_BATCH: usize = 512;

/// Rows one page of an export or a prune reads.
const PAGE: i64 = 10_000;

/// A record's place in the ledger once it is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Its position: the chain's record count right after it (1 for the first record).
    pub count: u64,
    /// Its `sha256`, the head right after it.
    pub sha256: String,
}

/// A signed statement about the chain: after `count` records its head was `head`, at `time`.
/// Stored in the ledger and pushed to a sink outside it, so a later rewrite of the ledger cannot
/// also rewrite what was said about it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// Records in the chain up to and including the head.
    pub count: u64,
    /// The `sha256` of record number `count`.
    pub head: String,
    /// When it was made (unix milliseconds).
    pub time: i64,
    /// Which key signed it (see the signer).
    pub key_id: String,
    /// The signature over the checkpoint's canonical statement, base64.
    pub signature: String,
}

/// What [`Ledger::prune`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pruned {
    /// The checkpoint the chain now starts after; `None` when no checkpoint was old enough and
    /// nothing was pruned.
    pub through: Option<Checkpoint>,
    /// Records moved out of the ledger (into the archive).
    pub records: u64,
}

struct Pending {
    event: Event,
    done: oneshot::Sender<Result<Appended, StoreError>>,
}

/// The ledger on a PostgreSQL store; cheap to clone.
#[derive(Clone, Debug)]
pub struct Ledger {
    pool: PgPool,
    queue: mpsc::UnboundedSender<PendingBox>,
}

/// A queued record (boxed: `Pending` holds an event of a few hundred bytes).
type PendingBox = Box<Pending>;

impl Ledger {
    /// The ledger in the approval queue's database, with this process's writer started.
    ///
    /// # Errors
    /// [`StoreError::NotShared`]: the queue is not on PostgreSQL (one process has its local
    /// journal, the central ledger is for replicas).
    pub fn beside(approvals: &crate::approval::ApprovalStore) -> Result<Self, StoreError> {
        let Db::Postgres(pg) = approvals.db() else {
            return Err(StoreError::NotShared {
                what: "central audit ledger",
            });
        };
        let pool = pg.pool().clone();
        let (queue, pending) = mpsc::unbounded_channel();
        tokio::spawn(write(pool.clone(), pending));
        Ok(Self { pool, queue })
    }

    /// Appends `event` to the chain: answered once the record is committed (durable), with its
    /// place; concurrent appends share a transaction.
    ///
    /// # Errors
    /// The database could not commit the batch: nothing of it was written.
    pub async fn append(&self, event: Event) -> Result<Appended, StoreError> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Box::new(Pending { event, done }))
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }

    /// The chain's record count and head (GENESIS and 0 for an empty chain).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn head(&self) -> Result<(u64, String), StoreError> {
        let (count, head): (i64, String) =
            sqlx::query_as("SELECT seq, sha256 FROM audit_head WHERE id = 1")
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::query("cannot read the ledger's head"))?;
        Ok((count_of(count), head))
    }

    /// Whether the ledger answers (for a readiness probe).
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn answers(&self) -> Result<(), StoreError> {
        self.head().await.map(drop)
    }

    /// Writes every record after `after` (a count: 0 for all that the ledger still holds) to `out`
    /// as JSON lines in chain order, the format of `audit.jsonl`; returns how many.
    ///
    /// # Errors
    /// The database could not answer, or `out` could not be written.
    pub async fn export(
        &self,
        after: u64,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<u64, StoreError> {
        self.copy(i64::try_from(after).unwrap_or(i64::MAX), i64::MAX, out)
            .await
    }

    /// Writes the records after count `after` and up to count `through` to `out`, a page at a
    /// time, in chain order; returns how many.
    async fn copy(
        &self,
        after: i64,
        through: i64,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<u64, StoreError> {
        let mut from = after;
        let mut written = 0;
        loop {
            let rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT seq, line FROM audit_ledger WHERE seq > $1 AND seq <= $2
                 ORDER BY seq LIMIT $3",
            )
            .bind(from)
            .bind(through)
            .bind(PAGE)
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("cannot read the ledger"))?;
            let Some((last, _)) = rows.last() else {
                return Ok(written);
            };
            from = *last;
            for (_, line) in &rows {
                out.write_all(line.as_bytes())
                    .and_then(|()| out.write_all(b"\n"))
                    .map_err(|source| StoreError::Write { source })?;
                written += 1;
            }
        }
    }

    /// Stores a checkpoint; `false` when one at that count is already there (another replica
    /// made it first), and nothing was written.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn add_checkpoint(&self, checkpoint: &Checkpoint) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO audit_checkpoints (count, head, time, key_id, signature)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (count) DO NOTHING",
        )
        .bind(i64::try_from(checkpoint.count).unwrap_or(i64::MAX))
        .bind(&checkpoint.head)
        .bind(checkpoint.time)
        .bind(&checkpoint.key_id)
        .bind(&checkpoint.signature)
        .execute(&self.pool)
        .await
        .map_err(StoreError::query("cannot store the checkpoint"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Every checkpoint, oldest first.
    ///
    /// # Errors
    /// The database could not answer.
    pub async fn checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        let rows: Vec<(i64, String, i64, String, String)> = sqlx::query_as(
            "SELECT count, head, time, key_id, signature FROM audit_checkpoints ORDER BY count",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::query("cannot read the checkpoints"))?;
        Ok(rows
            .into_iter()
            .map(|(count, head, time, key_id, signature)| Checkpoint {
                count: count_of(count),
                head,
                time,
                key_id,
                signature,
            })
            .collect())
    }

    /// Retention: moves every record up to the newest checkpoint made before `before` (unix
    /// milliseconds) out of the ledger, writing them to `archive` first (JSON lines, chain order),
    /// so that what stays verifies from that signed checkpoint onward. Nothing is deleted unless
    /// the archive was written whole and synced. A chain with no checkpoint that old is left as it
    /// is.
    ///
    /// # Errors
    /// The database could not answer, or the archive could not be written (then nothing was
    /// deleted).
    pub async fn prune(&self, before: i64, archive: std::fs::File) -> Result<Pruned, StoreError> {
        let through = self
            .checkpoints()
            .await?
            .into_iter()
            .rfind(|checkpoint| checkpoint.time < before);
        let Some(through) = through else {
            return Ok(Pruned {
                through: None,
                records: 0,
            });
        };
        let last = i64::try_from(through.count).unwrap_or(i64::MAX);
        let mut archive = std::io::BufWriter::new(archive);
        self.copy(0, last, &mut archive).await?;
        // On disk before anything leaves the ledger.
        archive
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)
            .and_then(|file| file.sync_all())
            .map_err(|source| StoreError::Write { source })?;
        let deleted = sqlx::query("DELETE FROM audit_ledger WHERE seq <= $1")
            .bind(last)
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("cannot prune the ledger"))?;
        Ok(Pruned {
            through: Some(through),
            records: deleted.rows_affected(),
        })
    }
}

fn closed() -> StoreError {
    StoreError::Query {
        context: "the ledger's writer has stopped",
        source: sqlx::Error::PoolClosed,
    }
}

fn count_of(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The writer: batches what is queued, appends each batch in one transaction behind the head row's
/// lock, answers its callers.
async fn write(pool: PgPool, mut pending: mpsc::UnboundedReceiver<PendingBox>) {
    while let Some(first) = pending.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match pending.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        match append_batch(&pool, &batch).await {
            Ok(appended) => {
                for (pending, appended) in batch.into_iter().zip(appended) {
                    let _ = pending.done.send(Ok(appended));
                }
            }
            Err(error) => {
                tracing::error!(error = %error, records = batch.len(), "ledger append failed; nothing of the batch was written");
                for pending in batch {
                    let _ = pending.done.send(Err(StoreError::Query {
                        context: "cannot append to the central audit ledger",
                        source: sqlx::Error::Protocol(error.to_string()),
                    }));
                }
            }
        }
    }
}

async fn append_batch(pool: &PgPool, batch: &[PendingBox]) -> Result<Vec<Appended>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let (count, head): (i64, String) =
        sqlx::query_as("SELECT seq, sha256 FROM audit_head WHERE id = 1 FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
    let mut chain = Chain::new(head);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let ts = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
    let at = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
    let mut seqs = Vec::with_capacity(batch.len());
    let mut lines = Vec::with_capacity(batch.len());
    let mut hashes = Vec::with_capacity(batch.len());
    for (i, pending) in (1_i64..).zip(batch) {
        let sealed = chain.seal(&pending.event, ts);
        let mut line = sealed.line;
        line.pop(); // the `\n`: a row holds the record, the export adds line ends
        seqs.push(count + i);
        lines.push(String::from_utf8(line).map_err(|e| sqlx::Error::Protocol(e.to_string()))?);
        hashes.push(sealed.sha256);
    }
    let ats = vec![at; batch.len()];
    sqlx::query(
        "INSERT INTO audit_ledger (seq, line, sha256, appended_at)
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::bigint[])",
    )
    .bind(&seqs)
    .bind(&lines)
    .bind(&hashes)
    .bind(&ats)
    .execute(&mut *tx)
    .await?;
    let last = *seqs.last().unwrap_or(&count);
    sqlx::query("UPDATE audit_head SET seq = $1, sha256 = $2 WHERE id = 1")
        .bind(last)
        .bind(chain.head())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(seqs
        .into_iter()
        .zip(hashes)
        .map(|(seq, sha256)| Appended {
            count: count_of(seq),
            sha256,
        })
        .collect())
}
