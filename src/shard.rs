//! `--shard K/N`: the K-th of N interleaved parts of a list of jobs, so that the tasks of a
//! cluster's job array split a grid between them (`reproduce`, `synthetic-sweep`).

/// The K-th (1-based) of N interleaved parts of a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobShard {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for JobShard {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let parsed = s
            .split_once('/')
            .and_then(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)));
        match parsed {
            Some((index, count)) if count >= 1 && (1..=count).contains(&index) => {
                Ok(Self { index, count })
            }
            _ => Err(format!("expected K/N with 1 ≤ K ≤ N, got {s:?}")),
        }
    }
}

impl JobShard {
    /// Whether the job at `position` (0-based) of the list is this part's.
    pub fn keeps(&self, position: usize) -> bool {
        position % self.count == self.index - 1
    }
}
