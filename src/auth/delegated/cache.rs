//! A small bounded cache whose entries expire: what the TokenReview and SubjectAccessReview caches are
//! built on (kube's `LRUExpireCache` in spirit).
//!
//! Every entry has its own deadline; an expired entry is never returned and is dropped when met. When
//! the cache is full, an insert evicts the oldest insertion first (entries are short-lived, so the
//! oldest insertion is, within one TTL, the entry nearest its expiry). Memory is bounded by the
//! capacity: the insertion queue is compacted whenever stale positions (of keys re-inserted or
//! removed) make it twice as long as the map. All operations are O(1) amortized and run under one
//! mutex that is never held across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

struct Entry<V> {
    value: V,
    expires: Instant,
    seq: u64,
}

struct Inner<K, V> {
    map: HashMap<K, Entry<V>>,
    /// Insertion order: `(key, seq)`; a position whose seq differs from the entry's is stale.
    order: VecDeque<(K, u64)>,
    next_seq: u64,
}

/// A map of at most `capacity` entries, each valid until its own deadline.
pub(crate) struct TtlCache<K, V> {
    capacity: usize,
    inner: Mutex<Inner<K, V>>,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// A cache of at most `capacity` entries; capacity 0 caches nothing.
    pub(crate) fn new(capacity: usize) -> Self {
        let inner = Inner { map: HashMap::new(), order: VecDeque::new(), next_seq: 0 };
        TtlCache { capacity, inner: Mutex::new(inner) }
    }

    /// The value cached for `key`, if it has not expired.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        self.get_at(key, Instant::now())
    }

    /// [`TtlCache::get`] as of `now`: the tests look at an entry past its deadline without
    /// waiting for it.
    fn get_at(&self, key: &K, now: Instant) -> Option<V> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match inner.map.get(key) {
            Some(entry) if entry.expires > now => Some(entry.value.clone()),
            Some(_) => {
                inner.map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Caches `value` for `ttl` (replacing an earlier value for `key`). A zero TTL caches nothing.
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if self.capacity == 0 || ttl.is_zero() {
            return;
        }
        let Some(expires) = Instant::now().checked_add(ttl) else { return };
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !inner.map.contains_key(&key) {
            while inner.map.len() >= self.capacity {
                let Some((old, seq)) = inner.order.pop_front() else { break };
                if inner.map.get(&old).is_some_and(|e| e.seq == seq) {
                    inner.map.remove(&old);
                }
            }
        }
        let seq = inner.next_seq;
        inner.next_seq = seq.wrapping_add(1);
        inner.order.push_back((key.clone(), seq));
        inner.map.insert(key, Entry { value, expires, seq });
        if inner.order.len() > 2 * self.capacity + 16 {
            let Inner { map, order, .. } = &mut *inner;
            order.retain(|(k, s)| map.get(k).is_some_and(|e| e.seq == *s));
        }
    }

    /// How many entries are held (expired ones not yet dropped included).
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn entries_expire() {
        let cache = TtlCache::new(4);
        let ttl = Duration::from_millis(30);
        let before = Instant::now();
        cache.insert(1, "a", ttl);
        let after = Instant::now();
        cache.insert(2, "b", LONG);
        assert_eq!(cache.get(&1), Some("a"));
        // Its deadline is between `before + ttl` and `after + ttl`.
        assert_eq!(cache.get_at(&1, before + ttl - Duration::from_millis(1)), Some("a"), "valid until its TTL");
        assert_eq!(cache.get_at(&1, after + ttl), None, "expired at its TTL");
        assert_eq!(cache.get_at(&2, after + ttl), Some("b"));
        assert_eq!(cache.len(), 1, "the expired entry was dropped when met");
    }

    #[test]
    fn size_is_bounded_and_the_oldest_insertion_goes_first() {
        let cache = TtlCache::new(3);
        for i in 0..3 {
            cache.insert(i, i, LONG);
        }
        cache.insert(0, 10, LONG); // re-inserting makes 0 the newest
        cache.insert(3, 3, LONG);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&1), None);
        assert_eq!(cache.get(&0), Some(10));
        assert_eq!(cache.get(&2), Some(2));
        assert_eq!(cache.get(&3), Some(3));
        for round in 0..1000 {
            cache.insert(round % 2, round, LONG);
        }
        assert_eq!(cache.len(), 3);
        let order_len = cache.inner.lock().map(|i| i.order.len()).unwrap_or(usize::MAX);
        assert!(order_len <= 2 * 3 + 16, "{order_len}");
    }

    #[test]
    fn zero_capacity_or_ttl_caches_nothing() {
        let none = TtlCache::new(0);
        none.insert(1, 1, LONG);
        assert_eq!(none.get(&1), None);
        let cache = TtlCache::new(2);
        cache.insert(1, 1, Duration::ZERO);
        assert_eq!(cache.get(&1), None);
    }
}
