//! A ParameterStatus the server reports: a changed application_name, and
//! a session seen carrying several clients; the encodings it converts
//! between.

use super::SessionEnforcer;

pub(super) fn handle(session: &mut SessionEnforcer, name: &[u8], value: &[u8]) {
    session.encodings.reported(name, value);
    if name == b"application_name" {
        let to = String::from_utf8_lossy(value).into_owned();
        if session.shared.legs.claims.is_some() {
            session
                .shared_session
                .application_name(&session.ctx.application_name, &to);
        }
        session.ctx.application_name = to;
    }
}
