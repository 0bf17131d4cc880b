//! This process's CPU time and peak memory, from /proc.

/// User + system CPU seconds so far (this process's threads, not its children).
pub fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| parse_stat(&stat))
        .map_or(0.0, |stat| stat.cpu_seconds)
}

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stat {
    /// Its pid.
    pub pid: u32,
    /// Its parent's pid.
    pub ppid: u32,
    /// Its command name (`comm`, at most 15 bytes).
    pub comm: String,
    /// utime + stime, seconds: its own threads'.
    pub cpu_seconds: f64,
    /// cutime + cstime, seconds: its children's that have exited and that it reaped (a
    /// PostgreSQL backend that ended during the run is in its postmaster's).
    pub reaped_cpu_seconds: f64,
}

/// Every process this one can see, as `/proc` lists them now.
pub fn all() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| parse_stat(&stat))
        .collect()
}

/// CPU seconds of the processes `roots` and of all their descendants, the children they
/// reaped included; a root that is also a descendant of another counts once.
pub fn tree_cpu_seconds(processes: &[Stat], roots: &[u32]) -> f64 {
    let mut members: Vec<u32> = roots.to_vec();
    // Parents first is not guaranteed by /proc's order: repeat until nothing is added.
    loop {
        let before = members.len();
        for process in processes {
            if members.contains(&process.ppid) && !members.contains(&process.pid) {
                members.push(process.pid);
            }
        }
        if members.len() == before {
            break;
        }
    }
    processes
        .iter()
        .filter(|process| members.contains(&process.pid))
        .map(|process| process.cpu_seconds + process.reaped_cpu_seconds)
        .sum()
}

/// A `/proc/<pid>/stat` line: pid, command name, parent, CPU times.
fn parse_stat(stat: &str) -> Option<Stat> {
    // The command name (which may contain spaces and parentheses) is between the first
    // '(' and the last ')'; the other fields follow it.
    let (head, rest) = stat.rsplit_once(')')?;
    let (pid, comm) = head.split_once('(')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |index: usize| fields.get(index).and_then(|f| f.parse::<f64>().ok());
    // After the name: state (field 3 of the whole line) is index 0, ppid (4) index 1,
    // utime, stime, cutime, cstime (14–17) indexes 11–14; in clock ticks of 1/100 s.
    Some(Stat {
        pid: pid.trim().parse().ok()?,
        ppid: fields.get(1)?.parse().ok()?,
        comm: comm.to_owned(),
        cpu_seconds: (number(11)? + number(12)?) / 100.0,
        reaped_cpu_seconds: (number(13)? + number(14)?) / 100.0,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, cpu: f64, reaped: f64) -> Stat {
        Stat {
            pid,
            ppid,
            comm: "postgres".into(),
            cpu_seconds: cpu,
            reaped_cpu_seconds: reaped,
        }
    }

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "2248 (postgres: a (b) c) S 1 2248 2248 0 -1 4194560 1 2 3 4 \
                    150 25 7 3 20 0 1 0 100 1000 10";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.pid, 2248);
        assert_eq!(stat.ppid, 1);
        assert_eq!(stat.comm, "postgres: a (b) c");
        assert!((stat.cpu_seconds - 1.75).abs() < 1e-9);
        assert!((stat.reaped_cpu_seconds - 0.10).abs() < 1e-9);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_tree_is_its_roots_and_every_descendant_once() {
        // 10 → 11 → 12 (listed before its parent), 20 apart, 11 also given as a root.
        let processes = [
            stat(12, 11, 4.0, 0.0),
            stat(10, 1, 1.0, 0.5),
            stat(11, 10, 2.0, 0.0),
            stat(20, 1, 100.0, 0.0),
        ];
        assert!((tree_cpu_seconds(&processes, &[10, 11]) - 7.5).abs() < 1e-9);
        assert!((tree_cpu_seconds(&processes, &[20]) - 100.0).abs() < 1e-9);
        assert_eq!(tree_cpu_seconds(&processes, &[]), 0.0);
    }
}
