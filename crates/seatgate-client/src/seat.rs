//! The seat handle: a seat that keeps itself, the part of a client every
//! team would otherwise write again (docs/protocol.md, "Writing a client").
//!
//! [`Client::acquire_seat`] returns a [`Seat`] once the session holds one
//! (at once, or after waiting in the queue). From then on a task of its
//! own heartbeats at a third of the heartbeat timeout the service last
//! gave (the grant's, then each HEARTBEAT_UPDATED's), and the owner reads
//! the seat's state ([`Seat::watch`], [`Seat::lost`]) instead of sending
//! anything. [`Seat::release`] gives the seat back; dropping the handle
//! does too, best effort, on the runtime it was dropped in.
//!
//! Every request it sends carries the seat's lease and a `ttl_ms`. When
//! one goes unanswered for the request timeout it is sent again under a
//! new request id and the same lease: the first one expires (the service
//! answers REQUEST_EXPIRED and changes nothing), so it can never be decided
//! after its replacement, and whichever attempt is answered first answers
//! the call. An acquire the caller gives up on (it timed out in the queue,
//! or its future was dropped) is undone: the handle releases the session
//! with its lease, and releases again any grant that still comes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::select_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::reply::Reply;
use super::request::{duration_ms, new_lease, Call, Client, Pending, SeatOp};
use seatgate_core::error::Error;
use seatgate_core::protocol::Lease;
use seatgate_core::status::Status;

/// Attempts of one request whose replies are still awaited. Older ones are
/// dropped (their in-flight slots given back): with `ttl_ms` each has long
/// expired by the time four more were sent.
const ATTEMPTS_KEPT: usize = 4;

/// How much longer than its `wait_ms` a queued acquire waits for its final
/// reply: a QUEUE_TIMEOUT comes up to a reaper period late, later still if
/// its first delivery failed.
const QUEUE_MARGIN: Duration = Duration::from_secs(30);

/// The shortest pause between heartbeats, whatever the timeout says.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// How a seat handle talks to the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatOptions {
    /// How long to wait for a reply before sending the request again
    /// under a new id (same lease).
    pub request_timeout: Duration,
    /// The `ttl_ms` every request carries (unless the acquire's [`Call`]
    /// has its own); `None`: the client's `client.ttl_ms`, but at most
    /// `request_timeout`. Keep it at most `request_timeout`: only then is a
    /// request given up on sure to be decided, if ever, before the one sent
    /// in its place.
    pub ttl: Option<Duration>,
    /// How long an acquire (before any QUEUED) goes on sending before it
    /// gives up with [`Error::ReplyTimeout`]. A release goes on at least
    /// this long, and until the seat's heartbeat timeout has run out since
    /// its last heartbeat ([`Seat::release`]). Heartbeats never give up:
    /// the seat is the service's to take, not the client's.
    pub give_up_after: Duration,
}

impl Default for SeatOptions {
    /// 5 s per reply, the client's ttl, giving up after 30 s.
    fn default() -> SeatOptions {
        SeatOptions {
            request_timeout: Duration::from_secs(5),
            ttl: None,
            give_up_after: Duration::from_secs(30),
        }
    }
}

/// What became of a seat, as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeatState {
    /// The session holds the seat.
    Held {
        /// The heartbeat timeout the service last gave; the handle
        /// heartbeats at a third of it.
        heartbeat_timeout: Duration,
        /// Heartbeats answered HEARTBEAT_UPDATED so far.
        heartbeats: u64,
    },
    /// The service took the seat, or said it is no longer held: the
    /// heartbeat's status (SESSION_NOT_ACTIVE after an eviction,
    /// SESSION_REVOKED, LEASE_MISMATCH, ...) and its `error` field; or
    /// `Error` when the client stopped reading replies.
    Lost {
        /// The status that said so.
        status: Status,
        /// Its `error` field ("" when none).
        error: String,
    },
    /// Given back by [`Seat::release`] (or the handle's drop).
    Released,
}

/// Why [`Client::acquire_seat`] returned no seat.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The service answered, and not with a seat: NO_SEATS_AVAILABLE,
    /// QUEUE_TIMEOUT, LEASE_MISMATCH, LICENSE_NOT_FOUND, ... The reply
    /// says which.
    #[error("refused: {} {}", .0.get("status"), .0.get("error"))]
    Refused(Box<Reply>),
    /// No answer (in time), or the client could not send.
    #[error(transparent)]
    Failed(#[from] Error),
}

