//! The configuration `serve` runs with, read the same way at start, by
//! `config check` and `config show`, and again at each reload.

use resumeguard::config::{Layered, Loader};

/// The configuration `serve` runs with, from `loader`.
pub fn load_for_serve(loader: &Loader) -> anyhow::Result<Layered> {
    Ok(loader.load()?.for_serve())
}

/// Says which `RESUMEGUARD_*` variables name no key (a typo is not taken
/// silently).
pub fn warn_unknown(layered: &Layered) {
    for var in &layered.unknown_env {
        tracing::warn!(
            variable = %var,
            "environment variable is no configuration key (RESUMEGUARD_<SECTION>_<KEY>); ignored"
        );
    }
}
