//! The capability table, and the words each refusal takes from it.

use super::*;

#[test]
fn only_the_logical_source_refuses_partitions_and_every_kind_backfills() {
    for kind in SourceKind::ALL {
        let can = kind.capabilities();
        assert_eq!(can.partitions.is_err(), kind == SourceKind::PostgresLogical, "{kind:?}");
        assert!(can.backfill, "{kind:?}");
    }
    assert_eq!(
        SourceKind::listed(|c| c.backfill),
        "postgres-cursor, postgres-logical, mssql-change-tracking and mssql-rowversion"
    );
    assert_eq!(SourceKind::listed(|c| c.metadata), "postgres-logical and mssql-change-tracking");
    assert_eq!(SourceKind::listed(|c| c.partitions.is_err()), "postgres-logical");
    assert_eq!(SourceKind::listed(|_| false), "no");
}

#[test]
fn each_refusal_names_the_kind_and_says_why_in_its_own_words() {
    let kind = SourceKind::PostgresLogical;
    let why = NoPartitions::OneReplicationStream;
    assert!(why.in_settings(kind).starts_with("is not supported by the postgres-logical source: "));
    assert!(why.in_generate("Orders", kind).starts_with("Orders reads postgres-logical, which does not support"));
    assert!(why.in_change("Orders", kind).ends_with("for the whole function): nothing was written"));
}

#[test]
fn a_source_name_reads_as_the_settings_parser_reads_it() {
    assert_eq!(SourceKind::from_name(None), Some(SourceKind::MssqlChangeTracking));
    assert_eq!(SourceKind::from_name(Some("postgres")), Some(SourceKind::PostgresCursor));
    assert_eq!(SourceKind::from_name(Some("mssql")), Some(SourceKind::MssqlChangeTracking));
    for kind in SourceKind::ALL {
        assert_eq!(SourceKind::from_name(Some(kind.as_str())), Some(kind));
    }
    assert_eq!(SourceKind::from_name(Some("oracle")), None);
}
