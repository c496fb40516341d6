//! A CPU quota for one process, through the host's cgroup `cpu` controller (v2 `cpu.max`, or
//! v1 `cpu.cfs_quota_us`), so a benchmark can give each replica the CPU of a small host of
//! its own while they share one machine. Needs write access to the cgroup tree (root in a
//! container usually has it); without it the caller is told so, nothing is faked.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The scheduler period the quota is a share of, in microseconds.
const PERIOD_US: u64 = 100_000;

/// A cgroup holding one process at a CPU quota; removed when dropped (once it is empty).
#[derive(Debug)]
pub struct CpuLimit {
    dir: PathBuf,
}

impl CpuLimit {
    /// Puts process `pid` in a new cgroup named `name`, limited to `cores` cores.
    pub fn apply(name: &str, pid: u32, cores: f64) -> Result<CpuLimit> {
        if !(cores > 0.0 && cores.is_finite()) {
            bail!("a CPU quota wants a positive number of cores, not {cores}");
        }
        let quota = ((cores * PERIOD_US as f64).round() as u64).max(1_000);
        let v2 = Path::new("/sys/fs/cgroup");
        let controllers =
            std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        let (dir, limit_file, limit) = if controllers.split_whitespace().any(|c| c == "cpu") {
            (v2.join(name), "cpu.max", format!("{quota} {PERIOD_US}"))
        } else if Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
            (Path::new("/sys/fs/cgroup/cpu").join(name), "cpu.cfs_quota_us", quota.to_string())
        } else {
            bail!("this host has no cgroup cpu controller to limit a replica's CPU");
        };
        std::fs::create_dir_all(&dir).with_context(|| {
            format!("creating {} (needs write access to cgroups)", dir.display())
        })?;
        let limited = CpuLimit { dir };
        if limit_file == "cpu.cfs_quota_us" {
            std::fs::write(limited.dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
                .context("setting the cgroup's CPU period")?;
        }
        std::fs::write(limited.dir.join(limit_file), limit).context("setting the CPU quota")?;
        std::fs::write(limited.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving process {pid} into its cgroup"))?;
        Ok(limited)
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // Empty once its process exited; a cgroup directory is removed with rmdir.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
