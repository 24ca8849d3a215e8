//! The settings that decide what PostgreSQL connections trust, the channel-binding hash, and the handshake
//! errors' words. The handshakes themselves are tested against a real PostgreSQL in tests/postgres_tls.rs.

use super::*;
use crate::config::Env;
use rustls::pki_types::pem::PemObject;
use std::path::Path;

/// A self-signed CA (ECDSA P-256, signed with SHA-256), valid until 2126; its key was thrown away.
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBuzCCAWGgAwIBAgIUR71kmMT9sZMGOzNqMswFC/V2pO0wCgYIKoZIzj0EAwIw
KjEoMCYGA1UEAwwfc3FsLXBzZXVkby10cmlnZ2VyIHVuaXQtdGVzdCBDQTAgFw0y
NjExMjIwODA0NDFaGA8yMTI2MTAyOTA4MDQ0MVowKjEoMCYGA1UEAwwfc3FsLXBz
ZXVkby10cmlnZ2VyIHVuaXQtdGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABMRvWullS57uhC3lM3w38ZXS7D1IodjjgYmBd9K88vr/tpGBLrQiJeWmlXpc
B6sAhpD7t7PwTHYOnytkZQSyrVOjYzBhMB0GA1UdDgQWBBQaOpqHavJUBDdsCwOA
d8P8vzdCszAfBgNVHSMEGDAWgBQaOpqHavJUBDdsCwOAd8P8vzdCszAPBgNVHRMB
Af8EBTADAQH/MA4GA1UdDwEB/wQEAwIBBjAKBggqhkjOPQQDAgNIADBFAiBckcNk
x/O97tjRqoDhDY6kofTmHp/C22Cg/omB5JnsAAIhAN8S5KOos1c4qFpGtlXXst/o
85Ao0areydWljQ64sl2Y
-----END CERTIFICATE-----
";

/// A self-signed certificate made as Debian's ssl-cert makes its "snakeoil" one (CN and subjectAltName
/// DNS:pg.example.test, CA:FALSE; ECDSA P-256 here, RSA there), valid until 2126; its key was thrown away.
const SNAKEOIL_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBgDCCASagAwIBAgIUOO1ANYxn/v1Awqq8gsUvpUoYCGAwCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPcGcuZXhhbXBsZS50ZXN0MCAXDTI2MTEyNTExNTMyN1oYDzIx
MjYxMTAxMTE1MzI3WjAaMRgwFgYDVQQDDA9wZy5leGFtcGxlLnRlc3QwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAASngj1GmHEd1AO6SH7o6EgHRppni9ekv8w90ltu
2VL7pPAgzzz/HMPAmfcO5sXjXrY1/DcR/wDxtu2+H0JdduwIo0gwRjAJBgNVHRME
AjAAMBoGA1UdEQQTMBGCD3BnLmV4YW1wbGUudGVzdDAdBgNVHQ4EFgQUTvpwb7Uu
scg8y/iWjaWRvAIvMVYwCgYIKoZIzj0EAwIDSAAwRQIgPze7X2U1mR6GgB1Wwm4e
d3/WeBlMVborE0JExHHdcYkCIQDXE6gqLuK/zYSQN2EAOTue4G8RX5nTDeMETRNM
GCwguw==
-----END CERTIFICATE-----
";

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

