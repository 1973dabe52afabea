//! The orders toolset of seed 003: a small simulated shop behind the gate, with one tool per risk
//! tier of the article (`lookup_order`, `add_note`, `refund`, `send_email`, `delete_customer`) and
//! the pending-by-default write of its companion (`request_refund`, which never moves money).
//!
//! It owns one data directory and nothing beyond it: nothing leaves the machine. The five orders
//! are a fixture written on first open (`orders-fixture.json`); every effect (a refund issued, a
//! note added, an email "sent", a refund requested) is one JSON line appended to
//! `orders-effects.jsonl` and fsynced before the call answers, recording who asked (`by`, the
//! principal's `sub`). That log is the shop's only durable state: on open the state is rebuilt
//! from the fixture plus the log, and the outbox (`outbox/EMAIL_ID.json`, one file per email) is
//! derived from it and rewritten when missing or stale, so a crash between the two loses nothing.
//! A torn last line (a crash mid-append) was never acknowledged; it is moved aside to
//! `orders-effects.jsonl.torn` and cut off. Any other unreadable line refuses the open (fail
//! closed). An exclusive lock on the log keeps a second process out.
//!
//! Money crosses the tool boundary as a JSON number of US dollars with at most two decimals
//! (`49`, `12.5`), because the demo policy's escalation is written in dollars
//! (`args.amount > 25`, seed 003); inside, and on disk, it is integer cents, so no float
//! arithmetic ever touches a balance.
//!
//! Design decision: the state sits behind a `std::sync::Mutex` and handlers do their file I/O with
//! `std` while holding it. Calls are quick (one append and one fsync), holding the lock across
//! the append orders the log exactly like the in-memory state, and the logic stays in plain
//! methods the tests drive without a gate or a runtime. Each mutating call is checked by the
//! same code its dry run uses, so a preview says "fail: …" exactly when the call would fail.

use std::collections::BTreeMap;
use std::fs::{self, File, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use rmcp::model::{CallToolResult, Tool, ToolAnnotations};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::notes::{sync_dir, utc_timestamp};
use toolgate::corridor::answer;
use toolgate::toolset::{Call, CallError, CallFuture, Catalog, DryRunFuture, Toolset};

const FIXTURE_FILE: &str = "orders-fixture.json";

const EFFECTS_FILE: &str = "orders-effects.jsonl";

/// Where the bytes of a torn last line go before they are cut from the log.
const TORN_FILE: &str = "orders-effects.jsonl.torn";

const OUTBOX_DIR: &str = "outbox";

const CURRENCY: &str = "USD";

/// Mail to this domain is internal; the demo policy keeps it low and escalates the rest.
const INTERNAL_DOMAIN: &str = "example.com";

/// The largest amount a single refund or request may name, in cents; the schema says 1000.
const MAX_AMOUNT_CENTS: u64 = 100_000;

const ORDER_ID_PATTERN: &str = "^ord_[0-9]{4,10}$";

const CUSTOMER_ID_PATTERN: &str = "^cus_[0-9]{3,10}$";

/// One line, no control characters: a subject is a header, not a place for a second one.
const SUBJECT_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F]*$";

const MAX_NOTE_CHARS: u64 = 1_000;

const MAX_SUBJECT_CHARS: u64 = 200;

const MAX_BODY_CHARS: u64 = 5_000;

const MAX_REQUEST_NOTE_CHARS: u64 = 500;

/// The shop: its tools and its state.
#[derive(Debug)]
pub struct Orders {
    dir: PathBuf,
    catalog: Arc<Catalog>,
    shop: Mutex<Shop>,
}

/// Why an orders call did not do what it was asked; each becomes an `isError` result.
#[derive(Debug, thiserror::Error)]
enum OrdersError {
    #[error("order {order_id} not found")]
    OrderNotFound { order_id: String },
    #[error(
        "amount {amount} is not a positive amount of at most {} {CURRENCY} with at most two \
         decimals",
        money(MAX_AMOUNT_CENTS)
    )]
    InvalidAmount { amount: f64 },
    #[error(
        "{} {CURRENCY} exceeds what order {order_id} has left to refund: {} {CURRENCY} of {} \
         {CURRENCY} paid",
        money(*.requested), money(*.refundable), money(*.total)
    )]
    ExceedsRefundable {
        order_id: String,
        requested: u64,
        refundable: u64,
        total: u64,
    },
    #[error(
        "order {order_id} already has an open refund request {request_id} (pending); nothing \
         was created"
    )]
    OpenRequest {
        order_id: String,
        request_id: String,
    },
    #[error("{to:?} is not an email address this shop can send to")]
    InvalidEmail { to: String },
    #[error("the subject must be one line without control characters")]
    InvalidSubject,
    #[error("delete_customer is a demonstration tool and deleted nothing")]
    Demonstration { customer_id: String },
    #[error("the orders store is unavailable ({reason}); nothing was done")]
    Unavailable { reason: String },
    #[error(
        "outcome unknown: verify before retrying (the orders effects log failed while \
         committing: {reason})"
    )]
    InDoubt { reason: String },
}

