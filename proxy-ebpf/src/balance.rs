//! Which of a frontend's backends a new connection gets, by the frontend's
//! `lb-algorithm` (slot 0's flags): a slot at random, or the less loaded
//! of two slots at random (`least-connections`: "the power of two
//! choices", by the active connections the programs count per backend in
//! `ACTIVE_CONNS`). Any path that picks a backend for a new connection
//! calls it with the frontend's key and slot 0; session affinity, traffic
//! policies, topology and the terminating fallback have chosen the slots
//! already (docs/design.md, "Balancing by load").
use proxy_common::{SLOTS_PER_ENTRY, ServiceKey, ServiceValue, service_flags};

use crate::{
    access::random_u32,
    maps::{active_connections, service},
};

/// The backend id for a new connection to `frontend` (slot 0 of `key`'s
/// frontend, `count` above 0), by its algorithm. `key` is used in place
/// (its slot changes), so the key stays one copy on the stack.
#[inline(always)]
pub fn choose(key: &mut ServiceKey, frontend: &ServiceValue) -> Option<u32> {
    if frontend.flags & service_flags::LEAST_CONNECTIONS != 0 {
        least_connections(key, frontend)
    } else {
        random(key, frontend)
    }
}

/// The backend id in a random slot.
#[inline(always)]
pub fn random(key: &mut ServiceKey, frontend: &ServiceValue) -> Option<u32> {
    // `checked_rem`: a plain `%` carries a panic path for a zero count,
    // which the verifier refuses.
    let index = random_u32().checked_rem(u32::from(frontend.count))?;
    slot(key, index)
}

/// Two distinct slots at random; the backend with fewer active connections
/// (a tie at random). With one backend, that one.
#[inline(always)]
pub fn least_connections(key: &mut ServiceKey, frontend: &ServiceValue) -> Option<u32> {
    let count = u32::from(frontend.count);
    let draw = random_u32();
    let first_index = draw.checked_rem(count)?;
    let first = slot(key, first_index)?;
    let Some(others) = random_u32().checked_rem(count - 1) else { return Some(first) };
    // One of the other `count - 1` slots, uniformly.
    let second_index = if others >= first_index { others + 1 } else { others };
    let Some(second) = slot(key, second_index) else { return Some(first) };
    let (a, b) = (active_connections(first), active_connections(second));
    // The top bit of the first draw is independent of its remainder below
    // `count` (at most 65,535): a fair coin for a tie.
    if a < b || (a == b && draw >> 31 == 0) { Some(first) } else { Some(second) }
}

/// The backend id in slot `index` (below `count`): word `index % 4` of the
/// entry at key slot `index / 4 + 1` (`ServiceKey::slots_of`). Backends
/// `0..count` are written before slot 0 announces `count`, so this misses
/// only if the agent broke that order.
#[inline(always)]
fn slot(key: &mut ServiceKey, index: u32) -> Option<u32> {
    #[expect(clippy::cast_possible_truncation, reason = "below count, a u16")]
    let index = index as u16;
    key.slot = index / SLOTS_PER_ENTRY + 1;
    Some(service(key)?.slot_id(index))
}
