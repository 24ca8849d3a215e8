//! The secret checks every target shares: no output holds a part of a secret the input carried. Called by the
//! connection string and configuration targets.

/// Characters no message template of this crate holds: a token made with one of them that shows up in a
/// message came from the input. Tokens without one (`host`, `Password`) may be words of the message itself.
fn distinctive(token: &str) -> bool {
    token.chars().count() >= 4
        && token.chars().any(|c| matches!(c, '~' | '!' | '^' | '*' | '|' | '<' | '>') || !c.is_ascii())
}

/// The distinctive tokens of `text`, split where connection-string syntax splits.
fn tokens(text: &str) -> Vec<&str> {
    text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '=' | ';'
                    | '&'
                    | '?'
                    | '/'
                    | ':'
                    | '@'
                    | '\''
                    | '"'
                    | ','
                    | '{'
                    | '}'
                    | '\\'
                    | '%'
                    | '('
                    | ')'
                    | '['
                    | ']'
            )
    })
    .filter(|t| distinctive(t))
    .collect()
}

/// Panics when `output` holds one of `secrets`' distinctive tokens. A token that `input` holds more than once
/// is skipped: the output may quote it from another place of the input, where it is no secret (a host name).
pub(super) fn assert_no_secret(what: &str, output: &str, secrets: &[&str], input: &str) {
    for secret in secrets {
        for token in tokens(secret).into_iter().filter(|t| input.matches(t).count() == 1) {
            assert!(!output.contains(token), "{what} holds {token:?}, part of a secret:\n{output}");
        }
    }
}

/// Panics when `output` holds one of `secrets` as it is.
pub(super) fn assert_no_secret_verbatim(what: &str, output: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!output.contains(secret), "{what} holds the secret {secret:?}:\n{output}");
    }
}