impl OrdersError {
    fn into_result(self) -> CallToolResult {
        let detail = match &self {
            Self::OrderNotFound { order_id } => {
                json!({"status": "not_found", "order_id": order_id})
            }
            Self::InvalidAmount { amount } => json!({"status": "invalid_amount", "amount": amount}),
            Self::ExceedsRefundable {
                order_id,
                requested,
                refundable,
                ..
            } => json!({
                "status": "exceeds_refundable",
                "order_id": order_id,
                "requested": dollars(*requested),
                "refundable": dollars(*refundable),
            }),
            Self::OpenRequest {
                order_id,
                request_id,
            } => json!({"status": "conflict", "order_id": order_id, "open_request_id": request_id}),
            Self::InvalidEmail { .. } => json!({"status": "invalid_email"}),
            Self::InvalidSubject => json!({"status": "invalid_subject"}),
            Self::Demonstration { customer_id } => {
                json!({"status": "demonstration", "customer_id": customer_id, "deleted": 0})
            }
            Self::Unavailable { .. } => json!({"status": "unavailable"}),
            Self::InDoubt { .. } => json!({"status": "in_doubt"}),
        };
        // The line may or may not be on disk: "executed: false" would be a guess.
        let executed = match self {
            Self::InDoubt { .. } => answer::Executed::Unknown,
            _ => answer::Executed::No,
        };
        answer::tool_error(self.to_string(), executed, detail)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OrderStatus {
    Processing,
    Shipped,
    Delivered,
    Cancelled,
}

/// Why a refund is requested, as the seed's support form offers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reason {
    Damaged,
    NotReceived,
    WrongItem,
    Other,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoteEntry {
    id: String,
    note: String,
    by: String,
    at: String,
}

/// One order as the fixture file holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureOrder {
    order_id: String,
    customer_id: String,
    customer_email: String,
    status: OrderStatus,
    total_cents: u64,
    /// Refunded before the simulation starts.
    refunded_cents: u64,
    notes: Vec<NoteEntry>,
    /// Internal: a payment processor's reference, never projected to the model.
    payment_ref: String,
    /// Internal: never projected to the model.
    fraud_score: u8,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fixture {
    currency: String,
    orders: Vec<FixtureOrder>,
}

/// One durable effect: a line of the effects log.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    id: String,
    at: String,
    by: String,
    #[serde(flatten)]
    effect: Effect,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Effect {
    Refund {
        order_id: String,
        amount_cents: u64,
    },
    Note {
        order_id: String,
        note: String,
    },
    Email {
        to: String,
        subject: String,
        body: String,
    },
    RefundRequest {
        order_id: String,
        amount_cents: u64,
        reason: Reason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

impl Effect {
    /// The prefix of this kind's ids, and which counter numbers them.
    fn id_prefix(&self) -> &'static str {
        match self {
            Self::Refund { .. } => "rf",
            Self::Note { .. } => "nt",
            Self::Email { .. } => "em",
            Self::RefundRequest { .. } => "rr",
        }
    }
}

/// An order with every effect applied.
#[derive(Debug)]
struct Order {
    base: FixtureOrder,
    refunds: Vec<Record>,
    requests: Vec<Record>,
}

impl Order {
    fn refundable(&self) -> u64 {
        self.base
            .total_cents
            .saturating_sub(self.base.refunded_cents)
    }

    /// The pending request, if any: requests are decided by staff outside this toolset, so every
    /// request here stays pending.
    fn open_request(&self) -> Option<&Record> {
        self.requests.last()
    }

    /// What the model sees: no payment reference, no fraud score.
    fn project(&self) -> Value {
        let base = &self.base;
        let refunds: Vec<Value> = self
            .refunds
            .iter()
            .filter_map(|r| match &r.effect {
                Effect::Refund { amount_cents, .. } => Some(json!({
                    "id": r.id, "amount": dollars(*amount_cents), "by": r.by, "at": r.at,
                })),
                _ => None,
            })
            .collect();
        let requests: Vec<Value> = self
            .requests
            .iter()
            .filter_map(|r| match &r.effect {
                Effect::RefundRequest {
                    amount_cents,
                    reason,
                    ..
                } => Some(json!({
                    "id": r.id, "amount": dollars(*amount_cents), "reason": reason,
                    "status": "pending", "by": r.by, "at": r.at,
                })),
                _ => None,
            })
            .collect();
        json!({
            "order_id": base.order_id,
            "customer_id": base.customer_id,
            "customer_email": base.customer_email,
            "status": base.status,
            "currency": CURRENCY,
            "total": dollars(base.total_cents),
            "refunded": dollars(base.refunded_cents),
            "refundable": dollars(self.refundable()),
            "notes": base.notes,
            "refunds": refunds,
            "refund_requests": requests,
            "open_refund_request": self.open_request().map(|r| r.id.clone()),
        })
    }
}

/// The in-memory state and the log it is rebuilt from.
#[derive(Debug)]
struct Shop {
    orders: BTreeMap<String, Order>,
    /// Effects of each kind so far, by id prefix: the next id is one more.
    counts: BTreeMap<&'static str, u64>,
    log: File,
    /// Set when an append failed: the log may end in a partial line, so nothing more is
    /// appended until the shop is reopened and the log recovered.
    broken: Option<String>,
}

impl Shop {
    fn order(&self, order_id: &str) -> Result<&Order, OrdersError> {
        self.orders
            .get(order_id)
            .ok_or_else(|| OrdersError::OrderNotFound {
                order_id: order_id.to_owned(),
            })
    }

    /// Whether `effect` may happen now. The call, its dry run and the replay on open all ask
    /// this, so they cannot disagree.
    fn check(&self, effect: &Effect) -> Result<(), OrdersError> {
        match effect {
            Effect::Note { order_id, .. } => self.order(order_id).map(|_| ()),
            Effect::Refund {
                order_id,
                amount_cents,
            } => {
                let order = self.order(order_id)?;
                within_refundable(order, *amount_cents)
            }
            Effect::RefundRequest {
                order_id,
                amount_cents,
                ..
            } => {
                let order = self.order(order_id)?;
                if let Some(open) = order.open_request() {
                    return Err(OrdersError::OpenRequest {
                        order_id: order_id.clone(),
                        request_id: open.id.clone(),
                    });
                }
                within_refundable(order, *amount_cents)
            }
            Effect::Email { to, subject, .. } => {
                if !valid_email(to) {
                    return Err(OrdersError::InvalidEmail { to: to.clone() });
                }
                if subject.chars().any(char::is_control) {
                    return Err(OrdersError::InvalidSubject);
                }
                Ok(())
            }
        }
    }

    fn next_id(&self, effect: &Effect) -> String {
        let prefix = effect.id_prefix();
        let next = self.counts.get(prefix).copied().unwrap_or(0) + 1;
        format!("{prefix}_{next:04}")
    }

    /// Applies a checked effect to the in-memory state.
    fn apply(&mut self, record: Record) {
        *self.counts.entry(record.effect.id_prefix()).or_insert(0) += 1;
        let order_id = match &record.effect {
            Effect::Refund { order_id, .. }
            | Effect::Note { order_id, .. }
            | Effect::RefundRequest { order_id, .. } => order_id.clone(),
            Effect::Email { .. } => return,
        };
        let Some(order) = self.orders.get_mut(&order_id) else {
            return;
        };
        match &record.effect {
            Effect::Refund { amount_cents, .. } => {
                order.base.refunded_cents += amount_cents;
                order.refunds.push(record);
            }
            Effect::Note { note, .. } => order.base.notes.push(NoteEntry {
                id: record.id,
                note: note.clone(),
                by: record.by,
                at: record.at,
            }),
            Effect::RefundRequest { .. } => order.requests.push(record),
            Effect::Email { .. } => {}
        }
    }

    /// Checks `effect`, makes it durable, then applies it: the answer never gets ahead of the disk.
    fn commit(&mut self, effect: Effect, by: &str) -> Result<Record, OrdersError> {
        if let Some(reason) = &self.broken {
            return Err(OrdersError::Unavailable {
                reason: reason.clone(),
            });
        }
        self.check(&effect)?;
        let record = Record {
            id: self.next_id(&effect),
            at: utc_timestamp(SystemTime::now()),
            by: by.to_owned(),
            effect,
        };
        let mut line = serde_json::to_vec(&record).map_err(|error| OrdersError::Unavailable {
            reason: format!("could not encode the effect: {error}"),
        })?;
        line.push(b'\n');
        // fdatasync: the length changes with each append, so it is synced either way, and the
        // rest of the metadata (times) does not matter to recovery.
        if let Err(error) = self
            .log
            .write_all(&line)
            .and_then(|()| self.log.sync_data())
        {
            let reason = error.to_string();
            self.broken = Some(format!("an earlier append failed: {reason}"));
            tracing::error!(error = %error, "orders effects log append failed; store closed");
            return Err(OrdersError::InDoubt { reason });
        }
        self.apply(record.clone());
        Ok(record)
    }
}

/// Dry runs: each checks its effect with [`Shop::check`], as the call would, and says what
/// would happen, or why it would fail.
impl Shop {
    fn preview_note(&self, a: AddNoteArgs) -> Result<Value, OrdersError> {
        let chars = a.note.chars().count();
        self.check(&Effect::Note {
            order_id: a.order_id.clone(),
            note: a.note,
        })?;
        Ok(json!({
            "would": format!("add a note of {chars} characters to order {}", a.order_id),
            "reversible": false,
            "order_id": a.order_id,
            "note_chars": chars,
        }))
    }

    fn preview_refund(&self, a: RefundArgs) -> Result<Value, OrdersError> {
        let amount_cents = cents(a.amount)?;
        self.check(&Effect::Refund {
            order_id: a.order_id.clone(),
            amount_cents,
        })?;
        let order = self.order(&a.order_id)?;
        let email = &order.base.customer_email;
        Ok(json!({
            "would": format!(
                "refund {} {CURRENCY} to order {} (customer {email})",
                money(amount_cents),
                a.order_id
            ),
            "reversible": false,
            "order_id": a.order_id,
            "customer_email": email,
            "currency": CURRENCY,
            "amount": dollars(amount_cents),
            "refundable_now": dollars(order.refundable()),
            "remaining_after": dollars(order.refundable() - amount_cents),
        }))
    }

    fn preview_email(&self, a: EmailArgs) -> Result<Value, OrdersError> {
        let chars = a.body.chars().count();
        let internal = is_internal(&a.to);
        let would = format!(
            "send an email to {} with the subject {:?} ({chars} characters; simulated: written to \
             the local outbox)",
            a.to, a.subject
        );
        self.check(&Effect::Email {
            to: a.to.clone(),
            subject: a.subject.clone(),
            body: a.body,
        })?;
        Ok(json!({
            "would": would,
            "reversible": false,
            "to": a.to,
            "subject": a.subject,
            "internal": internal,
            "body_chars": chars,
        }))
    }

    fn preview_delete_customer(&self, a: CustomerArgs) -> Value {
        let known = self
            .orders
            .values()
            .any(|o| o.base.customer_id == a.customer_id);
        json!({
            "would": "nothing: delete_customer is a demonstration tool and deletes nothing",
            "reversible": true,
            "customer_id": a.customer_id,
            "known_customer": known,
        })
    }

    fn preview_request(&self, a: RequestRefundArgs) -> Result<Value, OrdersError> {
        let amount_cents = cents(a.amount)?;
        self.check(&Effect::RefundRequest {
            order_id: a.order_id.clone(),
            amount_cents,
            reason: a.reason,
            note: a.note,
        })?;
        Ok(json!({
            "would": format!(
                "open a pending refund request of {} {CURRENCY} for order {} (no money moves; \
                 staff decide)",
                money(amount_cents),
                a.order_id
            ),
            // Staff can deny a request, and nothing has been paid.
            "reversible": true,
            "order_id": a.order_id,
            "amount": dollars(amount_cents),
            "reason": a.reason,
            "money_moved": false,
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderArgs {
    order_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNoteArgs {
    order_id: String,
    note: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundArgs {
    order_id: String,
    amount: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmailArgs {
    to: String,
    subject: String,
    body: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomerArgs {
    customer_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestRefundArgs {
    order_id: String,
    amount: f64,
    reason: Reason,
    note: Option<String>,
}

impl Orders {
    /// Opens the shop in `dir` (created if missing): writes the fixture on first open, takes an
    /// exclusive lock on the effects log, recovers a torn last line, replays the log and brings
    /// the outbox up to date.
    ///
    /// # Errors
    /// The directory or a file cannot be created or read, another process holds the shop, or
    /// the fixture or a complete line of the log is not valid.
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut log = File::options()
            .read(true)
            .append(true)
            .create(true)
            .open(dir.join(EFFECTS_FILE))?;
        match log.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another process",
                        dir.join(EFFECTS_FILE).display()
                    ),
                ));
            }
            Err(TryLockError::Error(error)) => return Err(error),
        }
        // A log created just now must survive a crash along with the first effect in it.
        sync_dir(dir)?;
        let fixture = load_fixture(dir)?;
        let mut orders = BTreeMap::new();
        for base in fixture.orders {
            let id = base.order_id.clone();
            let order = Order {
                base,
                refunds: Vec::new(),
                requests: Vec::new(),
            };
            if orders.insert(id.clone(), order).is_some() {
                return Err(invalid(format!("{FIXTURE_FILE}: order {id} appears twice")));
            }
        }
        let records = read_log(dir, &mut log)?;
        let mut shop = Shop {
            orders,
            counts: BTreeMap::new(),
            log,
            broken: None,
        };
        let mut emails = Vec::new();
        for (index, record) in records.into_iter().enumerate() {
            shop.check(&record.effect)
                .map_err(|error| invalid(format!("{EFFECTS_FILE} line {}: {error}", index + 1)))?;
            if matches!(record.effect, Effect::Email { .. }) {
                emails.push(record.clone());
            }
            shop.apply(record);
        }
        let rewritten = emails
            .iter()
            .map(|record| sync_outbox(dir, record))
            .sum::<io::Result<usize>>()?;
        if rewritten > 0 {
            tracing::info!(rewritten, "orders outbox rebuilt from the effects log");
        }
        Ok(Self {
            dir: dir.to_owned(),
            catalog: Arc::new(Catalog::new(tools())),
            shop: Mutex::new(shop),
        })
    }

    /// The shop's data directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn shop(&self) -> Result<MutexGuard<'_, Shop>, OrdersError> {
        // A panic while the lock was held may have left the state and the log apart.
        self.shop.lock().map_err(|_| OrdersError::Unavailable {
            reason: "an earlier call failed while changing the state".to_owned(),
        })
    }

    /// Parses and runs one call for `by` (the principal's `sub`); `Toolset::call` wraps it.
    fn dispatch(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        by: &str,
    ) -> Result<CallToolResult, CallError> {
        let result = match name {
            "lookup_order" => {
                parse::<OrderArgs>(name, arguments).map(|a| self.lookup_order(&a.order_id))
            }
            "add_note" => parse::<AddNoteArgs>(name, arguments)
                .map(|a| self.add_note(&a.order_id, &a.note, by)),
            "refund" => {
                parse::<RefundArgs>(name, arguments).map(|a| self.refund(&a.order_id, a.amount, by))
            }
            "send_email" => parse::<EmailArgs>(name, arguments)
                .map(|a| self.send_email(&a.to, &a.subject, &a.body, by)),
            "delete_customer" => parse::<CustomerArgs>(name, arguments).map(|a| {
                Err(OrdersError::Demonstration {
                    customer_id: a.customer_id,
                })
            }),
            "request_refund" => parse::<RequestRefundArgs>(name, arguments).map(|a| {
                self.request_refund(&a.order_id, a.amount, a.reason, a.note.as_deref(), by)
            }),
            other => return Err(CallError::unknown(other)),
        };
        Ok(match result {
            Ok(Ok(value)) => answer::success(value),
            Ok(Err(error)) => error.into_result(),
            Err(invalid) => invalid,
        })
    }

    fn lookup_order(&self, order_id: &str) -> Result<Value, OrdersError> {
        Ok(self.shop()?.order(order_id)?.project())
    }

    fn add_note(&self, order_id: &str, note: &str, by: &str) -> Result<Value, OrdersError> {
        let mut shop = self.shop()?;
        let effect = Effect::Note {
            order_id: order_id.to_owned(),
            note: note.to_owned(),
        };
        let record = shop.commit(effect, by)?;
        let count = shop.order(order_id)?.base.notes.len();
        Ok(json!({
            "status": "added",
            "note_id": record.id,
            "order_id": order_id,
            "notes_on_order": count,
        }))
    }

    fn refund(&self, order_id: &str, amount: f64, by: &str) -> Result<Value, OrdersError> {
        let amount_cents = cents(amount)?;
        let mut shop = self.shop()?;
        let effect = Effect::Refund {
            order_id: order_id.to_owned(),
            amount_cents,
        };
        let record = shop.commit(effect, by)?;
        let order = shop.order(order_id)?;
        Ok(json!({
            "status": "refunded",
            "refund_id": record.id,
            "order_id": order_id,
            "customer_email": order.base.customer_email,
            "currency": CURRENCY,
            "amount": dollars(amount_cents),
            "refunded_total": dollars(order.base.refunded_cents),
            "remaining": dollars(order.refundable()),
            "simulated": true,
        }))
    }

    fn send_email(
        &self,
        to: &str,
        subject: &str,
        body: &str,
        by: &str,
    ) -> Result<Value, OrdersError> {
        let mut shop = self.shop()?;
        let effect = Effect::Email {
            to: to.to_owned(),
            subject: subject.to_owned(),
            body: body.to_owned(),
        };
        let record = shop.commit(effect, by)?;
        drop(shop);
        // The email is committed once its effect line is durable; the outbox file is derived
        // from it, and a failure here is repaired by the next open rather than reported as
        // a failed send.
        let written = match sync_outbox(&self.dir, &record) {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    id = %record.id,
                    "outbox file not written; rebuilt on next open"
                );
                false
            }
        };
        Ok(json!({
            "status": "sent",
            "email_id": record.id,
            "to": to,
            "subject": subject,
            "internal": is_internal(to),
            "simulated": true,
            "outbox": outbox_name(&record.id),
            "outbox_written": written,
        }))
    }

    fn request_refund(
        &self,
        order_id: &str,
        amount: f64,
        reason: Reason,
        note: Option<&str>,
        by: &str,
    ) -> Result<Value, OrdersError> {
        let amount_cents = cents(amount)?;
        let mut shop = self.shop()?;
        let effect = Effect::RefundRequest {
            order_id: order_id.to_owned(),
            amount_cents,
            reason,
            note: note.map(str::to_owned),
        };
        let record = shop.commit(effect, by)?;
        Ok(json!({
            "status": "pending",
            "request_id": record.id,
            "order_id": order_id,
            "amount": dollars(amount_cents),
            "currency": CURRENCY,
            "reason": reason,
            "money_moved": false,
            "message": format!(
                "Refund request {} is pending staff review. No money has moved.",
                record.id
            ),
        }))
    }

    /// What a mutating call would do, checked exactly as the call would be; `None` for
    /// `lookup_order`, which changes nothing.
    fn preview(&self, name: &str, arguments: &Map<String, Value>) -> Option<Value> {
        let args = arguments.clone();
        let shop = match self.shop() {
            Ok(shop) => shop,
            Err(error) => return Some(would_fail(&error)),
        };
        let preview = match name {
            "add_note" => parse::<AddNoteArgs>(name, args).map(|a| shop.preview_note(a)),
            "refund" => parse::<RefundArgs>(name, args).map(|a| shop.preview_refund(a)),
            "send_email" => parse::<EmailArgs>(name, args).map(|a| shop.preview_email(a)),
            "delete_customer" => {
                parse::<CustomerArgs>(name, args).map(|a| Ok(shop.preview_delete_customer(a)))
            }
            "request_refund" => {
                parse::<RequestRefundArgs>(name, args).map(|a| shop.preview_request(a))
            }
            _ => return None,
        };
        Some(match preview {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => would_fail(&error),
            Err(invalid) => {
                let reason = invalid
                    .structured_content
                    .as_ref()
                    .and_then(|v| v.get("error"))
                    .and_then(Value::as_str)
                    .unwrap_or("invalid arguments")
                    .to_owned();
                would_fail(&reason)
            }
        })
    }
}

impl Toolset for Orders {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog)
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            // Defence in depth (seed 000): the handler repeats the policy's check itself.
            call.admit()?;
            self.dispatch(call.name, call.arguments, &call.principal.sub)
        })
    }