/// What a release learnt: never a failure when the seat was given back.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Released {
    /// The service gave the seat back (RELEASED), or took the session out
    /// of the queue (LEFT_QUEUE): the reply.
    Released(Reply),
    /// The seat was no longer the session's when a release was decided
    /// (SESSION_NOT_FOUND: evicted, or released already; SESSION_REVOKED
    /// with the administrator's reason; LEASE_MISMATCH; LICENSE_NOT_FOUND):
    /// the reply says why.
    AlreadyGone(Reply),
    /// No attempt was answered before the seat's heartbeat timeout ran out
    /// (nor within `give_up_after`, if later): if none ever reaches the
    /// service, the seat has been evicted by then. Nothing more could be learnt.
    Unknown,
}

impl Released {
    /// The service's answer, when there was one.
    pub fn reply(&self) -> Option<&Reply> {
        match self {
            Released::Released(r) | Released::AlreadyGone(r) => Some(r),
            Released::Unknown => None,
        }
    }

    /// Its status, when there was an answer.
    pub fn status(&self) -> Option<Status> {
        self.reply().map(Reply::status)
    }
}

/// A seat the session holds and the handle keeps: see the module's doc.
pub struct Seat {
    /// The client its requests go through (kept alive with the handle).
    client: Client,
    /// The reply that granted it (ACQUIRED, ALREADY_ACTIVE or GRANTED).
    grant: Reply,
    /// The lease the seat is bound to.
    lease: Lease,
    /// What a release of the seat sends (its lease and ttl filled in).
    release: Call,
    /// How to send.
    opts: SeatOptions,
    /// The seat's state; the heartbeat task writes it too.
    state: Arc<watch::Sender<SeatState>>,
    /// Stops the heartbeat task.
    stop: CancellationToken,
    /// The heartbeat task, awaited before a release is sent.
    heartbeats: Option<JoinHandle<()>>,
    /// Whether the seat was released (or is being): nothing left for `Drop`.
    released: bool,
    /// When the seat's heartbeat clock last restarted, as this handle saw
    /// it (the grant, then each answered heartbeat): a release keeps trying
    /// until the heartbeat timeout has run out since then.
    last_beat: Arc<std::sync::Mutex<Instant>>,
}

impl Client {
    /// Takes a seat for `call`'s session (an acquire; with a `wait_ms` it
    /// may wait in the queue) and returns a handle that keeps it: see
    /// [`Seat`]. The lease is the call's, else the one this client holds
    /// for the session, else a new one; `ttl_ms` the call's, else the
    /// options'. Timed-out attempts are sent again under new ids until
    /// `opts.give_up_after`; a QUEUED acquire then waits for its GRANTED
    /// up to its `wait_ms` (and a margin). Giving up, or dropping the
    /// returned future, undoes the acquire in the background.
    pub async fn acquire_seat(&self, call: &Call, opts: &SeatOptions) -> Result<Seat, AcquireError> {
        self.acquire_seat_with(call, opts, |_| {}).await
    }

