//! The command line the benchmark harness gives every proxy it measures
//! (`serve --listen HOST:PORT --upstream HOST:PORT` and resumeguard's own
//! arguments), read by the baseline relays, which ignore what they do not
//! use.

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