fn load(pairs: &[(&str, &str)], root: &Path) -> Result<PostgresTls, Vec<String>> {
    PostgresTrust::from_env(&env(pairs), root)
        .map(PostgresTls::new)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

fn extra_roots(tls: &PostgresTls) -> usize {
    match &tls.inner.trust {
        PostgresTrust::PlatformAnd(roots) => roots.len(),
        _ => 0,
    }
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("the temp directory is writable")
}

#[test]
fn without_settings_only_the_platform_roots_are_trusted() {
    let tls = load(&[], Path::new("/nowhere")).expect("no settings is valid");
    assert!(matches!(tls.inner.trust, PostgresTrust::Platform));
    assert!(!tls.trusts_any_certificate());
    assert_eq!(format!("{tls:?}"), "PostgresTls(platform roots)");
}

#[test]
fn a_root_certificate_file_is_read_relative_to_the_app_root() {
    // GIVEN a PEM bundle of two CAs in certs/ca.pem under the app root
    let dir = scratch();
    std::fs::create_dir(dir.path().join("certs")).expect("mkdir");
    std::fs::write(dir.path().join("certs/ca.pem"), format!("{CA_PEM}{CA_PEM}")).expect("write");
    // WHEN the setting names it by a relative path
    let tls = load(&[("Sql_Trigger_PostgresRootCertificate", "certs/ca.pem")], dir.path()).expect("valid");
    // THEN both certificates are trusted, besides the platform's
    assert_eq!(extra_roots(&tls), 2);
    assert_eq!(format!("{tls:?}"), "PostgresTls(platform roots and 2 more)");
}

#[test]
fn a_root_certificate_may_be_the_pem_text_itself_even_with_escaped_newlines() {
    let tls = load(&[("Sql_Trigger_PostgresRootCertificate", CA_PEM)], Path::new("/nowhere")).expect("valid");
    assert_eq!(extra_roots(&tls), 1);
    let one_line = CA_PEM.replace('\n', "\\n");
    let tls = load(&[("Sql_Trigger_PostgresRootCertificate", &one_line)], Path::new("/nowhere")).expect("valid");
    assert_eq!(extra_roots(&tls), 1);
}

#[test]
fn a_missing_file_names_the_setting_and_the_path() {
    let errors = load(&[("Sql_Trigger_PostgresRootCertificate", "/no/such/ca.pem")], Path::new("/app"))
        .expect_err("a missing file is an error");
    assert_eq!(
        errors,
        ["app setting Sql_Trigger_PostgresRootCertificate: cannot read /no/such/ca.pem (No such file or directory \
          (os error 2)); give the path of a PEM file (absolute, or relative to the app root) or the PEM text itself"]
    );
}

#[test]
fn a_file_without_a_certificate_says_how_to_convert_one() {
    let dir = scratch();
    std::fs::write(dir.path().join("ca.cer"), [0x30, 0x82, 0x01, 0x00]).expect("write");
    let errors =
        load(&[("Sql_Trigger_PostgresRootCertificate", "ca.cer")], dir.path()).expect_err("DER is not accepted");
    assert_eq!(
        errors,
        [format!(
            "app setting Sql_Trigger_PostgresRootCertificate: {} holds no certificate (-----BEGIN CERTIFICATE-----); \
             convert a DER file with `openssl x509 -inform der -in ca.cer -out ca.pem`",
            dir.path().join("ca.cer").display()
        )]
    );
}

#[test]
fn a_pem_block_that_is_not_a_certificate_is_refused() {
    let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let errors = load(&[("Sql_Trigger_PostgresRootCertificate", broken)], Path::new("/app")).expect_err("refused");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with(
            "app setting Sql_Trigger_PostgresRootCertificate: certificate 1 in the PEM text cannot be a trusted root"
        ),
        "{errors:?}"
    );
}

#[test]
fn trust_server_certificate_accepts_only_true_or_false() {
    let tls = load(&[("Sql_Trigger_PostgresTrustServerCertificate", "TRUE")], Path::new("/app")).expect("valid");
    assert!(tls.trusts_any_certificate());
    assert_eq!(format!("{tls:?}"), "PostgresTls(any certificate)");
    let tls = load(&[("Sql_Trigger_PostgresTrustServerCertificate", "false")], Path::new("/app")).expect("valid");
    assert!(!tls.trusts_any_certificate());
    let errors =
        load(&[("Sql_Trigger_PostgresTrustServerCertificate", "yes")], Path::new("/app")).expect_err("invalid");
    assert_eq!(errors, ["app setting Sql_Trigger_PostgresTrustServerCertificate: must be true or false, got \"yes\""]);
}

