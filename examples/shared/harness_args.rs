//! The command line the benchmark harness gives every proxy it measures
//! (`serve --listen HOST:PORT --upstream HOST:PORT` and resumeguard's own
//! arguments), read by the baseline relays, which ignore what they do not
//! use, and the listener each binds from it.

/// The value after `--name`, if given.
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// `--listen` and `--upstream`; without both, the usage line and exit 2.
pub fn listen_and_upstream(usage: &str) -> (String, String) {
    match (flag("--listen"), flag("--upstream")) {
        (Some(listen), Some(upstream)) => (listen, upstream),
        _ => {
            eprintln!("usage: {usage}");
            std::process::exit(2);
        }
    }
}

/// The listener on `listen`; if it cannot bind, `program`'s complaint and
/// exit 1.
pub fn listener(program: &str, listen: &str) -> std::net::TcpListener {
    match std::net::TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{program}: listening on {listen}: {e}");
            std::process::exit(1);
        }
    }
}
