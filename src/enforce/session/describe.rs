//! What a Describe watches: the RowDescription of a rewritten statement
//! loses the head column.

use std::sync::Arc;

use super::{Binding, Prepared, SessionEnforcer};
use crate::enforce::watch::Watch;

pub(super) fn statement(_session: &mut SessionEnforcer, statement: &Prepared) -> Option<Watch> {
    // A rewritten statement's RowDescription loses the head column.
    statement
        .rewritten
        .then(|| Watch::new(Arc::clone(&statement.class), None, true))
}

pub(super) fn portal(_session: &mut SessionEnforcer, portal: Option<&Binding>) -> Option<Watch> {
    let b = portal.filter(|b| b.rewritten)?;
    Some(Watch::new(Arc::clone(&b.class), None, true))
}