#[test]
fn trusting_any_certificate_and_naming_a_root_at_once_is_refused() {
    let errors = load(
        &[("Sql_Trigger_PostgresTrustServerCertificate", "true"), ("Sql_Trigger_PostgresRootCertificate", CA_PEM)],
        Path::new("/app"),
    )
    .expect_err("contradictory");
    assert_eq!(
        errors,
        ["app setting Sql_Trigger_PostgresTrustServerCertificate: is true, which verifies no certificate, so \
          Sql_Trigger_PostgresRootCertificate would be ignored: set only one of them"]
    );
}

#[test]
fn every_trust_builds_a_client_config_that_offers_the_postgresql_alpn() {
    for pairs in [
        &[][..],
        &[("Sql_Trigger_PostgresRootCertificate", CA_PEM)][..],
        &[("Sql_Trigger_PostgresTrustServerCertificate", "true")][..],
    ] {
        let tls = load(pairs, Path::new("/app")).expect("valid");
        match tls.built() {
            Ok(built) => assert_eq!(built.config.alpn_protocols, [b"postgresql".to_vec()]),
            // A machine without any CA certificate: the platform-only trust cannot be built, and says why.
            Err(Problem::NoRoots(_)) if pairs.is_empty() => {}
            Err(other) => panic!("{pairs:?}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Channel binding
// ---------------------------------------------------------------------------------------------------------------

/// A certificate's outline: `SEQUENCE { SEQUENCE {}, SEQUENCE { OID }, BIT STRING {} }`.
fn outline(oid: &[u8]) -> Vec<u8> {
    let algorithm = [&[0x30, oid.len() as u8 + 2, 0x06, oid.len() as u8][..], oid].concat();
    let body = [&[0x30, 0x00][..], &algorithm, &[0x03, 0x00]].concat();
    [&[0x30, body.len() as u8][..], &body].concat()
}

#[test]
fn the_end_point_hash_follows_the_signature_algorithm() {
    let rsa = |n: u8| [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, n];
    let ecdsa = |n: u8| [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, n];
    let cases: [(&str, Vec<u8>, Option<usize>); 11] = [
        ("md5WithRSAEncryption", rsa(4).to_vec(), Some(32)),
        ("sha1WithRSAEncryption", rsa(5).to_vec(), Some(32)),
        ("sha256WithRSAEncryption", rsa(11).to_vec(), Some(32)),
        ("sha384WithRSAEncryption", rsa(12).to_vec(), Some(48)),
        ("sha512WithRSAEncryption", rsa(13).to_vec(), Some(64)),
        ("ecdsa-with-SHA1", vec![0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01], Some(32)),
        ("ecdsa-with-SHA256", ecdsa(2).to_vec(), Some(32)),
        ("ecdsa-with-SHA384", ecdsa(3).to_vec(), Some(48)),
        ("ecdsa-with-SHA512", ecdsa(4).to_vec(), Some(64)),
        ("RSASSA-PSS (hash in its parameters)", rsa(10).to_vec(), None),
        ("Ed25519", vec![0x2b, 0x65, 0x70], None),
    ];
    for (name, oid, expected) in cases {
        let cert = outline(&oid);
        let hash = tls_server_end_point(&cert);
        assert_eq!(hash.as_ref().map(Vec::len), expected, "{name}");
        if let Some(hash) = hash {
            let again = match expected {
                Some(48) => Sha384::digest(&cert).to_vec(),
                Some(64) => Sha512::digest(&cert).to_vec(),
                _ => Sha256::digest(&cert).to_vec(),
            };
            assert_eq!(hash, again, "{name}: the hash is of the whole certificate");
        }
    }
}

#[test]
fn a_real_certificate_yields_its_signature_algorithm() {
    let cert = CertificateDer::from_pem_slice(CA_PEM.as_bytes()).expect("PEM");
    assert_eq!(signature_algorithm(&cert), Some(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02][..]));
    assert_eq!(tls_server_end_point(&cert), Some(Sha256::digest(&cert).to_vec()));
}

#[test]
fn a_truncated_or_foreign_encoding_yields_no_binding() {
    let cert = outline(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]);
    for cut in 0..cert.len() {
        assert_eq!(tls_server_end_point(&cert[..cut]), None, "cut at {cut}");
    }
    assert_eq!(tls_server_end_point(b"not a certificate"), None);
    // Long-form lengths: 0x81 (one length byte) parses; 0x80 (indefinite, not DER) does not.
    assert_eq!(der(&[0x04, 0x81, 0x02, 0xaa, 0xbb, 0xcc]), Some((0x04, &[0xaa, 0xbb][..], &[0xcc][..])));
    assert_eq!(der(&[0x04, 0x80, 0x00]), None);
}

// ---------------------------------------------------------------------------------------------------------------
// Handshake errors
// ---------------------------------------------------------------------------------------------------------------

fn error(problem: Problem) -> HandshakeError {
    HandshakeError { host: "db.example.com".into(), problem }
}

fn from_rustls(e: CertificateError) -> Problem {
    Problem::from_io(io::Error::new(io::ErrorKind::InvalidData, rustls::Error::InvalidCertificate(e)))
}

/// What every refused certificate's message ends with.
const OTHER_WAYS_OUT: &str = "(2) sslmode=disable in the connection string, where plaintext is acceptable (a local \
    server, a trusted network); (3) app setting Sql_Trigger_PostgresTrustServerCertificate=true, which encrypts \
    without verifying the certificate (for development only)";

fn snakeoil() -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(SNAKEOIL_PEM.as_bytes()).expect("PEM")
}

fn server_name(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_string()).expect("a server name")
}

