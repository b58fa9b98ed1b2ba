//! Admission control in the spirit of kube-apiserver's max-in-flight filter and API Priority and
//! Fairness: a bounded number of requests and of content streams run at once, in total and per
//! user; a request past a bound waits briefly in a bounded queue, then gets `429 TooManyRequests`
//! with `Retry-After`. One user can thus fill only their own share: others' reads, writes and
//! downloads keep being served.
//!
//! Classes: read-only requests (get, list, watch) and mutating ones hold a seat until their
//! response head is ready (a watch, like kube's, only while it starts); `content` subresource
//! requests (downloads, uploads, upload pieces) hold a content seat for as long as their bodies
//! flow, since each pins buffers (and an upload a thread). Non-resource requests — discovery,
//! OpenAPI, `/version`, `/metrics`, health — are served from memory and are exempt, so kubectl
//! keeps discovering while a user is being throttled. Members of `system:masters` (the admin) are
//! not held to a per-user share, as kube-apiserver's flow control exempts them; the totals still
//! bound them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::access::Identity;
use super::request_info::RequestInfo;
use super::status::ApiError;

/// The group kube-apiserver's flow control exempts (cluster admins).
const MASTERS: &str = "system:masters";

/// The configured bounds (`stowage serve` flags).
#[derive(Clone, Copy, Debug)]
pub struct FairnessLimits {
    /// Read-only requests at once (`--max-requests-inflight`, kube's flag and default).
    pub max_read_only: usize,
    /// Mutating requests at once (`--max-mutating-requests-inflight`, kube's flag and default).
    pub max_mutating: usize,
    /// Read-only plus mutating requests of one user at once.
    pub max_per_user: usize,
    /// Content downloads and uploads at once.
    pub max_content_streams: usize,
    /// Content downloads and uploads of one user at once.
    pub max_content_streams_per_user: usize,
    /// How long a request past a bound may wait for a seat before it gets 429.
    pub queue_wait: Duration,
}

impl Default for FairnessLimits {
    fn default() -> Self {
        FairnessLimits {
            max_read_only: 400,
            max_mutating: 200,
            max_per_user: 100,
            max_content_streams: 128,
            max_content_streams_per_user: 16,
            queue_wait: Duration::from_secs(2),
        }
    }
}

/// How a request is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    ReadOnly,
    Mutating,
    Content,
}

impl Class {
    const ALL: [Class; 3] = [Class::ReadOnly, Class::Mutating, Class::Content];

    /// The class of a request, or `None` for an exempt one.
    pub fn of(info: &RequestInfo) -> Option<Class> {
        if !info.is_resource_request {
            return None;
        }
        if info.subresource == "content" {
            return Some(Class::Content);
        }
        Some(match info.verb.as_str() {
            "get" | "list" | "watch" => Class::ReadOnly,
            _ => Class::Mutating,
        })
    }

    /// The label kube-apiserver uses (`request_kind`), plus `content`.
    pub fn label(self) -> &'static str {
        match self {
            Class::ReadOnly => "readOnly",
            Class::Mutating => "mutating",
            Class::Content => "content",
        }
    }

    /// Requests and content streams are counted per user separately.
    fn user_pool(self) -> UserPool {
        match self {
            Class::Content => UserPool::Content,
            _ => UserPool::Requests,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum UserPool {
    Requests,
    Content,
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The queue for the bound was already full.
    QueueFull,
    /// No seat came free within the queue wait.
    TimedOut,
}

impl Rejection {
    fn label(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue-full",
            Rejection::TimedOut => "time-out",
        }
    }
}

/// One user's seats in one pool; dropped from the map once nobody holds or waits for a seat.
struct UserSeats {
    seats: Arc<Semaphore>,
    waiting: AtomicI64,
}

/// Counters for `/metrics`, per class.
#[derive(Default)]
struct ClassCounters {
    inflight: AtomicI64,
    waiting: AtomicI64,
    rejected_queue_full: AtomicU64,
    rejected_timed_out: AtomicU64,
}

/// The seats of one class, all users together.
struct ClassSeats {
    seats: Arc<Semaphore>,
    waiting: AtomicI64,
    counters: ClassCounters,
}

impl ClassSeats {
    fn new(limit: usize) -> ClassSeats {
        ClassSeats { seats: Arc::new(Semaphore::new(limit)), waiting: AtomicI64::new(0), counters: Default::default() }
    }
}

/// The admission state shared by every request.
pub struct Fairness {
    limits: FairnessLimits,
    read_only: ClassSeats,
    mutating: ClassSeats,
    content: ClassSeats,
    users: Mutex<HashMap<(UserPool, String), Arc<UserSeats>>>,
}

/// A request's hold on its user's share, from the time it queues until its seat is freed; the last
/// hold of a user removes the user's entry, so the map holds only active users (also when a
/// waiting request is dropped because its client went away).
struct ShareHold {
    fairness: Arc<Fairness>,
    key: (UserPool, String),
    seats: Arc<UserSeats>,
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        self.fairness.forget_idle_user(&self.key, &self.seats);
    }
}