    /// [`acquire_seat`](Client::acquire_seat), telling `on_queued` each
    /// QUEUED reply it hears while it waits (the first, a re-sent
    /// acquire's, a waiter heartbeat's): its `position` says where the
    /// session stands, for a "waiting for a seat" display.
    pub async fn acquire_seat_with(
        &self,
        call: &Call,
        opts: &SeatOptions,
        mut on_queued: impl FnMut(&Reply) + Send,
    ) -> Result<Seat, AcquireError> {
        if call.op != SeatOp::Acquire {
            return Err(
                Error::Usage(format!("acquire_seat sends an acquire, not {}", call.op.as_str())).into(),
            );
        }
        let lease = call
            .lease
            .clone()
            .or_else(|| self.lease(&call.license, &call.session))
            .or_else(new_lease)
            .ok_or_else(|| Error::Client("cannot make a lease".into()))?;
        let ttl_ms = call
            .ttl_ms
            .unwrap_or_else(|| duration_ms(opts.ttl.unwrap_or(self.default_ttl().min(opts.request_timeout))));
        let acquire = Call {
            lease: Some(lease.clone()),
            ttl_ms: Some(ttl_ms),
            ..call.clone()
        };
        let release = seat_call(&acquire, SeatOp::Release);
        // Armed until the acquire ends in a seat or a refusal: an error
        // return, or this future being dropped, undoes it.
        let mut undo = Undo {
            acquire: Some(Exchange::new(self.clone(), acquire, opts.request_timeout)),
            release: release.clone(),
            opts: opts.clone(),
        };
        let Some(ex) = undo.acquire.as_mut() else {
            unreachable!("just set")
        };
        let mut reply = ex.answer(Some(Instant::now() + opts.give_up_after)).await?;
        if reply.status() == Status::Queued {
            on_queued(&reply);
            // Decided: from now on it waits for GRANTED or QUEUE_TIMEOUT under
            // the id of whichever attempt queued it last, and keeps its place
            // with a waiter heartbeat every third of the heartbeat timeout
            // (docs/protocol.md, "Waiter liveness"), each in a task of its
            // own, so that none holds up the wait.
            let wait = Duration::from_millis(call.wait_ms);
            let deadline = Instant::now() + wait + opts.request_timeout + QUEUE_MARGIN;
            let alive = seat_call(&release, SeatOp::Heartbeat);
            let mut every = reply
                .heartbeat_timeout()
                .unwrap_or_else(|| self.default_heartbeat_timeout())
                / 3;
            let mut beat_at = Instant::now() + every.max(MIN_PAUSE);
            let (beats, mut answers) = tokio::sync::mpsc::unbounded_channel();
            reply = loop {
                tokio::select! {
                    next = ex.next_until(deadline.min(beat_at)) => match next? {
                        None if Instant::now() >= deadline => {
                            return Err(Error::ReplyTimeout(wait + opts.request_timeout + QUEUE_MARGIN).into())
                        }
                        None => {
                            beat_at = Instant::now() + every.max(MIN_PAUSE);
                            let (client, alive, beats, timeout) =
                                (self.clone(), alive.clone(), beats.clone(), opts.request_timeout);
                            tokio::spawn(async move {
                                if let Ok(r) = client.call(&alive, timeout).await {
                                    let _ = beats.send(r);
                                }
                            });
                        }
                        Some(r) if r.status() == Status::Queued => on_queued(&r),
                        Some(r) if r.status() == Status::RequestExpired => {}
                        Some(r) => break r,
                    },
                    Some(r) = answers.recv() => {
                        if r.status() == Status::Queued {
                            on_queued(&r);
                            // A timeout lowered while it waits is followed.
                            if let Some(t) = r.heartbeat_timeout() {
                                every = t / 3;
                            }
                        }
                    }
                }
            };
        }
        let grants = matches!(
            reply.status(),
            Status::Acquired | Status::AlreadyActive | Status::Granted
        );
        if !grants {
            // One attempt answered is the whole story; with more, an older
            // one might still be decided by a service that does not expire
            // requests, so the undo stays armed to release such a grant.
            if ex.sent == 1 {
                undo.acquire = None;
            }
            return Err(AcquireError::Refused(Box::new(reply)));
        }
        let since_first_sent = ex.first_sent.map_or(Duration::ZERO, |t| t.elapsed());
        undo.acquire = None;

        let heartbeat_timeout = reply
            .heartbeat_timeout()
            .unwrap_or_else(|| self.default_heartbeat_timeout());
        let first_pause = first_pause(&reply, heartbeat_timeout, since_first_sent);
        let state = Arc::new(watch::Sender::new(SeatState::Held {
            heartbeat_timeout,
            heartbeats: 0,
        }));
        let stop = CancellationToken::new();
        let last_beat = Arc::new(std::sync::Mutex::new(Instant::now()));
        let heart = Heartbeats {
            client: self.clone(),
            call: seat_call(&release, SeatOp::Heartbeat),
            request_timeout: opts.request_timeout,
            state: state.clone(),
            last_beat: last_beat.clone(),
        };
        let heartbeats = tokio::spawn(heart.run(heartbeat_timeout, first_pause, stop.clone()));
        Ok(Seat {
            client: self.clone(),
            grant: reply,
            lease,
            release,
            opts: opts.clone(),
            state,
            stop,
            heartbeats: Some(heartbeats),
            released: false,
            last_beat,
        })
    }
}