    fn dry_run<'a>(&'a self, name: &'a str, arguments: &'a Map<String, Value>) -> DryRunFuture<'a> {
        Box::pin(std::future::ready(self.preview(name, arguments)))
    }
}

/// The six tools with their schemas and truthful annotations. Nothing leaves the machine, so
/// no tool is open-world, `send_email` included.
fn tools() -> Vec<Tool> {
    let schema = |value: Value| match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    };
    let order_id = json!({
        "type": "string",
        "pattern": ORDER_ID_PATTERN,
        "description": "The order's id, e.g. ord_1001.",
    });
    let amount = json!({
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": MAX_AMOUNT_CENTS / 100,
        "description": "US dollars as a number with at most two decimals, e.g. 12.5; at most \
                        what the order has left to refund.",
    });
    let hints = |read_only: bool, destructive: bool, idempotent: bool| {
        ToolAnnotations::new()
            .read_only(read_only)
            .destructive(destructive)
            .idempotent(idempotent)
            .open_world(false)
    };
    vec![
        Tool::new(
            "lookup_order",
            "Read one order: customer, status, total, what was refunded and what is left, notes, \
             and any pending refund request. An unknown id is an error.",
            schema(json!({
                "type": "object",
                "properties": {"order_id": order_id},
                "required": ["order_id"],
                "additionalProperties": false,
            })),
        )
        .with_title("Look up an order")
        .with_annotations(hints(true, false, true)),
        Tool::new(
            "add_note",
            "Add an internal note to an order. Notes are kept; there is no tool to remove one.",
            schema(json!({
                "type": "object",
                "properties": {
                    "order_id": order_id,
                    "note": {"type": "string", "minLength": 1, "maxLength": MAX_NOTE_CHARS},
                },
                "required": ["order_id", "note"],
                "additionalProperties": false,
            })),
        )
        .with_title("Add a note to an order")
        .with_annotations(hints(false, false, false)),
        Tool::new(
            "refund",
            "Refund money to the customer of an order, right away (simulated: recorded locally). \
             It cannot be undone. The amount may not exceed what the order has left to refund.",
            schema(json!({
                "type": "object",
                "properties": {"order_id": order_id, "amount": amount},
                "required": ["order_id", "amount"],
                "additionalProperties": false,
            })),
        )
        .with_title("Refund an order")
        .with_annotations(hints(false, true, false)),
        Tool::new(
            "send_email",
            "Send an email (simulated: written to the local outbox; nothing leaves this machine).",
            schema(json!({
                "type": "object",
                "properties": {
                    "to": {"type": "string", "format": "email", "maxLength": 254},
                    "subject": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_SUBJECT_CHARS,
                        "pattern": SUBJECT_PATTERN,
                    },
                    "body": {"type": "string", "minLength": 1, "maxLength": MAX_BODY_CHARS},
                },
                "required": ["to", "subject", "body"],
                "additionalProperties": false,
            })),
        )
        .with_title("Send an email")
        .with_annotations(hints(false, false, false)),
        Tool::new(
            "delete_customer",
            "Delete a customer and their data. Registered for demonstration: the policy blocks it, \
             and it deletes nothing even if allowed.",
            schema(json!({
                "type": "object",
                "properties": {
                    "customer_id": {
                        "type": "string",
                        "pattern": CUSTOMER_ID_PATTERN,
                        "description": "The customer's id, e.g. cus_201.",
                    },
                },
                "required": ["customer_id"],
                "additionalProperties": false,
            })),
        )
        .with_title("Delete a customer")
        // The hints describe the action it stands for, so a client confirms it as one.
        .with_annotations(hints(false, true, true)),
        Tool::new(
            "request_refund",
            "Ask staff to refund an order: creates a PENDING request and moves no money. One open \
             request per order; a second is refused and names the open one.",
            schema(json!({
                "type": "object",
                "properties": {
                    "order_id": order_id,
                    "amount": amount,
                    "reason": {
                        "type": "string",
                        "enum": ["damaged", "not_received", "wrong_item", "other"],
                    },
                    "note": {"type": "string", "maxLength": MAX_REQUEST_NOTE_CHARS},
                },
                "required": ["order_id", "amount", "reason"],
                "additionalProperties": false,
            })),
        )
        .with_title("Request a refund (pending staff review)")
        .with_annotations(hints(false, false, true)),
    ]
}

