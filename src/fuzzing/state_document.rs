//! The state and quarantine documents as a tick and the CLI read them.

use crate::engine::document::{QuarantineDoc, StateDoc};

/// The state and quarantine document readers (`serde_json` into the document types, as a tick and the CLI read
/// them): a document that reads back re-serializes, and reads back equal.
pub fn state_document(data: &[u8]) {
    // The handler's own reader (`document::read`: types, then the checks that refuse a hand edit).
    if let Ok(doc) = crate::engine::document::read(data) {
        let bytes =
            serde_json::to_vec(&doc).unwrap_or_else(|e| panic!("a state document that reads cannot be written: {e}"));
        let again: StateDoc = crate::engine::document::read(&bytes).unwrap_or_else(|e| {
            panic!("a state document written cannot be read: {e}\n{}", String::from_utf8_lossy(&bytes))
        });
        assert_eq!(again, doc, "the state document changed through a write and a read");
    }
    if let Ok(doc) = QuarantineDoc::read(data) {
        let text =
            serde_json::to_string(&doc).unwrap_or_else(|e| panic!("a quarantine document cannot be written: {e}"));
        let again = QuarantineDoc::read(text.as_bytes())
            .unwrap_or_else(|e| panic!("a quarantine document written cannot be read: {e}\n{text}"));
        let again_text = serde_json::to_string(&again).expect("written once, written again");
        assert_eq!(again_text, text, "the quarantine document changed through a write and a read");
        let _ = doc.decode_changes();
    }
}