impl Seat {
    /// The license.
    pub fn license(&self) -> &str {
        &self.release.license
    }

    /// The session.
    pub fn session(&self) -> &str {
        &self.release.session
    }

    /// The lease the seat is bound to.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The reply that granted the seat (ACQUIRED, ALREADY_ACTIVE or GRANTED).
    pub fn grant(&self) -> &Reply {
        &self.grant
    }

    /// The seat's state now.
    pub fn state(&self) -> SeatState {
        self.state.borrow().clone()
    }

    /// A receiver of the seat's state, changed at every heartbeat answered
    /// and when the seat is lost or released.
    pub fn watch(&self) -> watch::Receiver<SeatState> {
        self.state.subscribe()
    }

    /// Waits until the seat is no longer held, and says why.
    pub async fn lost(&self) -> SeatState {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`: the wait cannot fail while we borrow it.
        let _ = rx.wait_for(|s| !matches!(s, SeatState::Held { .. })).await;
        let state = rx.borrow().clone();
        state
    }

    /// Stops heartbeating and gives the seat back. The release is sent again
    /// under new ids, the same lease, until the service answers; a reply to
    /// any attempt counts, the first decided first. It gives up only once
    /// the seat's heartbeat timeout has run out since its last answered
    /// heartbeat (and not before `give_up_after`): by then a seat whose
    /// release never arrived is evicted. So a release that worked is never
    /// reported as failed: see [`Released`]. `Err` only when the client
    /// stopped reading replies.
    pub async fn release(mut self) -> Result<Released, Error> {
        self.released = true;
        self.stop.cancel();
        if let Some(heartbeats) = self.heartbeats.take() {
            let _ = heartbeats.await;
        }
        let until = self.release_deadline();
        let released = release(self.client.clone(), self.release.clone(), &self.opts, until).await?;
        if !matches!(released, Released::Unknown) {
            self.state.send_if_modified(|s| {
                let held = matches!(s, SeatState::Held { .. });
                if held {
                    *s = SeatState::Released;
                }
                held
            });
        }
        Ok(released)
    }

    /// When a release of this seat stops trying: the heartbeat timeout
    /// last heard (and a request timeout) after the last answered
    /// heartbeat, or `give_up_after` from now, whichever is later.
    fn release_deadline(&self) -> Instant {
        let timeout = match &*self.state.borrow() {
            SeatState::Held {
                heartbeat_timeout, ..
            } => *heartbeat_timeout,
            _ => Duration::ZERO,
        };
        let last = *self.last_beat.lock().unwrap_or_else(|p| p.into_inner());
        (last + timeout + self.opts.request_timeout).max(Instant::now() + self.opts.give_up_after)
    }
}

impl Drop for Seat {
    /// Stops heartbeating and, if the seat is still held, releases it in
    /// the background on the current runtime; without one, the seat is
    /// evicted after its heartbeat timeout.
    fn drop(&mut self) {
        self.stop.cancel();
        if self.released || !matches!(*self.state.borrow(), SeatState::Held { .. }) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let heartbeats = self.heartbeats.take();
        let until = self.release_deadline();
        let (client, call, opts) = (self.client.clone(), self.release.clone(), self.opts.clone());
        let state = self.state.clone();
        runtime.spawn(async move {
            if let Some(heartbeats) = heartbeats {
                let _ = heartbeats.await;
            }
            match release(client, call, &opts, until).await {
                Ok(Released::Unknown) => tracing::warn!("no answer to the release of a dropped seat; it is evicted after its heartbeat timeout if the release never arrived"),
                Ok(_) => {
                    state.send_replace(SeatState::Released);
                }
                Err(e) => tracing::warn!(error = %e, "could not release a dropped seat; it is evicted after its heartbeat timeout"),
            }
        });
    }
}

/// How long after `grant` the first heartbeat goes out: at once for a
/// GRANTED (its claim), else a third of the timeout after the seat's
/// heartbeat clock started. The service says when
/// that was (`held_since_ms`) on replies that grant or replay a seat.
/// Without it: a clock started for this acquire started after its first
/// attempt went out, `since_first_sent` ago; ALREADY_ACTIVE's may be older
/// still (an earlier acquire of the session), so it is taken as run out.
fn first_pause(grant: &Reply, heartbeat_timeout: Duration, since_first_sent: Duration) -> Duration {
    if grant.status() == Status::Granted {
        // A grant is claimed with a heartbeat at once, well within its claim
        // window (docs/protocol.md, "The wait queue").
        return Duration::ZERO;
    }
    let age = grant.clock_age().unwrap_or(match grant.status() {
        Status::AlreadyActive => heartbeat_timeout,
        _ => since_first_sent,
    });
    (heartbeat_timeout / 3).saturating_sub(age)
}

/// `call`'s license, session, lease and ttl in a request `op`, with
/// nothing of the acquire's own (meta, wait, policy).
fn seat_call(call: &Call, op: SeatOp) -> Call {
    Call {
        lease: call.lease.clone(),
        ttl_ms: call.ttl_ms,
        ..Call::new(op, &call.license, &call.session)
    }
}

/// Sends `call` (a release) until answered or `until`, keeping every
/// attempt's waiter (a frozen Redis decides them all at once, the first
/// RELEASED and the rest SESSION_NOT_FOUND); tries again after an answer
/// that decided nothing (RATE_LIMITED, ERROR).
async fn release(client: Client, call: Call, opts: &SeatOptions, until: Instant) -> Result<Released, Error> {
    let mut ex = Exchange::new(client, call, opts.request_timeout);
    ex.keep = usize::MAX;
    loop {
        let reply = match ex.answer(Some(until)).await {
            Ok(reply) => reply,
            Err(Error::ReplyTimeout(_)) => return Ok(Released::Unknown),
            Err(e) => return Err(e),
        };
        match reply.status() {
            Status::Released | Status::LeftQueue => return Ok(Released::Released(reply)),
            Status::RateLimited | Status::Error => {
                if Instant::now() >= until {
                    return Ok(Released::Unknown);
                }
                tokio::time::sleep((opts.request_timeout / 5).max(MIN_PAUSE)).await;
                ex.send().await?;
            }
            _ => return Ok(Released::AlreadyGone(reply)),
        }
    }
}

/// Sends `call` (the release that undoes an acquire) until answered or
/// `opts.give_up_after`.
async fn undo_release(client: Client, call: Call, opts: &SeatOptions) -> Result<Released, Error> {
    release(client, call, opts, Instant::now() + opts.give_up_after).await
}

/// The seat's heartbeat task.
struct Heartbeats {
    /// Its client.
    client: Client,
    /// The heartbeat request (lease and ttl filled in).
    call: Call,
    /// How long one attempt waits before the next goes out.
    request_timeout: Duration,
    /// Where the seat's state goes.
    state: Arc<watch::Sender<SeatState>>,
    /// When the last heartbeat was answered.
    last_beat: Arc<std::sync::Mutex<Instant>>,
}

impl Heartbeats {
    /// Heartbeats, the first after `pause`, then at a third of the timeout
    /// last heard, until `stop` or the seat is lost.
    async fn run(self, mut timeout: Duration, mut pause: Duration, stop: CancellationToken) {
        let mut beats = 0;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause.max(MIN_PAUSE)) => {}
            }
            let mut ex = Exchange::new(self.client.clone(), self.call.clone(), self.request_timeout);
            let reply = tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                reply = ex.answer(None) => reply,
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    self.lose(Status::Error, e.to_string());
                    return;
                }
            };
            match reply.status() {
                Status::HeartbeatUpdated => {
                    // A service that does not send the timeout on heartbeats
                    // leaves the one of the grant in force.
                    timeout = reply.heartbeat_timeout().unwrap_or(timeout);
                    beats += 1;
                    *self.last_beat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                    self.state.send_replace(SeatState::Held {
                        heartbeat_timeout: timeout,
                        heartbeats: beats,
                    });
                    pause = timeout / 3;
                }
                // Nothing was decided about the seat (too many requests, a
                // persistent Redis error, a status this client does not
                // know): try again sooner than usual.
                Status::RateLimited | Status::Error => pause = timeout / 6,
                status => {
                    self.lose(status, reply.get("error").to_owned());
                    return;
                }
            }
        }
    }

    /// Records the seat as lost.
    fn lose(&self, status: Status, error: String) {
        tracing::warn!(status = status.as_str(), error, "a seat was lost");
        self.state.send_replace(SeatState::Lost { status, error });
    }
}

/// An acquire being undone when its caller gave up or went away.
struct Undo {
    /// The acquire's attempts, whose late grants must be released; `None`
    /// once the acquire ended in a seat or a plain refusal.
    acquire: Option<Exchange>,
    /// The release that undoes it.
    release: Call,
    /// How to send it.
    opts: SeatOptions,
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(acquire) = self.acquire.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(undo(acquire, self.release.clone(), self.opts.clone()));
    }
}

/// Releases the session (a queued one leaves the queue, a granted one gives
/// its seat back), then keeps listening to the acquire's attempts for a
/// while and releases again after any grant that still comes.
async fn undo(mut acquire: Exchange, release_call: Call, opts: SeatOptions) {
    let client = acquire.client.clone();
    match undo_release(client.clone(), release_call.clone(), &opts).await {
        Ok(Released::Unknown) => tracing::warn!("no answer to the release of an acquire given up on"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not release an acquire given up on"),
    }
    let until = Instant::now() + opts.give_up_after;
    while let Ok(Some(reply)) = acquire.next_until(until).await {
        if matches!(
            reply.status(),
            Status::Acquired | Status::AlreadyActive | Status::Granted
        ) {
            tracing::info!(
                status = reply.get("status"),
                "releasing a seat granted after its acquire was given up on"
            );
            match undo_release(client.clone(), release_call.clone(), &opts).await {
                Ok(Released::Unknown) => tracing::warn!("no answer to the release of a late grant"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not release a late grant"),
            }
        }
    }
}

/// One request carried through timeouts: every attempt under a new request
/// id, the same fields (lease and `ttl_ms` included); a reply to any of the
/// attempts answers it.
struct Exchange {
    /// The client sending it.
    client: Client,
    /// The request.
    call: Call,
    /// How long an attempt waits before the next goes out.
    request_timeout: Duration,
    /// The last `keep` attempts, oldest first.
    attempts: VecDeque<Pending>,
    /// How many attempts' waiters are kept ([`ATTEMPTS_KEPT`]; a release keeps all).
    keep: usize,
    /// When the first attempt went out.
    first_sent: Option<Instant>,
    /// When the last attempt went out (or failed to).
    last_sent: Instant,
    /// Attempts made, sent or not.
    sent: u32,
}

impl Exchange {
    fn new(client: Client, call: Call, request_timeout: Duration) -> Exchange {
        Exchange {
            client,
            call,
            request_timeout,
            attempts: VecDeque::new(),
            keep: ATTEMPTS_KEPT,
            first_sent: None,
            last_sent: Instant::now(),
            sent: 0,
        }
    }

    /// Sends one more attempt. A failed XADD (Redis unreachable) is only
    /// logged: the next attempt follows after the request timeout, as
    /// after an unanswered one. Fails only when the client stopped.
    async fn send(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        self.first_sent.get_or_insert(now);
        self.last_sent = now;
        self.sent += 1;
        match self.client.request(&self.call).await {
            Ok(pending) => {
                if self.sent > 1 {
                    tracing::debug!(
                        op = self.call.op.as_str(),
                        id = pending.id(),
                        attempt = self.sent,
                        "sent again under a new id"
                    );
                }
                if self.attempts.len() >= self.keep {
                    self.attempts.pop_front();
                }
                self.attempts.push_back(pending);
                Ok(())
            }
            Err(e @ Error::Client(_)) => Err(e),
            Err(e) => {
                tracing::warn!(op = self.call.op.as_str(), error = %e, "cannot send a request; trying again");
                Ok(())
            }
        }
    }

    /// Whether `reply` answers the latest attempt.
    fn is_latest(&self, reply: &Reply) -> bool {
        self.attempts.back().is_some_and(|p| p.id() == reply.get("id"))
    }

    /// The next reply to any attempt; `None` once `until` passes first.
    async fn next_until(&mut self, until: Instant) -> Result<Option<Reply>, Error> {
        if self.attempts.is_empty() {
            tokio::time::sleep_until(until.into()).await;
            return Ok(None);
        }
        let waits = self.attempts.iter_mut().map(|p| Box::pin(p.next_reply()));
        match tokio::time::timeout_at(until.into(), select_all(waits)).await {
            Err(_) => Ok(None),
            Ok((Some(reply), _, _)) => Ok(Some(reply)),
            Ok((None, _, _)) => Err(Error::Client("the reply reader stopped".into())),
        }
    }

    /// The first reply that is not REQUEST_EXPIRED, sending attempts
    /// (the first now if none went out) until one is answered: again after
    /// each request timeout without a reply, and at once when the latest
    /// expired. Gives up at `give_up` (`None`: never).
    async fn answer(&mut self, give_up: Option<Instant>) -> Result<Reply, Error> {
        if self.sent == 0 {
            self.send().await?;
        }
        loop {
            let resend_at = self.last_sent + self.request_timeout;
            let until = give_up.map_or(resend_at, |g| g.min(resend_at));
            match self.next_until(until).await? {
                Some(reply) if reply.status() == Status::RequestExpired => {
                    if self.is_latest(&reply) {
                        self.send().await?;
                    }
                }
                Some(reply) => return Ok(reply),
                None if give_up.is_some_and(|g| Instant::now() >= g) => {
                    let waited = self.first_sent.map_or(Duration::ZERO, |t| t.elapsed());
                    return Err(Error::ReplyTimeout(waited));
                }
                None => self.send().await?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn grant(status: &str, written_ms: Option<u64>, held_since_ms: Option<u64>) -> Reply {
        let mut fields = BTreeMap::from([("status".to_owned(), status.to_owned())]);
        if let Some(ms) = held_since_ms {
            fields.insert("held_since_ms".to_owned(), ms.to_string());
        }
        Reply {
            fields,
            lease: None,
            written_ms,
        }
    }

    #[test]
    fn the_first_heartbeat_comes_a_third_of_the_timeout_after_the_clock_started() {
        let timeout = Duration::from_millis(3000);
        let ms = Duration::from_millis;
        // The service says when the clock started: its age counts, not ours.
        let fresh = grant("ACQUIRED", Some(10_000), Some(9_800));
        assert_eq!(first_pause(&fresh, timeout, ms(5000)), ms(800));
        // A grant is claimed at once, however fresh.
        assert_eq!(
            first_pause(&grant("GRANTED", Some(10_000), Some(9_800)), timeout, ms(5000)),
            Duration::ZERO
        );
        let old = grant("ACQUIRED", Some(10_000), Some(6_000));
        assert_eq!(
            first_pause(&old, timeout, ms(10)),
            Duration::ZERO,
            "old news: at once"
        );
        // Without held_since_ms: counted from the acquire's first attempt...
        assert_eq!(
            first_pause(&grant("ACQUIRED", Some(10_000), None), timeout, ms(300)),
            ms(700)
        );
        assert_eq!(
            first_pause(&grant("GRANTED", None, None), timeout, ms(4000)),
            Duration::ZERO
        );
        // ...except ALREADY_ACTIVE, whose clock may be older than the acquire.
        assert_eq!(
            first_pause(&grant("ALREADY_ACTIVE", Some(10_000), None), timeout, ms(1)),
            Duration::ZERO
        );
        assert_eq!(
            first_pause(
                &grant("ALREADY_ACTIVE", Some(10_000), Some(9_900)),
                timeout,
                ms(1)
            ),
            ms(900)
        );
    }

    #[test]
    fn a_seat_call_keeps_the_lease_and_ttl_and_drops_the_acquires_own_fields() {
        let lease = Lease::parse("abcdefghijklmnop").unwrap();
        let acquire = Call::acquire("lic", "s1")
            .with_meta(serde_json::json!({}))
            .with_wait(Duration::from_millis(500))
            .with_lease(lease)
            .with_ttl(Duration::from_secs(2));
        let heartbeat = seat_call(&acquire, SeatOp::Heartbeat);
        assert_eq!(
            heartbeat.fields(),
            [
                ("op", "heartbeat".to_owned()),
                ("license", "lic".to_owned()),
                ("session", "s1".to_owned()),
                ("lease", "abcdefghijklmnop".to_owned()),
                ("ttl_ms", "2000".to_owned()),
            ]
        );
    }
}