/// A granted seat; dropping it frees the seat. (Fields drop in order: the permits before the hold.)
pub struct Seat {
    fairness: Arc<Fairness>,
    class: Class,
    _user_permit: Option<OwnedSemaphorePermit>,
    _total_permit: OwnedSemaphorePermit,
    _share: Option<ShareHold>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.fairness.class(self.class).counters.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Fairness {
    pub fn new(limits: FairnessLimits) -> Arc<Fairness> {
        let limits = FairnessLimits {
            max_read_only: limits.max_read_only.max(1),
            max_mutating: limits.max_mutating.max(1),
            max_per_user: limits.max_per_user.max(1),
            max_content_streams: limits.max_content_streams.max(1),
            max_content_streams_per_user: limits.max_content_streams_per_user.max(1),
            queue_wait: limits.queue_wait,
        };
        Arc::new(Fairness {
            read_only: ClassSeats::new(limits.max_read_only),
            mutating: ClassSeats::new(limits.max_mutating),
            content: ClassSeats::new(limits.max_content_streams),
            users: Mutex::default(),
            limits,
        })
    }

    fn class(&self, class: Class) -> &ClassSeats {
        match class {
            Class::ReadOnly => &self.read_only,
            Class::Mutating => &self.mutating,
            Class::Content => &self.content,
        }
    }

    fn total_limit(&self, class: Class) -> usize {
        match class {
            Class::ReadOnly => self.limits.max_read_only,
            Class::Mutating => self.limits.max_mutating,
            Class::Content => self.limits.max_content_streams,
        }
    }

    fn user_limit(&self, pool: UserPool) -> usize {
        match pool {
            UserPool::Requests => self.limits.max_per_user,
            UserPool::Content => self.limits.max_content_streams_per_user,
        }
    }

    fn user_seats(&self, key: &(UserPool, String)) -> Arc<UserSeats> {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        users
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(UserSeats {
                    seats: Arc::new(Semaphore::new(self.user_limit(key.0))),
                    waiting: AtomicI64::new(0),
                })
            })
            .clone()
    }

    /// Removes a user's entry once nobody else refers to it, so the map holds only active users.
    fn forget_idle_user(&self, key: &(UserPool, String), user: &Arc<UserSeats>) {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        // The map's reference and the caller's: nobody holds, nor waits for, a seat.
        if Arc::strong_count(user) == 2 && users.get(key).is_some_and(|u| Arc::ptr_eq(u, user)) {
            users.remove(key);
        }
    }

    /// Takes a seat of `class` for `user` (`None`: a user with no per-user share): at once if free,
    /// else after waiting in a bounded queue (as many waiters as seats) for at most the queue wait.
    pub async fn admit(self: &Arc<Self>, class: Class, user: Option<&str>) -> Result<Seat, Rejection> {
        let share = user.map(|user| {
            let key = (class.user_pool(), user.to_string());
            ShareHold { fairness: self.clone(), seats: self.user_seats(&key), key }
        });
        let deadline = tokio::time::Instant::now() + self.limits.queue_wait;
        let user_limit = self.user_limit(class.user_pool());
        let class_seats = self.class(class);
        let counters = &class_seats.counters;
        let result = async {
            let user_permit = match &share {
                Some(share) => Some(
                    acquire(&share.seats.seats, &share.seats.waiting, user_limit, deadline, &counters.waiting).await?,
                ),
                None => None,
            };
            let total_permit =
                acquire(&class_seats.seats, &class_seats.waiting, self.total_limit(class), deadline, &counters.waiting)
                    .await?;
            Ok((user_permit, total_permit))
        }
        .await;
        match result {
            Ok((user_permit, total_permit)) => {
                counters.inflight.fetch_add(1, Ordering::Relaxed);
                Ok(Seat {
                    fairness: self.clone(),
                    class,
                    _user_permit: user_permit,
                    _total_permit: total_permit,
                    _share: share,
                })
            }
            Err(rejection) => {
                let counter = match rejection {
                    Rejection::QueueFull => &counters.rejected_queue_full,
                    Rejection::TimedOut => &counters.rejected_timed_out,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                Err(rejection)
            }
        }
    }

    /// The admission state of each class (kube's `request_kind` label), for `/metrics`.
    pub fn counts(&self) -> [(&'static str, ClassCounts); 3] {
        Class::ALL.map(|class| {
            let c = &self.class(class).counters;
            let counts = ClassCounts {
                inflight: c.inflight.load(Ordering::Relaxed),
                waiting: c.waiting.load(Ordering::Relaxed),
                rejected: [
                    (Rejection::QueueFull.label(), c.rejected_queue_full.load(Ordering::Relaxed)),
                    (Rejection::TimedOut.label(), c.rejected_timed_out.load(Ordering::Relaxed)),
                ],
            };
            (class.label(), counts)
        })
    }
}

/// One class's admission state: requests holding a seat, waiting for one, and refused (429) by
/// reason (`queue-full`, `time-out`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassCounts {
    pub inflight: i64,
    pub waiting: i64,
    pub rejected: [(&'static str, u64); 2],
}

/// A permit of `seats`, waiting until `deadline` behind at most `queue` other waiters.
async fn acquire(
    seats: &Arc<Semaphore>,
    waiting: &AtomicI64,
    queue: usize,
    deadline: tokio::time::Instant,
    class_waiting: &AtomicI64,
) -> Result<OwnedSemaphorePermit, Rejection> {
    if let Ok(permit) = seats.clone().try_acquire_owned() {
        return Ok(permit);
    }
    let queued = waiting.fetch_add(1, Ordering::Relaxed);
    let _leave = Leave(waiting);
    if usize::try_from(queued).unwrap_or(usize::MAX) >= queue {
        return Err(Rejection::QueueFull);
    }
    class_waiting.fetch_add(1, Ordering::Relaxed);
    let _leave_class = Leave(class_waiting);
    match tokio::time::timeout_at(deadline, seats.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        // A semaphore is closed only if we closed it, which we never do; treat it as a timeout.
        Ok(Err(_)) | Err(_) => Err(Rejection::TimedOut),
    }
}

/// Decrements a waiter count when the waiting ends, however it ends (a client that goes away
/// drops the future).
struct Leave<'a>(&'a AtomicI64);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Middleware (inside the access gate, which put the identity and request info in place): admits
/// the request or answers 429; a content seat lives as long as the response body.
pub async fn admit(State(fairness): State<Arc<Fairness>>, request: Request, next: Next) -> Response {
    let class = request.extensions().get::<RequestInfo>().and_then(Class::of);
    let user = request.extensions().get::<Identity>().map(|i| &i.0);
    let (Some(class), Some(user)) = (class, user) else {
        return next.run(request).await;
    };
    let share = (!user.groups.iter().any(|g| g == MASTERS)).then_some(user.name.as_str());
    let user = user.name.clone();
    let seat = match fairness.admit(class, share).await {
        Ok(seat) => seat,
        Err(rejection) => {
            tracing::debug!(%user, kind = class.label(), reason = rejection.label(), "request throttled");
            return too_many_requests(class);
        }
    };
    let response = next.run(request).await;
    if class != Class::Content {
        return response;
    }
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _seat = &seat;
            frame
        }))
    })
}

/// 429 as kube-apiserver's flow control answers it.
fn too_many_requests(class: Class) -> Response {
    let what = match class {
        Class::Content => "too many content downloads and uploads at once",
        _ => "too many requests at once",
    };
    let mut response = ApiError::too_many_requests(format!("{what}, please try again later")).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

#[cfg(test)]
mod tests;
