//! `reproduce slurm`: a ready Slurm job-array script. Task K of N runs `reproduce <experiment>
//! --shard K/N` into its own folder; `reproduce report` then merges the folders.

use std::path::{Path, PathBuf};

pub struct SlurmScript {
    /// The command's arguments after `reproduce <experiment>`, without --out and --shard.
    pub experiment: String,
    pub grid_args: Vec<String>,
    pub shards: usize,
    pub out: PathBuf,
    pub binary: PathBuf,
    pub time: String,
    pub cpus_per_task: usize,
    pub mem: String,
    pub partition: Option<String>,
    /// Exported into the tasks when set here (the data, models and cache folders).
    pub env: Vec<(String, String)>,
}

/// `s` as one word of a POSIX shell command line: as it is when it has nothing the shell reads
/// specially, else single-quoted.
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./,:=@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl SlurmScript {
    /// The commands that submit the script at `path` and then merge its shards' reports, each
    /// word quoted for the shell (paths with spaces paste as they are).
    pub fn hint(&self, path: &Path) -> String {
        let (binary, out) = (
            self.binary.display().to_string(),
            self.out.display().to_string(),
        );
        format!(
            "submit with `sbatch {}`; then merge with `{} reproduce report {}/shard-* --out {}`",
            quote(&path.display().to_string()),
            quote(&binary),
            quote(&out),
            quote(&format!("{out}/report"))
        )
    }

    pub fn render(&self) -> String {
        let out = self.out.display().to_string();
        let mut s = String::new();
        s.push_str("#!/bin/bash\n");
        s.push_str(&format!("#SBATCH --job-name=benign-{}\n", self.experiment));
        s.push_str(&format!("#SBATCH --array=1-{}\n", self.shards));
        s.push_str(&format!("#SBATCH --cpus-per-task={}\n", self.cpus_per_task));
        s.push_str(&format!("#SBATCH --mem={}\n", self.mem));
        s.push_str(&format!("#SBATCH --time={}\n", self.time));
        if let Some(p) = &self.partition {
            s.push_str(&format!("#SBATCH --partition={}\n", quote(p)));
        }
        s.push_str(&format!(
            "#SBATCH --output={}/logs/%A_%a.out\n",
            quote(&out)
        ));
        s.push_str(
            "# Written by `benign-attention reproduce slurm`. Submit with sbatch; when every\n",
        );
        s.push_str("# task is done, merge the shards into one report:\n");
        s.push_str(&format!(
            "#   {} reproduce report {}/shard-* --out {}/report\n",
            quote(&self.binary.display().to_string()),
            quote(&out),
            quote(&out)
        ));
        s.push_str("set -euo pipefail\n");
        for (k, v) in &self.env {
            s.push_str(&format!("export {k}={}\n", quote(v)));
        }
        s.push_str("export RAYON_NUM_THREADS=\"${SLURM_CPUS_PER_TASK:-1}\"\n");
        let mut command = vec![
            quote(&self.binary.display().to_string()),
            "reproduce".into(),
            self.experiment.clone(),
        ];
        command.extend(self.grid_args.iter().map(|a| quote(a)));
        command.push("--out".into());
        command.push(format!("{}/shard-\"$SLURM_ARRAY_TASK_ID\"", quote(&out)));
        command.push("--shard".into());
        command.push(format!("\"$SLURM_ARRAY_TASK_ID\"/{}", self.shards));
        s.push_str(&command.join(" "));
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_tasks_call_their_shard() {
        let script = SlurmScript {
            experiment: "table2".into(),
            grid_args: vec![
                "--budget".into(),
                "quick".into(),
                "--datasets".into(),
                "trec,mnist".into(),
            ],
            shards: 8,
            out: PathBuf::from("/scratch/me/t2"),
            binary: PathBuf::from("/opt/benign-attention"),
            time: "12:00:00".into(),
            cpus_per_task: 4,
            mem: "16G".into(),
            partition: Some("gpu".into()),
            env: vec![("BENIGN_DATA_DIR".into(), "/data/x y".into())],
        }
        .render();
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains("#SBATCH --array=1-8\n"));
        assert!(script.contains("export BENIGN_DATA_DIR='/data/x y'\n"));
        assert!(script.contains(
            "/opt/benign-attention reproduce table2 --budget quick --datasets trec,mnist --out /scratch/me/t2/shard-\"$SLURM_ARRAY_TASK_ID\" --shard \"$SLURM_ARRAY_TASK_ID\"/8\n"
        ));
        assert!(
            script.contains("reproduce report /scratch/me/t2/shard-* --out /scratch/me/t2/report")
        );
    }
}
