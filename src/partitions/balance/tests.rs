//! The balancing decision on a simulated clock: what one process renews and claims, given what the ownership
//! documents say.

use super::*;

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a time")
}

fn secs(s: i64) -> time::Duration {
    time::Duration::seconds(s)
}

fn owned(partition: u32, owner: &str, until: OffsetDateTime) -> Ownership {
    Ownership { partition, owner: Some(owner.into()), expires_at: Some(until), claims: 0 }
}

fn free(partition: u32) -> Ownership {
    Ownership { partition, owner: None, expires_at: None, claims: 0 }
}

/// Partitions `0..N` owned as `owners` says, in order (`"-"`: free), every lease live.
fn layout(owners: &[&str]) -> Vec<Ownership> {
    let until = t0() + secs(30);
    owners.iter().enumerate().map(|(i, o)| if *o == "-" { free(i as u32) } else { owned(i as u32, o, until) }).collect()
}

#[test]
fn a_lone_process_renews_nothing_and_claims_one_free_partition() {
    let plan = plan("a", &layout(&["-"; 8]), t0(), 3);
    assert_eq!(plan.renew, Vec::<u32>::new());
    assert_eq!(plan.claim, Some(Claim { partition: 3, from: None }));
    assert_eq!(plan.share, Share { owners: 1, fair: 8, with_one_more: 0, mine: 0 });
}

#[test]
fn a_new_process_steals_from_the_owner_with_the_most_and_renews_nothing_it_does_not_hold() {
    // GIVEN a holds 5 and b holds 3, c holds none
    let seen = layout(&["a", "a", "a", "a", "a", "b", "b", "b"]);
    // WHEN c plans THEN it counts three owners (itself included) and steals one of a's
    let plan = plan("c", &seen, t0(), 7);
    assert_eq!(plan.share, Share { owners: 3, fair: 2, with_one_more: 2, mine: 0 });
    let claim = plan.claim.expect("a claim");
    assert_eq!(claim.from.as_deref(), Some("a"));
    assert!(claim.partition < 5, "{claim:?}");
    assert!(plan.renew.is_empty());
}

#[test]
fn free_and_expired_partitions_are_claimed_before_anything_is_stolen() {
    // GIVEN a holds 6 live leases, partition 6 is free and partition 7's lease (b's) has expired
    let mut seen = layout(&["a", "a", "a", "a", "a", "a", "-", "b"]);
    seen[7].expires_at = Some(t0() - secs(1));
    // WHEN c plans (b is not an active owner: its lease expired)
    let plan = plan("c", &seen, t0(), 0);
    assert_eq!(plan.share.owners, 2);
    // THEN it claims a free partition, not one of a's
    let claim = plan.claim.expect("a claim");
    assert_eq!(claim.from, None);
    assert!([6, 7].contains(&claim.partition), "{claim:?}");
}

#[test]
fn a_fair_share_claims_nothing_and_renews_its_own_even_when_expired() {
    // GIVEN 8 over 3 owners as 3, 3, 2, and c's own lease on partition 7 already expired
    let mut seen = layout(&["a", "a", "a", "b", "b", "b", "c", "c"]);
    seen[7].expires_at = Some(t0() - secs(1));
    for me in ["a", "b", "c"] {
        let plan = plan(me, &seen, t0(), 1);
        assert_eq!(plan.claim, None, "{me}: {plan:?}");
        assert!(plan.share.fits(plan.share.mine), "{me}: {plan:?}");
    }
    assert_eq!(plan("c", &seen, t0(), 1).renew, vec![6, 7]);
}

#[test]
fn an_owner_at_its_share_takes_one_more_only_while_fewer_than_n_mod_k_owners_hold_one_more() {
    // GIVEN 8 over 3: a holds 4, b 2, c 2 (fair 2, two owners may hold 3)
    let seen = layout(&["a", "a", "a", "a", "b", "b", "c", "c"]);
    // THEN b steals from a (only a holds more than 2), and a at 4 claims nothing
    assert_eq!(plan("b", &seen, t0(), 0).claim.map(|c| c.from), Some(Some("a".into())));
    assert_eq!(plan("a", &seen, t0(), 0).claim, None);
    // AND once a and b hold 3, c at 2 claims nothing
    let seen = layout(&["a", "a", "a", "b", "b", "b", "c", "c"]);
    assert_eq!(plan("c", &seen, t0(), 0).claim, None);
}

#[test]
fn a_steal_needs_a_gap_of_two_so_no_partition_goes_back_and_forth() {
    // GIVEN 3 partitions over 2 owners as 2 and 1
    let seen = layout(&["a", "a", "b"]);
    // THEN neither claims: taking one of a's would only swap who holds two
    assert_eq!(plan("a", &seen, t0(), 0).claim, None);
    assert_eq!(plan("b", &seen, t0(), 0).claim, None);
}

#[test]
fn more_processes_than_partitions_leave_the_extra_ones_idle() {
    let seen = layout(&["a", "b"]);
    let plan = plan("c", &seen, t0(), 0);
    assert_eq!(plan.share, Share { owners: 3, fair: 0, with_one_more: 2, mine: 0 });
    assert_eq!(plan.claim, None);
}