/// The five orders every new shop starts with. Customers are outside the internal domain, so
/// mail to them is what the policy escalates.
fn demo_fixture() -> Fixture {
    let order = |order_id: &str,
                 customer: (&str, &str),
                 status,
                 total_cents,
                 refunded_cents,
                 note: Option<&str>,
                 fraud_score| FixtureOrder {
        order_id: order_id.to_owned(),
        customer_id: customer.0.to_owned(),
        customer_email: customer.1.to_owned(),
        status,
        total_cents,
        refunded_cents,
        notes: note
            .map(|note| NoteEntry {
                id: format!("nt_{order_id}_fixture"),
                note: note.to_owned(),
                by: "staff:fixture".to_owned(),
                at: "2026-10-01T09:00:00Z".to_owned(),
            })
            .into_iter()
            .collect(),
        payment_ref: format!("pi_3Q{}", order_id.trim_start_matches("ord_")),
        fraud_score,
    };
    let sam = ("cus_201", "sam@example.net");
    Fixture {
        currency: CURRENCY.to_owned(),
        orders: vec![
            order("ord_1001", sam, OrderStatus::Delivered, 4_900, 0, None, 12),
            order(
                "ord_1002",
                ("cus_202", "lee@example.org"),
                OrderStatus::Shipped,
                1_250,
                0,
                None,
                4,
            ),
            order(
                "ord_1003",
                sam,
                OrderStatus::Delivered,
                12_000,
                2_000,
                Some("Refunded 20.00 for a dented box."),
                31,
            ),
            order(
                "ord_1004",
                ("cus_203", "kim@example.net"),
                OrderStatus::Cancelled,
                2_599,
                2_599,
                Some("Cancelled before shipping; refunded in full."),
                7,
            ),
            order(
                "ord_1005",
                ("cus_204", "ana@example.org"),
                OrderStatus::Processing,
                8_000,
                0,
                None,
                55,
            ),
        ],
    }
}

