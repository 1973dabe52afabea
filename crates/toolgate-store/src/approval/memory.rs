//! The approval queue's rules over rows held in memory: each method is the statement (or the
//! transaction) of [`super::ApprovalStore`] it stands for, run under the one lock of the tables,
//! and a decision is judged by the same [`super::may_vote`] and [`super::settle`].

use std::collections::BTreeMap;

use super::{Approval, DecideError, Decider, NewApproval, Status, Verdict, Vote};

/// Every row in insertion order (the SQL tables' `seq`), and every vote.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    rows: Vec<Row>,
    /// By (approval id, decider): one vote per decider.
    votes: BTreeMap<(String, String), Vote>,
}

#[derive(Debug)]
struct Row {
    approval: Approval,
    /// The resolution is in the audit log.
    audited: bool,
}

impl Queue {
    fn row_mut(&mut self, id: &str) -> Option<&mut Approval> {
        self.rows
            .iter_mut()
            .map(|row| &mut row.approval)
            .find(|row| row.id == id)
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Approval> {
        self.rows
            .iter()
            .map(|row| &row.approval)
            .find(|row| row.id == id)
    }

    pub(crate) fn request(&mut self, id: String, new: NewApproval, now: i64) -> (Approval, bool) {
        self.expire(now);
        if let Some(pending) = self
            .rows
            .iter()
            .map(|row| &row.approval)
            .find(|row| row.fingerprint == new.fingerprint && row.status == Status::Pending)
        {
            return (pending.clone(), false);
        }
        let approval = Approval {
            id,
            fingerprint: new.fingerprint,
            requester: new.requester,
            tool: new.tool,
            args_redacted: new.args_redacted,
            tier: new.tier,
            reason: new.reason,
            dry_run: new.dry_run,
            policy_sha256: new.policy_sha256,
            status: Status::Pending,
            created_at: now,
            expires_at: new.expires_at,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            used_at: None,
            result: None,
            approvers: new.approvers,
            approvals_required: new.approvals_required.max(1),
        };
        self.rows.push(Row {
            approval: approval.clone(),
            audited: false,
        });
        (approval, true)
    }

    /// Up to `limit` rows that `keep`, newest first.
    pub(crate) fn newest_first(
        &self,
        keep: impl Fn(&Approval) -> bool,
        limit: usize,
    ) -> Vec<Approval> {
        self.rows
            .iter()
            .rev()
            .map(|row| &row.approval)
            .filter(|row| keep(row))
            .take(limit)
            .cloned()
            .collect()
    }

    pub(crate) fn decide(
        &mut self,
        id: &str,
        decider: &Decider,
        verdict: Verdict,
        reason: Option<&str>,
        now: i64,
    ) -> Result<Approval, DecideError> {
        let Some(current) = self.get(id).cloned() else {
            return Err(DecideError::NotFound { id: id.to_owned() });
        };
        super::may_vote(&current, decider, now)?;
        let vote_key = (id.to_owned(), decider.id.clone());
        if self.votes.contains_key(&vote_key) {
            return Err(DecideError::AlreadyVoted {
                id: current.id,
                decider: decider.id.clone(),
            });
        }
        self.votes.insert(
            vote_key,
            Vote {
                decider: decider.id.clone(),
                approve: verdict == Verdict::Approve,
                reason: reason.map(str::to_owned),
                at: now,
            },
        );
        let approvers: Vec<String> = self
            .votes(id)
            .into_iter()
            .filter(|vote| vote.approve)
            .map(|vote| vote.decider)
            .collect();
        let settled = super::settle(&current, decider, verdict, &approvers);
        let row = self
            .row_mut(id)
            .ok_or_else(|| DecideError::NotFound { id: id.to_owned() })?;
        if let Some((status, by)) = settled {
            row.status = status;
            row.decided_by = Some(by);
            row.decided_at = Some(now);
            row.decision_reason = reason.map(str::to_owned);
        }
        Ok(row.clone())
    }

    /// The votes on `id` in the order they were cast (then by decider, as the SQL orders them).
    pub(crate) fn votes(&self, id: &str) -> Vec<Vote> {
        let mut votes: Vec<Vote> = self
            .votes
            .iter()
            .filter(|((approval, _), _)| approval == id)
            .map(|(_, vote)| vote.clone())
            .collect();
        votes.sort_by(|a, b| (a.at, &a.decider).cmp(&(b.at, &b.decider)));
        votes
    }

    pub(crate) fn stats(&self, since: i64) -> Vec<(String, i64, i64, i64, i64)> {
        let mut by_tool: BTreeMap<&str, [i64; 4]> = BTreeMap::new();
        for row in self.rows.iter().map(|row| &row.approval) {
            if row.created_at < since {
                continue;
            }
            let counts = by_tool.entry(&row.tool).or_default();
            let slot = match row.status {
                Status::Approved => 0,
                Status::Denied => 1,
                Status::Expired => 2,
                Status::Pending => 3,
            };
            counts[slot] += 1;
        }
        by_tool
            .into_iter()
            .map(|(tool, [a, d, e, p])| (tool.to_owned(), a, d, e, p))
            .collect()
    }

    pub(crate) fn expire(&mut self, now: i64) -> u64 {
        let mut expired = 0;
        for row in &mut self.rows {
            let row = &mut row.approval;
            if row.status == Status::Pending && row.expires_at <= now {
                row.status = Status::Expired;
                expired += 1;
            }
        }
        expired
    }

    pub(crate) fn counts(&self, now: i64) -> Vec<(String, bool, i64)> {
        let mut counts: BTreeMap<(&'static str, bool), i64> = BTreeMap::new();
        for row in self.rows.iter().map(|row| &row.approval) {
            let due = row.status == Status::Pending && row.expires_at <= now;
            *counts.entry((row.status.as_str(), due)).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((status, due), n)| (status.to_owned(), due, n))
            .collect()
    }

    pub(crate) fn consume(&mut self, id: &str, now: i64) -> bool {
        match self.row_mut(id) {
            Some(row) if row.status == Status::Approved && row.used_at.is_none() => {
                row.used_at = Some(now);
                true
            }
            _ => false,
        }
    }

    pub(crate) fn store_result(&mut self, id: &str, result: &serde_json::Value) -> bool {
        match self.row_mut(id) {
            Some(row)
                if row.used_at.is_some() && row.result.as_ref().is_none_or(|r| r == result) =>
            {
                row.result = Some(result.clone());
                true
            }
            _ => false,
        }
    }

    pub(crate) fn unaudited(&self) -> Vec<Approval> {
        self.rows
            .iter()
            .filter(|row| row.approval.status != Status::Pending && !row.audited)
            .map(|row| row.approval.clone())
            .collect()
    }

    pub(crate) fn mark_audited(&mut self, id: &str) {
        if let Some(row) = self
            .rows
            .iter_mut()
            .find(|row| row.approval.id == id && row.approval.status != Status::Pending)
        {
            row.audited = true;
        }
    }
}
