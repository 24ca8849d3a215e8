//! The arithmetic of a change of the partition count, as pure code: which old partitions' keys a new partition
//! may hold, and the earliest of their checkpoints.
//!
//! A key's partition is `h mod N`, `h` being the key's hash, the same non-negative number whatever N (the
//! sources compute it that way: `source/*/sql`). A key in new partition `j` of `M` has `h ≡ j (mod M)`; it was in
//! old partition `i` of `N` when `h ≡ i (mod N)`. Both hold for some `h` exactly when `i ≡ j (mod gcd(N, M))`
//! (the Chinese remainder theorem), so those old partitions, and only those, feed new partition `j`:
//! - N divides M (4 → 8): gcd = N, one old partition, `j mod N`: its checkpoint carries over exactly;
//! - M divides N (8 → 4): gcd = M, the old partitions `i` with `i mod M = j`;
//! - otherwise (4 → 6): the old partitions `i ≡ j (mod gcd)`, every old partition when the counts are coprime.

use crate::source::Position;
use std::cmp::Ordering;

#[cfg(test)]
mod tests;

/// The old partitions of `n` whose keys new partition `j` of `m` may hold, in order.
pub fn feeders(j: u32, n: u32, m: u32) -> Vec<u32> {
    let g = gcd(n.max(1), m.max(1));
    (0..n).filter(|i| i % g == j % g).collect()
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The order of two stored positions: equal ones without asking, `null` (before everything) before any other,
/// else the source's order (`None`: it cannot tell).
pub fn compare(
    a: &Position,
    b: &Position,
    order: &dyn Fn(&Position, &Position) -> Option<Ordering>,
) -> Option<Ordering> {
    match (a, b) {
        _ if a == b => Some(Ordering::Equal),
        (Position::Null, _) => Some(Ordering::Less),
        (_, Position::Null) => Some(Ordering::Greater),
        _ => order(a, b),
    }
}

/// The earliest of `candidates` (each an old partition and its checkpoint): one no later than every other. When
/// no candidate can be shown to be that, the pair that could not be ordered, so the caller can name it.
pub fn earliest<'a>(
    candidates: &[(u32, &'a Position)],
    order: &dyn Fn(&Position, &Position) -> Option<Ordering>,
) -> Result<(u32, &'a Position), (u32, u32)> {
    let mut unordered = None;
    'candidate: for &(i, p) in candidates {
        for &(k, q) in candidates {
            match compare(p, q, order) {
                Some(Ordering::Less | Ordering::Equal) => {}
                Some(Ordering::Greater) => continue 'candidate,
                None => {
                    unordered.get_or_insert((i, k));
                    continue 'candidate;
                }
            }
        }
        return Ok((i, p));
    }
    // Some pair is unordered whenever no candidate is the earliest (a total order always has one).
    Err(unordered.unwrap_or((candidates.first().map_or(0, |c| c.0), candidates.last().map_or(0, |c| c.0))))
}
