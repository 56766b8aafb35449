//! Admission: how many requests of each class the service works on at once, so that its memory
//! depends on its settings and not on how many requests arrive together.
//!
//! Every create, seed and fs operation in flight holds memory: a create builds the sandbox's
//! skeleton archive (the helper binary is most of it), a seed its decompressor and pipes, an fs
//! operation its answer (a read page, grep matches). Each class has a fixed number of slots
//! ([`crate::config::AdmissionConfig`]). A request takes its slot before its body is read; when
//! none is free it waits in a short queue, first come first served (at most `queue_length`
//! waiting, for at most `queue_wait`), and past either bound it is [`Refused`]: a 429 with
//! `Retry-After`, which DAIV's client retries as transient. The slot is held until the response
//! has been sent, or dropped because the client went away.
//!
//! An fs operation takes two slots: one of its session's first, then one of the total, so one
//! agent's burst of parallel reads waits behind its own session's slots instead of taking every
//! slot of the service. The per-session table holds only sessions with an fs operation in flight
//! or waiting.
//!
//! Runs are not admitted here: a run holds its memory for what its commands print (bounded per
//! command by `OUTPUT_MAX_BYTES`), not for how long they take, and one session runs one batch at
//! a time already (its lock); slots would queue agents behind other agents' long test suites.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::AdmissionConfig;
use crate::telemetry::metrics::{ClassLabels, Gauge, Metrics, RefusedLabels};

/// What a refused request is told to wait before retrying. A slot frees as soon as one request
/// of its class ends, and the retry waits in the queue again: the queue, not this hint, paces
/// retries.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A kind of work with slots of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Create,
    Seed,
    /// fs operations over all sessions.
    Fs,
    /// fs operations on one session.
    FsSession,
}

impl Class {
    /// Its metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Class::Create => "create",
            Class::Seed => "seed",
            Class::Fs => "fs",
            Class::FsSession => "fs_session",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Class::Create => "session creates",
            Class::Seed => "seeds",
            Class::Fs => "fs operations",
            Class::FsSession => "fs operations on this session",
        }
    }

    /// The setting that sizes it (without the prefix).
    pub fn setting(self) -> &'static str {
        match self {
            Class::Create => "MAX_CONCURRENT_CREATES",
            Class::Seed => "MAX_CONCURRENT_SEEDS",
            Class::Fs => "MAX_CONCURRENT_FS_OPS",
            Class::FsSession => "MAX_CONCURRENT_FS_OPS_PER_SESSION",
        }
    }
}

/// Why a request waited no longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `queue_length` requests were waiting already.
    QueueFull,
    /// No slot freed within `queue_wait`.
    Timeout,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::QueueFull => "queue_full",
            Reason::Timeout => "timeout",
        }
    }
}

/// A request that got no slot: every slot of `class` stayed taken.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "too many {} in progress (at most {limit} at once); retry in {} s",
    class.what(),
    retry_after.as_secs()
)]
pub struct Refused {
    pub class: Class,
    pub limit: usize,
    pub reason: Reason,
    pub retry_after: Duration,
}

/// A request's slots: released when dropped (the response sent, or the request abandoned).
#[must_use = "the slot is released when dropped"]
#[derive(Debug)]
pub struct Slot {
    // Dropped in this order: the permits, then the session's entry in the table.
    _held: Vec<Held>,
    _ticket: Option<Ticket>,
}

#[derive(Debug)]
struct Held {
    _permit: OwnedSemaphorePermit,
    in_flight: Gauge,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

/// The slots of every class, and the queue in front of them.
pub struct Admission {
    creates: Gate,
    seeds: Gate,
    fs: Gate,
    fs_sessions: Arc<PerSession>,
    queue_wait: Duration,
    queue_length: usize,
    metrics: Arc<Metrics>,
}

impl Admission {
    pub fn new(config: &AdmissionConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            creates: Gate::new(Class::Create, config.creates),
            seeds: Gate::new(Class::Seed, config.seeds),
            fs: Gate::new(Class::Fs, config.fs_ops),
            fs_sessions: Arc::new(PerSession {
                limit: config.fs_ops_per_session,
                gates: Mutex::default(),
            }),
            queue_wait: config.queue_wait,
            queue_length: config.queue_length,
            metrics,
        }
    }

