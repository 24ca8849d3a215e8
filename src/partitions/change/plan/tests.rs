//! Which old partitions feed a new one, and the earliest of their checkpoints.

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