/// Reads the fixture, writing the demo one first if there is none. Written to a temporary file
/// and renamed, so a crash never leaves half a fixture for the next open to refuse.
fn load_fixture(dir: &Path) -> io::Result<Fixture> {
    let path = dir.join(FIXTURE_FILE);
    if !path.exists() {
        let tmp = dir.join(format!("{FIXTURE_FILE}.tmp"));
        let mut bytes = serde_json::to_vec_pretty(&demo_fixture()).map_err(io::Error::other)?;
        bytes.push(b'\n');
        let mut file = File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)?;
    }
    let fixture: Fixture = serde_json::from_slice(&fs::read(&path)?)
        .map_err(|error| invalid(format!("{FIXTURE_FILE}: {error}")))?;
    if fixture.currency != CURRENCY {
        return Err(invalid(format!(
            "{FIXTURE_FILE}: currency {:?} is not {CURRENCY}",
            fixture.currency
        )));
    }
    if let Some(order) = fixture
        .orders
        .iter()
        .find(|o| o.refunded_cents > o.total_cents)
    {
        return Err(invalid(format!(
            "{FIXTURE_FILE}: order {} has more refunded than paid",
            order.order_id
        )));
    }
    Ok(fixture)
}

/// Every complete line of the log. A torn last line is kept aside in [`TORN_FILE`] and cut off,
/// so the next append starts on a line of its own.
fn read_log(dir: &Path, log: &mut File) -> io::Result<Vec<Record>> {
    let mut bytes = Vec::new();
    log.read_to_end(&mut bytes)?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < bytes.len() {
        let torn = &bytes[complete..];
        let mut aside = File::options()
            .create(true)
            .append(true)
            .open(dir.join(TORN_FILE))?;
        aside.write_all(torn)?;
        aside.write_all(b"\n")?;
        aside.sync_all()?;
        log.set_len(complete as u64)?;
        log.sync_all()?;
        tracing::warn!(
            bytes = torn.len(),
            aside = TORN_FILE,
            "orders effects log ended in a torn line (never acknowledged); moved aside"
        );
    }
    if complete == 0 {
        return Ok(Vec::new());
    }
    bytes[..complete - 1]
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(index, line)| {
            serde_json::from_slice(line)
                .map_err(|error| invalid(format!("{EFFECTS_FILE} line {}: {error}", index + 1)))
        })
        .collect()
}

/// The outbox file's name, relative to the data directory.
fn outbox_name(id: &str) -> String {
    format!("{OUTBOX_DIR}/{id}.json")
}

/// Makes `outbox/ID.json` say what the email record says; returns 1 when it had to be written.
fn sync_outbox(dir: &Path, record: &Record) -> io::Result<usize> {
    let Effect::Email { to, subject, body } = &record.effect else {
        return Ok(0);
    };
    let message = json!({
        "id": record.id,
        "at": record.at,
        "by": record.by,
        "to": to,
        "subject": subject,
        "body": body,
        "simulated": "nothing left this machine",
    });
    let mut bytes = serde_json::to_vec_pretty(&message).map_err(io::Error::other)?;
    bytes.push(b'\n');
    let path = dir.join(outbox_name(&record.id));
    if fs::read(&path).is_ok_and(|current| current == bytes) {
        return Ok(0);
    }
    fs::create_dir_all(dir.join(OUTBOX_DIR))?;
    // Renamed into place so a reader never sees half a message; not fsynced, because the log
    // already holds the email and the next open rewrites a file that did not survive.
    let tmp = dir.join(OUTBOX_DIR).join(format!(".{}.tmp", record.id));
    fs::write(&tmp, &bytes)?;
    fs::rename(&tmp, &path)?;
    Ok(1)
}

