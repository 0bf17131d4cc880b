//! This process's CPU time and peak memory, from /proc.

/// User + system CPU seconds so far.
pub fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat").map_or(0.0, |stat| stat_cpu_seconds(&stat))
}

/// User + system CPU seconds so far of every process named `name` (a database server's).
pub fn cpu_seconds_of(name: &str) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| stat.contains(&format!("({name})")))
        .map(|stat| stat_cpu_seconds(&stat))
        .sum()
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds.
fn stat_cpu_seconds(stat: &str) -> f64 {
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Resets the peak resident set size (VmHWM) to the current one, so that the peak read
/// later covers only what follows (the relay's run, not the bench's own prefill).
pub fn reset_peak_rss() {
    // Linux ≥ 4.0: writing 5 to clear_refs resets VmHWM for this process.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set size in MiB (VmHWM) since the start or the last [`reset_peak_rss`].
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmHWM:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}
