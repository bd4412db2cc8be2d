//! A claim's holder as the audit records it: the session a claim was
//! taken from, and the one whose answer a late duplicate repeats.

use serde::Serialize;

use crate::claims::Holder;

/// The holder's fields an audit event's detail names.
#[derive(Debug, Serialize)]
pub(super) struct HolderDetail<'a> {
    pub client_addr: &'a str,
    pub application_name: &'a str,
    pub proxy_id: &'a str,
    pub session_id: u64,
}

impl<'a> HolderDetail<'a> {
    pub fn of(h: &'a Holder) -> Self {
        HolderDetail {
            client_addr: &h.client_addr,
            application_name: &h.application_name,
            proxy_id: &h.proxy_id,
            session_id: h.session_id,
        }
    }
}
