//! What the proxy logs while a test runs a step, as text: tests of where
//! the guard must say it stopped guarding (an ERROR, once per streak)
//! read it. Only the calling thread's events are captured.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

/// The log lines `step` emits on this thread, every level, without colour.
pub fn captured<T>(step: impl FnOnce() -> T) -> (T, String) {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(lines.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, step);
    let text = lines.0.lock().unwrap_or_else(PoisonError::into_inner);
    (out, String::from_utf8_lossy(&text).into_owned())
}

/// The captured bytes, shared with the subscriber's writer.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}
