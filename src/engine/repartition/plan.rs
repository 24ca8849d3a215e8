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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn by_first(a: &Position, b: &Position) -> Option<Ordering> {
        let (a, b) = (a.get(0)?.as_i64()?, b.get(0)?.as_i64()?);
        (a != b).then(|| a.cmp(&b))
    }

    #[test]
    fn each_new_partition_is_fed_by_the_old_partitions_whose_keys_it_may_hold() {
        // 1 → 4: the one old document feeds all
        assert!((0..4).all(|j| feeders(j, 1, 4) == [0]));
        // 4 → 8: exactly j mod 4
        assert_eq!((0..8).map(|j| feeders(j, 4, 8)).collect::<Vec<_>>(), [[0], [1], [2], [3], [0], [1], [2], [3]]);
        // 8 → 4: i mod 4 == j
        assert_eq!(feeders(1, 8, 4), [1, 5]);
        // 4 → 6: gcd 2, the old partitions of j's parity
        assert_eq!(feeders(3, 4, 6), [1, 3]);
        assert_eq!(feeders(4, 4, 6), [0, 2]);
        // 3 → 4: coprime, all of them
        assert_eq!(feeders(2, 3, 4), [0, 1, 2]);
        // → 1: all of them
        assert_eq!(feeders(0, 4, 1), [0, 1, 2, 3]);
    }

    #[test]
    fn every_key_of_a_new_partition_lies_in_one_of_its_feeders() {
        // The claim the module docs prove, checked over hashes for every pair of counts up to 12.
        for n in 1..=12u32 {
            for m in 1..=12u32 {
                for h in 0..(4 * n * m) {
                    assert!(feeders(h % m, n, m).contains(&(h % n)), "h {h}, {n} → {m}");
                }
            }
        }
    }

    #[test]
    fn the_earliest_checkpoint_is_chosen_and_null_comes_first() {
        let (a, b, c) = (json!([5, 1]), json!([3, 9]), json!([7, 0]));
        let cands = [(0, &a), (1, &b), (2, &c)];
        assert_eq!(earliest(&cands, &by_first), Ok((1, &b)));
        let null = Position::Null;
        assert_eq!(earliest(&[(0, &a), (3, &null)], &by_first), Ok((3, &null)));
        assert_eq!(earliest(&[(0, &a), (1, &a.clone())], &|_, _| None), Ok((0, &a)));
    }

    #[test]
    fn an_unorderable_pair_is_named_unless_another_checkpoint_is_earlier_than_both() {
        // [5,1] and [5,2] share their leading number: by_first cannot order them
        let (a, b, c) = (json!([5, 1]), json!([5, 2]), json!([3, 0]));
        assert_eq!(earliest(&[(0, &a), (1, &b)], &by_first), Err((0, 1)));
        assert_eq!(earliest(&[(0, &a), (1, &b), (2, &c)], &by_first), Ok((2, &c)));
    }
}
