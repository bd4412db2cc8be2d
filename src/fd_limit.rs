//! The process's limit on open file descriptors (RLIMIT_NOFILE). Each
//! client session holds two (its socket and its server's), so the soft
//! limit services are often started with (1024) would stop the proxy near
//! 500 sessions, below `max_client_conn`: `serve` raises it to the hard
//! limit at start, as Go's runtime and many servers do. The admin listener
//! sizes its share of descriptors by it.

use std::io;

/// The soft and the hard limit.
pub fn nofile() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit into the struct it is given,
    // which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // rlim_t is u64 here, narrower on some 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    Ok((limit.rlim_cur as u64, limit.rlim_max as u64))
}

/// Raises the soft limit to the hard one. The soft limit before and after.
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let (soft, hard) = nofile()?;
    if soft >= hard {
        return Ok((soft, soft));
    }
    let raised = libc::rlimit {
        rlim_cur: hard as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit(2) only reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((soft, hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_at_most_the_hard_one_and_raising_reaches_it() {
        let (soft, hard) = nofile().unwrap();
        assert!(soft <= hard, "{soft} > {hard}");
        let (before, after) = raise_nofile().unwrap();
        assert_eq!(before, soft);
        assert_eq!(after, hard);
        assert_eq!(nofile().unwrap(), (hard, hard));
    }
}