fn within_refundable(order: &Order, amount_cents: u64) -> Result<(), OrdersError> {
    if amount_cents > order.refundable() {
        return Err(OrdersError::ExceedsRefundable {
            order_id: order.base.order_id.clone(),
            requested: amount_cents,
            refundable: order.refundable(),
            total: order.base.total_cents,
        });
    }
    Ok(())
}

/// Dollars to cents, refusing what the schema refuses (zero, negative, too large) and what it
/// cannot express reliably (a fraction of a cent).
fn cents(amount: f64) -> Result<u64, OrdersError> {
    let scaled = amount * 100.0;
    let rounded = scaled.round();
    // Floats like 0.07 are 7.000000000000001 cents; anything further off is a real fraction.
    let whole_cents = (scaled - rounded).abs() < 1e-6;
    // MAX_AMOUNT_CENTS is far below 2^53, so both conversions below are exact.
    let in_range = rounded >= 1.0 && rounded <= MAX_AMOUNT_CENTS as f64;
    if amount.is_finite() && whole_cents && in_range {
        Ok(rounded as u64)
    } else {
        Err(OrdersError::InvalidAmount { amount })
    }
}

/// `1234` cents as `"12.34"`.
fn money(cents: u64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// Cents as the JSON number of dollars the tools speak.
fn dollars(cents: u64) -> Value {
    // Amounts here are far below 2^53 cents, so the conversion is exact.
    json!(cents as f64 / 100.0)
}

/// A plain `local@domain` address: the schema's `format: email` checked again, more strictly,
/// before anything is written to the outbox.
fn valid_email(to: &str) -> bool {
    let Some((local, domain)) = to.split_once('@') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local.len() <= 64
        && !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..")
        && local
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c));
    let domain_ok = domain.len() <= 253
        && domain.split('.').count() >= 2
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    local_ok && domain_ok
}

/// Whether mail to `to` is internal, by the demo policy's own test (`endsWith('@example.com')`,
/// case and all), so a dry run never calls internal what the policy escalates.
fn is_internal(to: &str) -> bool {
    to.strip_suffix(INTERNAL_DOMAIN)
        .is_some_and(|local| local.ends_with('@'))
}

fn parse<T: DeserializeOwned>(
    tool: &str,
    arguments: Map<String, Value>,
) -> Result<T, CallToolResult> {
    T::deserialize(Value::Object(arguments)).map_err(|error| {
        answer::refusal(
            format!("invalid arguments for {tool}: {error}"),
            json!({"status": "invalid_args"}),
        )
    })
}