    /// A slot for a session create.
    pub async fn create(&self) -> Result<Slot, Refused> {
        self.one(&self.creates).await
    }

    /// Up to `want` more create slots, those free now (never waiting: a request already
    /// holding one that waited for more could wait on another such request). A fork of
    /// `count` holds its own slot and these, and builds that many at a time.
    pub fn more_creates(&self, want: usize) -> (Slot, usize) {
        let mut held = Vec::new();
        while held.len() < want {
            let Ok(permit) = self.creates.slots.clone().try_acquire_owned() else {
                break;
            };
            let in_flight = self
                .metrics
                .admission
                .in_flight
                .get_or_create_owned(&ClassLabels {
                    class: self.creates.class.label(),
                });
            in_flight.inc();
            held.push(Held {
                _permit: permit,
                in_flight,
            });
        }
        let n = held.len();
        (
            Slot {
                _held: held,
                _ticket: None,
            },
            n,
        )
    }

    /// A slot for a seed.
    pub async fn seed(&self) -> Result<Slot, Refused> {
        self.one(&self.seeds).await
    }

    /// Slots for an fs operation on `session_id`: one of the session's, then one of the total,
    /// both within one queue wait.
    pub async fn fs(&self, session_id: &str) -> Result<Slot, Refused> {
        let deadline = Instant::now() + self.queue_wait;
        let ticket = self.fs_sessions.ticket(session_id);
        let own = self.enter(&ticket.gate, deadline).await?;
        let total = self.enter(&self.fs, deadline).await?;
        Ok(Slot {
            _held: vec![own, total],
            _ticket: Some(ticket),
        })
    }

    /// Sessions in the per-session table (those with an fs operation in flight or waiting).
    pub fn tracked_sessions(&self) -> usize {
        self.fs_sessions.lock().len()
    }

    async fn one(&self, gate: &Gate) -> Result<Slot, Refused> {
        let held = self.enter(gate, Instant::now() + self.queue_wait).await?;
        Ok(Slot {
            _held: vec![held],
            _ticket: None,
        })
    }

    /// A slot of `gate`: at once when one is free, else after waiting in its queue (if there is
    /// room in it) until `deadline`.
    async fn enter(&self, gate: &Gate, deadline: Instant) -> Result<Held, Refused> {
        let label = gate.class.label();
        let permit = match gate.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let Some(_queued) = Queued::join(gate, self.queue_length, &self.metrics) else {
                    return Err(self.refuse(gate, Reason::QueueFull));
                };
                match tokio::time::timeout_at(deadline, gate.slots.clone().acquire_owned()).await {
                    Ok(Ok(permit)) => permit,
                    // Elapsed (the semaphore is never closed).
                    _ => return Err(self.refuse(gate, Reason::Timeout)),
                }
            }
        };
        let in_flight = self
            .metrics
            .admission
            .in_flight
            .get_or_create_owned(&ClassLabels { class: label });
        in_flight.inc();
        Ok(Held {
            _permit: permit,
            in_flight,
        })
    }

    fn refuse(&self, gate: &Gate, reason: Reason) -> Refused {
        self.metrics
            .admission
            .refused
            .get_or_create(&RefusedLabels {
                class: gate.class.label(),
                reason: reason.label(),
            })
            .inc();
        tracing::warn!(
            class = gate.class.label(),
            reason = reason.label(),
            limit = gate.limit,
            "request refused: no free slot (raise DAIV_SANDBOX_{} if memory allows)",
            gate.class.setting()
        );
        Refused {
            class: gate.class,
            limit: gate.limit,
            reason,
            retry_after: RETRY_AFTER,
        }
    }
}

/// One class's slots and how many requests wait for them.
#[derive(Debug)]
struct Gate {
    class: Class,
    limit: usize,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

impl Gate {
    fn new(class: Class, limit: usize) -> Self {
        Self {
            class,
            limit,
            slots: Arc::new(Semaphore::new(limit)),
            waiting: AtomicUsize::new(0),
        }
    }
}

/// A place in a gate's queue, left when dropped (a slot came, the wait ran out, or the request
/// was abandoned).
struct Queued<'a> {
    waiting: &'a AtomicUsize,
    gauge: Gauge,
}