#[test]
fn a_certificate_is_asked_whether_it_lists_the_host_name_and_which_names_it_lists() {
    assert_eq!(Listed::of(&snakeoil(), &server_name("pg.example.test")), Listed::Host);
    assert_eq!(Listed::of(&snakeoil(), &server_name("127.0.0.1")), Listed::Others(vec!["pg.example.test".into()]));
    let ca = CertificateDer::from_pem_slice(CA_PEM.as_bytes()).expect("PEM");
    assert_eq!(Listed::of(&ca, &server_name("db.example.com")), Listed::Others(vec![]), "no subjectAltName");
    assert_eq!(Listed::of(&CertificateDer::from(vec![0x30, 0x00]), &server_name("db")), Listed::Unknown);
}

#[test]
fn a_self_signed_certificate_reached_by_address_names_every_way_out() {
    // GIVEN Debian's snakeoil case: a certificate nobody trusts, for a name, reached at 127.0.0.1
    let e = HandshakeError {
        host: "127.0.0.1".into(),
        problem: Problem::Untrusted { listed: Listed::Others(vec!["pg.example.test".into()]), roots_given: false },
    };
    // THEN trusting it is not enough without a name it lists, and the other ways out are named too
    assert!(e.needs_operator());
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of PostgreSQL server 127.0.0.1 is not signed by a certificate authority this handler \
             trusts; certificates are verified whenever TLS is used, with the default sslmode=prefer too. Ways out: \
             (1) set app setting Sql_Trigger_PostgresRootCertificate to the certificate of the CA that signed it, a \
             PEM file or the PEM text (for a self-signed certificate, the certificate itself; Debian's and Ubuntu's \
             is /etc/ssl/certs/ssl-cert-snakeoil.pem), and connect with a host name it lists (pg.example.test) \
             rather than 127.0.0.1 (hostaddr=127.0.0.1 keeps dialling that address); {OTHER_WAYS_OUT}"
        )
    );
}

