//! The standard Prometheus process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), read from `/proc/self` at scrape time on
//! Linux, as the official clients do; elsewhere none are shown. The
//! exporter crate offers none of them.

/// Appends the process metrics to `out` in the exposition format; a value
/// that cannot be read is left out (and said at DEBUG).
pub fn render(out: &mut String) {
    #[cfg(target_os = "linux")]
    match linux::read() {
        Ok(p) => p.render(out),
        Err(e) => tracing::debug!(error = %e, "process metrics not read from /proc"),
    }
    #[cfg(not(target_os = "linux"))]
    let _ = out;
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{self, ErrorKind};

    /// What one scrape read of the process.
    pub(super) struct Process {
        cpu_seconds: f64,
        resident_bytes: u64,
        open_fds: u64,
        max_fds: Option<u64>,
        start_time_seconds: f64,
    }

    impl Process {
        pub(super) fn render(&self, out: &mut String) {
            let mut put = |name: &str, kind: &str, help: &str, value: String| {
                super::super::sample(out, name, kind, help, value)
            };
            put(
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds",
                self.cpu_seconds.to_string(),
            );
            put(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes",
                self.resident_bytes.to_string(),
            );
            put(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors",
                self.open_fds.to_string(),
            );
            if let Some(max) = self.max_fds {
                put(
                    "process_max_fds",
                    "gauge",
                    "Maximum number of open file descriptors (the soft limit)",
                    max.to_string(),
                );
            }
            put(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since the Unix epoch in seconds",
                self.start_time_seconds.to_string(),
            );
        }
    }

    fn bad(what: &str) -> io::Error {
        io::Error::new(ErrorKind::InvalidData, format!("/proc: {what}"))
    }

    /// `sysconf(name)`, if the system answers.
    fn sysconf(name: libc::c_int) -> Option<u64> {
        // SAFETY: sysconf(3) reads a configuration value; no memory is
        // passed.
        let v = unsafe { libc::sysconf(name) };
        u64::try_from(v).ok().filter(|v| *v > 0)
    }

    pub(super) fn read() -> io::Result<Process> {
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        let boot = std::fs::read_to_string("/proc/stat")?;
        let open_fds = std::fs::read_dir("/proc/self/fd")?.count() as u64;
        let ticks = sysconf(libc::_SC_CLK_TCK).ok_or_else(|| bad("no clock tick rate"))?;
        let page = sysconf(libc::_SC_PAGESIZE).ok_or_else(|| bad("no page size"))?;
        parse(&stat, &boot, ticks, page).map(|(cpu_seconds, resident_bytes, start)| Process {
            cpu_seconds,
            resident_bytes,
            open_fds,
            max_fds: crate::fd_limit::nofile().ok().map(|(soft, _)| soft),
            start_time_seconds: start,
        })
    }

    /// CPU seconds, resident bytes and start time (seconds since the
    /// epoch) from `/proc/self/stat` and `/proc/stat`'s `btime`.
    pub(super) fn parse(
        stat: &str,
        boot: &str,
        ticks: u64,
        page: u64,
    ) -> io::Result<(f64, u64, f64)> {
        // The command name (field 2) is in parentheses and may hold
        // spaces; the fields after it start at field 3 (state).
        let after = stat
            .rfind(')')
            .map(|i| &stat[i + 1..])
            .ok_or_else(|| bad("stat without a command name"))?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |n: usize| -> io::Result<u64> {
            fields
                .get(n - 3)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| bad(&format!("stat field {n}")))
        };
        let (utime, stime, start, rss) = (field(14)?, field(15)?, field(22)?, field(24)?);
        let btime: u64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("stat without btime"))?;
        let ticks = ticks as f64;
        Ok((
            (utime + stime) as f64 / ticks,
            rss * page,
            btime as f64 + start as f64 / ticks,
        ))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stat_fields_are_read_after_the_command_name() {
            // A command name with a space and a parenthesis in it.
            let stat = "4242 (rg (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                        9 0 1000 123456789 2048 18446744073709551615";
            let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
            let (cpu, rss, start) = parse(stat, boot, 100, 4096).unwrap();
            assert_eq!(cpu, 3.0);
            assert_eq!(rss, 2048 * 4096);
            assert_eq!(start, 1_700_000_010.0);
            assert!(parse("4242 rg S", boot, 100, 4096).is_err());
        }

        #[test]
        fn this_process_is_read() {
            let p = read().unwrap();
            assert!(p.resident_bytes > 0 && p.open_fds > 0 && p.start_time_seconds > 1e9);
        }
    }
}