/// A dry run of a call that would not run.
fn would_fail(error: &dyn std::fmt::Display) -> Value {
    json!({"would": format!("fail: {error}"), "reversible": false})
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use toolgate_core::schema::ToolSchema;

    use super::*;

    const SAM: &str = "local:sam";

    fn shop() -> (tempfile::TempDir, Orders) {
        let tmp = tempfile::tempdir().expect("temp dir");
        let orders = Orders::open(&tmp.path().join("shop")).expect("open");
        (tmp, orders)
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("arguments must be an object, got {other}"),
        }
    }

    fn call(orders: &Orders, tool: &str, arguments: Value) -> CallToolResult {
        orders
            .dispatch(tool, args(arguments), SAM)
            .expect("registered tool")
    }

    fn ok(orders: &Orders, tool: &str, arguments: Value) -> Value {
        let result = call(orders, tool, arguments);
        assert_ne!(result.is_error, Some(true), "{tool} failed: {result:?}");
        result.structured_content.expect("structured content")
    }

    fn err(orders: &Orders, tool: &str, arguments: Value) -> (String, Value) {
        let result = call(orders, tool, arguments);
        assert_eq!(result.is_error, Some(true), "{tool} succeeded: {result:?}");
        let text = result
            .content
            .iter()
            .filter_map(|b| b.as_text().map(|t| t.text.clone()))
            .collect();
        (text, result.structured_content.expect("structured content"))
    }

    fn effects(dir: &Path) -> Vec<Value> {
        let text = fs::read_to_string(dir.join(EFFECTS_FILE)).expect("effects log");
        text.lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    fn schema(orders: &Orders, tool: &str) -> ToolSchema {
        let catalog = orders.catalog();
        let tool = catalog.get(tool).expect("tool registered");
        ToolSchema::compile(&Value::Object((*tool.input_schema).clone())).expect("schema compiles")
    }

    #[test]
    fn every_schema_compiles_and_is_closed() {
        let (_tmp, orders) = shop();
        let catalog = orders.catalog();
        let names: Vec<&str> = catalog.tools().iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "lookup_order",
                "add_note",
                "refund",
                "send_email",
                "delete_customer",
                "request_refund"
            ]
        );
        for tool in orders.catalog().tools() {
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&json!(false)),
                "{}",
                tool.name
            );
            schema(&orders, &tool.name);
            let hints = tool.annotations.clone().expect("hints");
            assert_eq!(hints.open_world_hint, Some(false), "{}", tool.name);
        }
    }

    #[test]
    fn schemas_refuse_a_string_amount_and_other_bad_values() {
        let (_tmp, orders) = shop();
        for tool in ["refund", "request_refund"] {
            let schema = schema(&orders, tool);
            let with = |amount: Value| {
                let mut call = json!({"order_id": "ord_1001", "amount": amount});
                if tool == "request_refund" {
                    call["reason"] = json!("damaged");
                }
                call
            };
            assert!(schema.validate(&with(json!(49))).is_ok(), "{tool}: 49");
            assert!(schema.validate(&with(json!(12.5))).is_ok(), "{tool}: 12.5");
            for bad in [
                json!("49"),
                json!(0),
                json!(-5),
                json!(1000.01),
                json!(null),
            ] {
                assert!(
                    schema.validate(&with(bad.clone())).is_err(),
                    "{tool} admitted amount {bad}"
                );
            }
            let mut extra = with(json!(10));
            extra["currency"] = json!("EUR");
            assert!(schema.validate(&extra).is_err(), "{tool}: extra field");
            let mut bad_id = with(json!(10));
            bad_id["order_id"] = json!("../ord_1001");
            assert!(schema.validate(&bad_id).is_err(), "{tool}: bad id");
        }
        let request = schema(&orders, "request_refund");
        let call = json!({"order_id": "ord_1001", "amount": 5, "reason": "changed my mind"});
        assert!(request.validate(&call).is_err());

        let email = schema(&orders, "send_email");
        let good = json!({"to": "dana@example.com", "subject": "Hi", "body": "Hello"});
        assert!(email.validate(&good).is_ok());
        for bad in [
            json!({"to": "not-an-email", "subject": "Hi", "body": "Hello"}),
            json!({"to": "dana@example.com", "subject": "Hi\r\nBcc: x@evil.example", "body": "x"}),
            json!({"to": "dana@example.com", "subject": "", "body": "Hello"}),
            json!({"to": "dana@example.com", "subject": "Hi"}),
        ] {
            assert!(email.validate(&bad).is_err(), "send_email admitted {bad}");
        }
    }

    #[test]
    fn lookup_projects_and_reports_a_missing_order_as_not_found() {
        let (_tmp, orders) = shop();
        let order = ok(&orders, "lookup_order", json!({"order_id": "ord_1003"}));
        assert_eq!(order["customer_email"], "sam@example.net");
        assert_eq!(order["total"], 120.0);
        assert_eq!(order["refunded"], 20.0);
        assert_eq!(order["refundable"], 100.0);
        assert_eq!(order["status"], "delivered");
        let text = order.to_string();
        assert!(!text.contains("payment_ref") && !text.contains("pi_3Q"));
        assert!(!text.contains("fraud_score"));

        let (text, detail) = err(&orders, "lookup_order", json!({"order_id": "ord_9999"}));
        assert_eq!(text, "order ord_9999 not found");
        assert_eq!(detail["status"], "not_found");
    }

    #[test]
    fn refunds_stay_within_the_refundable_remainder() {
        let (tmp, orders) = shop();
        let dir = tmp.path().join("shop");
        let (text, detail) = err(
            &orders,
            "refund",
            json!({"order_id": "ord_1002", "amount": 12.51}),
        );
        assert_eq!(detail["status"], "exceeds_refundable");
        assert!(text.contains("12.51 USD exceeds what order ord_1002 has left to refund: 12.50"));
        assert!(effects(&dir).is_empty());

        let first = ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1002", "amount": 10}),
        );
        assert_eq!(first["refund_id"], "rf_0001");
        assert_eq!(first["remaining"], 2.5);
        let rest = ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1002", "amount": 2.5}),
        );
        assert_eq!(rest["remaining"], 0.0);
        let (_, detail) = err(
            &orders,
            "refund",
            json!({"order_id": "ord_1002", "amount": 0.01}),
        );
        assert_eq!(detail["refundable"], 0.0);

        // Refunded in full by the fixture.
        err(
            &orders,
            "refund",
            json!({"order_id": "ord_1004", "amount": 1}),
        );
        // A fraction of a cent, zero, and an unknown order are refused before anything is written.
        let (_, detail) = err(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 10.005}),
        );
        assert_eq!(detail["status"], "invalid_amount");
        err(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 0}),
        );
        err(
            &orders,
            "refund",
            json!({"order_id": "ord_7777", "amount": 1}),
        );
        let (text, detail) = err(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": "49"}),
        );
        assert_eq!(detail["status"], "invalid_args");
        assert!(text.starts_with("invalid arguments for refund"));

        let log = effects(&dir);
        assert_eq!(log.len(), 2);
        assert_eq!(log[0]["kind"], "refund");
        assert_eq!(log[0]["amount_cents"], 1000);
        assert_eq!(log[0]["by"], SAM);
        // 0.07 is 7.000000000000001 cents as a float; it is still exactly 7 cents.
        let odd = ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 0.07}),
        );
        assert_eq!(odd["amount"], 0.07);
        assert_eq!(effects(&dir)[2]["amount_cents"], 7);
    }

    #[test]
    fn effects_survive_reopen() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("shop");
        {
            let orders = Orders::open(&dir).expect("open");
            ok(
                &orders,
                "refund",
                json!({"order_id": "ord_1001", "amount": 9}),
            );
            ok(
                &orders,
                "add_note",
                json!({"order_id": "ord_1001", "note": "called the customer"}),
            );
            ok(
                &orders,
                "send_email",
                json!({"to": "sam@example.net", "subject": "Your refund", "body": "Sent 9.00."}),
            );
            ok(
                &orders,
                "request_refund",
                json!({"order_id": "ord_1005", "amount": 80, "reason": "not_received"}),
            );
        }
        assert_eq!(effects(&dir).len(), 4);
        assert!(dir.join("outbox/em_0001.json").exists());

        // A lost outbox file is rebuilt from the log.
        fs::remove_file(dir.join("outbox/em_0001.json")).expect("remove outbox file");
        let orders = Orders::open(&dir).expect("reopen");
        let outbox: Value =
            serde_json::from_slice(&fs::read(dir.join("outbox/em_0001.json")).expect("rebuilt"))
                .expect("json");
        assert_eq!(outbox["to"], "sam@example.net");
        assert_eq!(outbox["by"], SAM);

        let order = ok(&orders, "lookup_order", json!({"order_id": "ord_1001"}));
        assert_eq!(order["refunded"], 9.0);
        assert_eq!(order["refundable"], 40.0);
        assert_eq!(order["notes"][0]["note"], "called the customer");
        assert_eq!(order["notes"][0]["by"], SAM);
        // Ids continue after a reopen instead of starting over.
        let next = ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 1}),
        );
        assert_eq!(next["refund_id"], "rf_0002");
        let (_, detail) = err(
            &orders,
            "request_refund",
            json!({"order_id": "ord_1005", "amount": 1, "reason": "other"}),
        );
        assert_eq!(detail["open_request_id"], "rr_0001");
        assert_eq!(effects(&dir).len(), 5);
    }

    #[test]
    fn a_second_process_cannot_open_the_same_shop() {
        let (tmp, _orders) = shop();
        let error = Orders::open(&tmp.path().join("shop")).expect_err("locked");
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_torn_last_line_is_moved_aside_and_a_corrupt_one_refuses_the_open() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("shop");
        {
            let orders = Orders::open(&dir).expect("open");
            ok(
                &orders,
                "refund",
                json!({"order_id": "ord_1001", "amount": 5}),
            );
        }
        let torn = br#"{"id":"rf_0002","at":"2026-10-19T11:12:36Z","by":"local:sam","kind":"ref"#;
        File::options()
            .append(true)
            .open(dir.join(EFFECTS_FILE))
            .and_then(|mut f| f.write_all(torn))
            .expect("tear the log");

        let orders = Orders::open(&dir).expect("recovers");
        assert_eq!(effects(&dir).len(), 1);
        let aside = fs::read(dir.join(TORN_FILE)).expect("torn bytes kept");
        assert!(aside.starts_with(torn));
        let next = ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 1}),
        );
        assert_eq!(next["refund_id"], "rf_0002");
        assert_eq!(effects(&dir).len(), 2);
        drop(orders);

        File::options()
            .append(true)
            .open(dir.join(EFFECTS_FILE))
            .and_then(|mut f| f.write_all(b"not json\n"))
            .expect("corrupt the log");
        let error = Orders::open(&dir).expect_err("fails closed");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("line 3"), "{error}");
    }

    #[test]
    fn a_log_that_overdraws_an_order_refuses_the_open() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("shop");
        drop(Orders::open(&dir).expect("open"));
        let line = json!({
            "id": "rf_0001", "at": "2026-10-19T11:12:36Z", "by": "local:mallory",
            "kind": "refund", "order_id": "ord_1002", "amount_cents": 999_999,
        });
        fs::write(dir.join(EFFECTS_FILE), format!("{line}\n")).expect("write log");
        let error = Orders::open(&dir).expect_err("fails closed");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn request_refund_keeps_one_open_request_per_order_and_moves_no_money() {
        let (tmp, orders) = shop();
        let dir = tmp.path().join("shop");
        let first = ok(
            &orders,
            "request_refund",
            json!({
                "order_id": "ord_1001", "amount": 49, "reason": "damaged", "note": "box crushed",
            }),
        );
        assert_eq!(first["request_id"], "rr_0001");
        assert_eq!(first["status"], "pending");
        assert_eq!(first["money_moved"], false);

        let (text, detail) = err(
            &orders,
            "request_refund",
            json!({"order_id": "ord_1001", "amount": 10, "reason": "other"}),
        );
        assert!(text.contains("rr_0001"), "{text}");
        assert_eq!(detail["status"], "conflict");
        assert_eq!(detail["open_request_id"], "rr_0001");

        // Another order has its own slot; an amount past the remainder is still refused.
        ok(
            &orders,
            "request_refund",
            json!({"order_id": "ord_1003", "amount": 100, "reason": "wrong_item"}),
        );
        err(
            &orders,
            "request_refund",
            json!({"order_id": "ord_1002", "amount": 13, "reason": "wrong_item"}),
        );

        let order = ok(&orders, "lookup_order", json!({"order_id": "ord_1001"}));
        assert_eq!(order["refunded"], 0.0);
        assert_eq!(order["open_refund_request"], "rr_0001");
        let log = effects(&dir);
        assert_eq!(log.len(), 2);
        assert!(log.iter().all(|e| e["kind"] == "refund_request"));
    }

    #[test]
    fn dry_runs_touch_nothing_and_say_what_would_happen() {
        let (tmp, orders) = shop();
        let dir = tmp.path().join("shop");
        ok(
            &orders,
            "refund",
            json!({"order_id": "ord_1001", "amount": 9}),
        );
        let before = fs::read(dir.join(EFFECTS_FILE)).expect("log");

        let refund = orders
            .preview(
                "refund",
                &args(json!({"order_id": "ord_1001", "amount": 30})),
            )
            .expect("refund has a dry run");
        assert_eq!(
            refund["would"],
            "refund 30.00 USD to order ord_1001 (customer sam@example.net)"
        );
        assert_eq!(refund["reversible"], false);
        assert_eq!(refund["amount"], 30.0);
        assert_eq!(refund["remaining_after"], 10.0);

        let too_much = orders
            .preview(
                "refund",
                &args(json!({"order_id": "ord_1001", "amount": 41})),
            )
            .expect("preview");
        assert!(
            too_much["would"]
                .as_str()
                .is_some_and(|w| w.starts_with("fail: 41.00 USD exceeds"))
        );

        let email = orders
            .preview(
                "send_email",
                &args(json!({"to": "lee@example.org", "subject": "Delay", "body": "Sorry."})),
            )
            .expect("preview");
        let would = email["would"].as_str().expect("would");
        assert!(
            would.contains("lee@example.org") && would.contains("\"Delay\""),
            "{would}"
        );
        assert_eq!(email["internal"], false);

        let request = orders
            .preview(
                "request_refund",
                &args(json!({"order_id": "ord_1002", "amount": 5, "reason": "damaged"})),
            )
            .expect("preview");
        assert_eq!(request["money_moved"], false);
        let note = orders
            .preview(
                "add_note",
                &args(json!({"order_id": "ord_1009", "note": "x"})),
            )
            .expect("preview");
        assert_eq!(note["would"], "fail: order ord_1009 not found");
        let delete = orders
            .preview("delete_customer", &args(json!({"customer_id": "cus_201"})))
            .expect("preview");
        assert_eq!(delete["known_customer"], true);
        assert!(
            orders
                .preview("lookup_order", &args(json!({"order_id": "ord_1001"})))
                .is_none()
        );

        assert_eq!(fs::read(dir.join(EFFECTS_FILE)).expect("log"), before);
        assert!(!dir.join(OUTBOX_DIR).exists());
        let order = ok(&orders, "lookup_order", json!({"order_id": "ord_1001"}));
        assert_eq!(order["refunded"], 9.0);
        assert!(
            order["refund_requests"]
                .as_array()
                .is_some_and(Vec::is_empty)
        );
    }

    #[test]
    fn delete_customer_deletes_nothing() {
        let (tmp, orders) = shop();
        let dir = tmp.path().join("shop");
        let fixture = fs::read(dir.join(FIXTURE_FILE)).expect("fixture");
        let (text, detail) = err(
            &orders,
            "delete_customer",
            json!({"customer_id": "cus_201"}),
        );
        assert_eq!(
            text,
            "delete_customer is a demonstration tool and deleted nothing"
        );
        assert_eq!(detail["deleted"], 0);
        assert_eq!(fs::read(dir.join(FIXTURE_FILE)).expect("fixture"), fixture);
        assert!(effects(&dir).is_empty());
        ok(&orders, "lookup_order", json!({"order_id": "ord_1001"}));
    }

    #[test]
    fn emails_go_to_the_local_outbox_only() {
        let (tmp, orders) = shop();
        let dir = tmp.path().join("shop");
        let sent = ok(
            &orders,
            "send_email",
            json!({"to": "dana@example.com", "subject": "Refund done", "body": "ord_1001"}),
        );
        assert_eq!(sent["email_id"], "em_0001");
        assert_eq!(sent["internal"], true);
        assert_eq!(sent["outbox_written"], true);
        let message: Value =
            serde_json::from_slice(&fs::read(dir.join("outbox/em_0001.json")).expect("outbox"))
                .expect("json");
        assert_eq!(message["subject"], "Refund done");

        // Defence in depth behind the schema's `format: email` and subject pattern.
        for (to, subject) in [
            ("dana@localhost", "Hi"),
            ("a@b@example.com", "Hi"),
            ("dana@example.com", "Hi\nBcc: x@evil.example"),
        ] {
            err(
                &orders,
                "send_email",
                json!({"to": to, "subject": subject, "body": "x"}),
            );
        }
        assert_eq!(effects(&dir).len(), 1);
    }

    #[test]
    fn add_note_records_who_added_it() {
        let (tmp, orders) = shop();
        let note = ok(
            &orders,
            "add_note",
            json!({"order_id": "ord_1003", "note": "customer prefers email"}),
        );
        assert_eq!(note["note_id"], "nt_0001");
        assert_eq!(note["notes_on_order"], 2);
        err(
            &orders,
            "add_note",
            json!({"order_id": "ord_1999", "note": "x"}),
        );
        let log = effects(&tmp.path().join("shop"));
        assert_eq!(log.len(), 1);
        assert_eq!(log[0]["by"], SAM);
        assert_eq!(log[0]["kind"], "note");
    }

    #[test]
    fn amounts_convert_to_whole_cents() {
        assert_eq!(cents(49.0).ok(), Some(4_900));
        assert_eq!(cents(12.5).ok(), Some(1_250));
        assert_eq!(cents(0.01).ok(), Some(1));
        assert_eq!(cents(1000.0).ok(), Some(100_000));
        for bad in [0.0, -1.0, 0.001, 1000.01, f64::NAN, f64::INFINITY] {
            assert!(cents(bad).is_err(), "{bad}");
        }
        assert_eq!(money(2_599), "25.99");
        assert_eq!(money(5), "0.05");
    }
}
