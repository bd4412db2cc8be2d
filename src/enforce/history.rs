//! The delta-channel history read returns the writes of the channels its
//! parameters name, on checkpoints the fork filter never sees. LangGraph
//! only names state channels there; a Bind naming a channel the legs read
//! (`__interrupt__`, `__resume__`, `__error__`, `__scheduled__`) would
//! hand out interrupt answers past the fork filter, so it is refused.

use crate::saver::bind::BoundParams;
use crate::saver::classify::StatementKind;
use crate::saver::reserved::{ERROR, INTERRUPT, RESUME, SCHEDULED};
use crate::saver::value::ColumnKind;
use crate::wire::tracker::{Refusal, FEATURE_NOT_SUPPORTED};

/// The channels whose writes only the checkpoint read may return.
const GUARDED: [&str; 4] = [INTERRUPT, RESUME, ERROR, SCHEDULED];

/// The refusal of a channel-history read naming a guarded channel, or one
/// whose channel parameter does not decode as text (fail closed).
pub fn history_refusal(kind: &StatementKind, bound: &BoundParams) -> Option<Refusal> {
    let StatementKind::ChannelHistoryRead { channel_params } = kind else {
        return None;
    };
    let refuse = |why: String| Refusal {
        sqlstate: FEATURE_NOT_SUPPORTED,
        message: format!("resumeguard: channel history read refused: {why}"),
        detail: "only the checkpoint read returns interrupt, resume, error and schedule writes \
                 (the fork filter applies there)"
            .into(),
    };
    for &param in channel_params {
        match bound.value(param, ColumnKind::Text) {
            Ok(value) => match value.as_str() {
                Some(channel) if GUARDED.contains(&channel) => {
                    return Some(refuse(format!("it names channel {channel}")))
                }
                Some(_) => {}
                None => return Some(refuse(format!("parameter ${} is NULL", param + 1))),
            },
            Err(e) => return Some(refuse(format!("parameter ${}: {e}", param + 1))),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(values: &[&str]) -> BoundParams {
        BoundParams {
            portal: String::new(),
            statement: String::new(),
            param_formats: Vec::new(),
            params: values
                .iter()
                .map(|v| Some(bytes::Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
            result_formats: Vec::new(),
        }
    }

    #[test]
    fn a_state_channel_passes_and_a_guarded_one_is_refused() {
        let kind = StatementKind::ChannelHistoryRead {
            channel_params: vec![2, 6],
        };
        let ok = bound(&["t", "", "messages", "{a}", "t", "", "files"]);
        assert_eq!(history_refusal(&kind, &ok), None);
        let bad = bound(&["t", "", "messages", "{a}", "t", "", "__resume__"]);
        let refusal = history_refusal(&kind, &bad).expect("refused");
        assert_eq!(refusal.sqlstate, FEATURE_NOT_SUPPORTED);
        assert!(
            refusal.message.contains("__resume__"),
            "{}",
            refusal.message
        );
        let missing = bound(&["t", "", "messages"]);
        assert!(history_refusal(&kind, &missing).is_some(), "fails closed");
        assert_eq!(history_refusal(&StatementKind::WritesRead, &bad), None);
    }
}
