//! What the cheaper per-request paths keep promising: the rate limits'
//! window counters admit and refuse as documented.

use std::time::Duration;

use redis::AsyncCommands;
use seatgate::engine::status::Status;

use crate::support::{db, direct, keys, put_license, redis_ms, RedisServer, RedisServerExt};

/// The rate limits keep two window counters per key: a burst of N is
/// admitted and the next refused (not counted); the record says so; and
/// once the windows have passed the whole budget is back.
#[tokio::test]
async fn the_window_counters_admit_a_burst_refuse_the_rest_and_forget_it() {
    let redis = RedisServer::start_with(&[]).await;
    let s = redis.settings();
    put_license(&s, "lic", 3).await;
    let mut con = db(&s).await;
    const WINDOW: u64 = 400;
    let guard = |session: &str, per_session: u64, per_license: u64| {
        let mut g = seatgate::engine::scripts::Guard::none(&keys(&s), "lic", session);
        (g.session_limit, g.license_limit, g.window_ms) = (per_session, per_license, WINDOW);
        g
    };
    // Start right after a window boundary, so the burst stays in one window.
    while redis_ms(&mut con).await as u64 % WINDOW > WINDOW / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let a = direct(&s, "lic", "a").with_guard(guard("a", 3, 0));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(a.acquire(&mut con).await.status);
    }
    assert_eq!(
        statuses,
        [
            Status::Acquired,
            Status::AlreadyActive,
            Status::AlreadyActive,
            Status::RateLimited,
            Status::RateLimited
        ]
    );
    let key = keys(&s).session_rate("lic", "a");
    let record: String = con.get(&key).await.unwrap();
    let parts: Vec<u64> = record.split(':').map(|p| p.parse().unwrap()).collect();
    let now = redis_ms(&mut con).await as u64;
    assert_eq!(parts[1..], [3, 0], "{record}: refusals are not counted");
    assert!(
        parts[0] == now / WINDOW || parts[0] + 1 == now / WINDOW,
        "{record}"
    );
    let ttl: i64 = con.pttl(&key).await.unwrap();
    assert!(
        ttl > 0 && ttl as u64 <= 2 * WINDOW,
        "lives through the next window: {ttl}"
    );
    // Release is never limited nor counted.
    let released = a.release(&mut con).await;
    assert_eq!(released.status, Status::Released);
    assert_eq!(con.get::<_, String>(&key).await.unwrap(), record);

    // The license's limit counts every session together.
    let b = |session: &str| direct(&s, "lic", session).with_guard(guard(session, 0, 2));
    assert_eq!(b("b").acquire(&mut con).await.status, Status::Acquired);
    assert_eq!(b("c").acquire(&mut con).await.status, Status::Acquired);
    assert_eq!(b("d").acquire(&mut con).await.status, Status::RateLimited);

    // Two windows later nothing of the burst counts any more.
    tokio::time::sleep(Duration::from_millis(2 * WINDOW + 50)).await;
    assert_eq!(a.acquire(&mut con).await.status, Status::Acquired);
    assert_eq!(b("d").acquire(&mut con).await.status, Status::NoSeatsAvailable);
}