impl<'a> Queued<'a> {
    fn join(gate: &'a Gate, queue_length: usize, metrics: &Metrics) -> Option<Self> {
        if gate.waiting.fetch_add(1, Ordering::SeqCst) >= queue_length {
            gate.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let gauge = metrics.admission.waiting.get_or_create_owned(&ClassLabels {
            class: gate.class.label(),
        });
        gauge.inc();
        Some(Self {
            waiting: &gate.waiting,
            gauge,
        })
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.gauge.dec();
    }
}

/// The per-session gates: an entry lives while a request holds a [`Ticket`] for it, so the table
/// never holds more sessions than there are fs requests in flight or waiting.
#[derive(Debug)]
struct PerSession {
    limit: usize,
    /// Session id → its gate and how many tickets refer to it.
    gates: Mutex<HashMap<String, (Arc<Gate>, usize)>>,
}

impl PerSession {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Gate>, usize)>> {
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ticket(self: &Arc<Self>, session_id: &str) -> Ticket {
        let mut gates = self.lock();
        let (gate, tickets) = gates
            .entry(session_id.to_string())
            .or_insert_with(|| (Arc::new(Gate::new(Class::FsSession, self.limit)), 0));
        *tickets += 1;
        Ticket {
            table: self.clone(),
            session_id: session_id.to_string(),
            gate: gate.clone(),
        }
    }
}

/// A request's hold on its session's gate; the last one out removes the entry.
#[derive(Debug)]
struct Ticket {
    table: Arc<PerSession>,
    session_id: String,
    gate: Arc<Gate>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut gates = self.table.lock();
        if let Some((_, tickets)) = gates.get_mut(&self.session_id) {
            *tickets -= 1;
            if *tickets == 0 {
                gates.remove(&self.session_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(creates: usize, per_session: usize, queue: usize, wait_ms: u64) -> Admission {
        let config = AdmissionConfig {
            creates,
            seeds: 1,
            fs_ops: 2,
            fs_ops_per_session: per_session,
            queue_wait: Duration::from_millis(wait_ms),
            queue_length: queue,
        };
        Admission::new(&config, Arc::new(Metrics::default()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_class_queues_then_refuses_past_the_wait() {
        let a = admission(1, 1, 4, 500);
        let first = a.create().await.expect("a free slot");
        let refused = a.create().await.expect_err("no slot within the wait");
        assert_eq!(
            (refused.class, refused.reason, refused.limit),
            (Class::Create, Reason::Timeout, 1)
        );
        assert_eq!(
            refused.to_string(),
            "too many session creates in progress (at most 1 at once); retry in 1 s"
        );
        // A waiter gets the slot the moment it frees.
        let waiter = tokio::spawn(async move {
            let slot = a.create().await;
            (slot.is_ok(), a)
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        let (admitted, a) = waiter.await.expect("waiter");
        assert!(admitted);
        let text = a.metrics.render(None);
        assert!(
            text.contains(
                "daiv_sandbox_admission_refused_total{class=\"create\",reason=\"timeout\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("daiv_sandbox_admission_in_flight{class=\"create\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("daiv_sandbox_admission_waiting{class=\"create\"} 0\n"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let a = Arc::new(admission(1, 1, 1, 60_000));
        let _held = a.create().await.expect("a free slot");
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.create().await.map(drop) }
        });
        tokio::task::yield_now().await;
        let refused = a.create().await.expect_err("queue full");
        assert_eq!(refused.reason, Reason::QueueFull);
        waiting.abort();
        // The aborted waiter left the queue: the next one may wait again.
        let _ = waiting.await;
        let again = tokio::time::timeout(Duration::from_secs(1), a.create()).await;
        assert!(again.is_err(), "waited in the queue instead of a refusal");
    }

    #[tokio::test(start_paused = true)]
    async fn one_session_cannot_take_every_fs_slot() {
        let a = admission(1, 1, 4, 200);
        let s1 = a.fs("s1").await.expect("s1's slot");
        let refused = a.fs("s1").await.expect_err("s1 is at its own limit");
        assert_eq!(refused.class, Class::FsSession);
        let s2 = a.fs("s2").await.expect("another session is not held back");
        let refused = a.fs("s3").await.expect_err("the total is reached");
        assert_eq!(refused.class, Class::Fs);
        assert_eq!(a.tracked_sessions(), 2);
        drop((s1, s2));
        assert_eq!(a.tracked_sessions(), 0, "the table forgets idle sessions");
        let _again = a.fs("s3").await.expect("slots came back");
    }
}