#[test]
fn an_untrusted_certificate_for_the_host_name_needs_only_its_ca() {
    let e = error(Problem::Untrusted { listed: Listed::Host, roots_given: false });
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of PostgreSQL server db.example.com is not signed by a certificate authority this \
             handler trusts; certificates are verified whenever TLS is used, with the default sslmode=prefer too. \
             Ways out: (1) set app setting Sql_Trigger_PostgresRootCertificate to the certificate of the CA that \
             signed it, a PEM file or the PEM text (for a self-signed certificate, the certificate itself; Debian's \
             and Ubuntu's is /etc/ssl/certs/ssl-cert-snakeoil.pem); {OTHER_WAYS_OUT}"
        )
    );
}

#[test]
fn an_untrusted_certificate_says_when_the_given_roots_did_not_sign_it_and_what_it_lacks() {
    let e = error(Problem::Untrusted { listed: Listed::Others(vec![]), roots_given: true });
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of PostgreSQL server db.example.com is not signed by a certificate authority this \
             handler trusts; certificates are verified whenever TLS is used, with the default sslmode=prefer too. \
             Ways out: (1) add the certificate of the CA that signed it to app setting \
             Sql_Trigger_PostgresRootCertificate, which holds no CA that did (for a self-signed certificate, the \
             certificate itself; Debian's and Ubuntu's is /etc/ssl/certs/ssl-cert-snakeoil.pem), and reissue it \
             with db.example.com in its subjectAltName (it lists no name there; the common name is not used); \
             {OTHER_WAYS_OUT}"
        )
    );
    // rustls's own error carries no certificate: the handshake fills in what it lists.
    assert!(matches!(
        from_rustls(CertificateError::UnknownIssuer),
        Problem::Untrusted { listed: Listed::Unknown, roots_given: false }
    ));
    let unknown = error(Problem::Untrusted { listed: Listed::Unknown, roots_given: false }).to_string();
    assert!(
        unknown.contains(
            "and connect with a host name its subjectAltName lists (hostaddr= can give the address to dial); (2)"
        ),
        "{unknown}"
    );
}

#[test]
fn a_host_name_mismatch_lists_the_names_the_certificate_has_and_every_way_out() {
    let e = error(from_rustls(CertificateError::NotValidForNameContext {
        expected: ServerName::try_from("db.example.com").expect("name").to_owned(),
        presented: vec!["DnsName(\"localhost\")".into(), "IpAddress(127.0.0.1)".into()],
    }));
    assert!(e.needs_operator());
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of PostgreSQL server db.example.com is not valid for the name db.example.com (it is \
             for localhost, 127.0.0.1). Ways out: (1) connect with a host name the certificate lists (hostaddr= can \
             give the address to dial), or reissue it with db.example.com in its subjectAltName; {OTHER_WAYS_OUT}"
        )
    );
    let e = error(from_rustls(CertificateError::NotValidForName));
    assert_eq!(
        e.to_string(),
        format!(
            "the certificate of PostgreSQL server db.example.com is not valid for the name db.example.com: it lists \
             no name in its subjectAltName (the common name is not used). Ways out: (1) reissue it with \
             db.example.com in its subjectAltName; {OTHER_WAYS_OUT}"
        )
    );
}

#[test]
fn dates_and_revocation_are_named() {
    let expired = error(from_rustls(CertificateError::Expired));
    assert_eq!(
        expired.to_string(),
        "the certificate of PostgreSQL server db.example.com has expired: renew it on the server (or check this \
         machine's clock)"
    );
    assert!(matches!(from_rustls(CertificateError::NotValidYet), Problem::NotValidYet));
    assert!(matches!(from_rustls(CertificateError::Revoked), Problem::Revoked));
    assert!(matches!(from_rustls(CertificateError::BadSignature), Problem::Rejected(_)));
}

#[test]
fn a_broken_off_handshake_is_not_an_operator_problem() {
    let e = error(Problem::from_io(io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof")));
    assert!(!e.needs_operator());
    assert_eq!(e.to_string(), "the TLS handshake with PostgreSQL server db.example.com failed: tls handshake eof");
}
