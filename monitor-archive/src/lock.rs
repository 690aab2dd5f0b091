//! One policy for a poisoned lock: **recover**. A thread that panics while it holds a lock (a
//! receive thread on a crafted datagram, a bug in one rule) poisons it; `Mutex::lock` then
//! fails for every later caller. Panicking on that, as `.lock().expect(..)` does, would take
//! every thread that touches the lock with the first one: one bad datagram would stop all
//! ingest of its shard, the findings thread and the HTTP API. What the locks guard is built to
//! be read after a partial update — a node's state is per datagram and checked on the next,
//! counters only grow, a findings list is replaced whole — so every lock of the collector is
//! taken through [`lock`], which takes the guard out of the poison error and goes on.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, poisoned or not (see the module documentation).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::lock;

    #[test]
    fn a_lock_poisoned_by_a_panicking_thread_is_still_taken() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let held = shared.clone();
        let panicked = std::thread::spawn(move || {
            let mut v = held.lock().unwrap();
            v.push(2);
            panic!("a receive thread's bug");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        lock(&shared).push(3);
        assert_eq!(*lock(&shared), [1, 2, 3]);
    }
}
