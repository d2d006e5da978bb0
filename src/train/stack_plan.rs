//! How a grid's runs train together: runs that agree on everything but η and the seed
//! ([`RunConfig::stack_key`]) go into stacks, as large as a memory budget allows, and split so
//! that every worker has one (the grid's runs are independent, so any grouping gives each run its
//! own numbers, bit for bit; the grouping only decides the speed).
//!
//! A stack's memory beyond its backbone is estimated from the sizes phase 2 holds per run: the
//! fine-tune set's tokens (read, then normed: twice n·T·D floats) and the test set's when it is
//! held (at most [`RESIDENT_TEST_BYTES`]), each once per distinct set, and each run's query and
//! key with their gradient, AdamW's two moments and the look-ahead's copy (5 · 2D² floats).

use std::path::Path;

use anyhow::{Result, bail};

use crate::data::catalog::Modality;
use crate::encoder::layer_rows::MAX_OPEN_ROW_FILES;
use crate::train::phase2::query_key::RESIDENT_TEST_BYTES;
use crate::train::run::{FinetuneJob, RunConfig};

/// `--stack-memory`'s default, in GiB: what one stack's phase 2 may hold beyond its backbone.
pub const STACK_MEMORY_GIB: f64 = 4.0;

/// Memory kept aside beyond the estimate: the backbone's working buffers while it extracts, and
/// phase 1.
const RESERVE_BYTES: f64 = (512u64 << 20) as f64;

/// Descriptors kept aside beyond the runs' own: the cache's shards (shared by every run, at most
/// [`MAX_OPEN_ROW_FILES`] open at once), and 32 for the backbone's files, the standard streams,
/// a checkpoint being written and the allocator's.
const RESERVE_FILES: usize = MAX_OPEN_ROW_FILES + 32;

/// Files a run holds open through phase 2 when it has a folder: its lock and its event file.
const FILES_PER_RUN: usize = 2;

/// `finetune`'s runs (one stack key) in stacks that fit this process: each stack's estimated
/// memory ([`run_bytes`]) within `budget` bytes (default: what [`crate::limits::Available`] says
/// is left once the backbone and a reserve are had), and its open files within the room
/// `RLIMIT_NOFILE` leaves. Indices into `jobs`, each stack in seed order. A run that does not
/// fit alone is refused in one line, before any work.
pub fn fitting(jobs: &[FinetuneJob], budget: Option<f64>) -> Result<Vec<Vec<usize>>> {
    let Some(first) = jobs.first() else {
        return Ok(Vec::new());
    };
    let models_dir = first.places.models_dir.as_deref();
    let dims = backbone_dims(&first.config, models_dir);
    let budget = match budget {
        Some(bytes) => bytes,
        None => {
            let available = crate::limits::Available::now();
            let backbone = backbone_bytes(&first.config, models_dir);
            let left = available.bytes - backbone - RESERVE_BYTES;
            let one = run_bytes(&first.config, dims, test_len(&first.config), (true, true));
            if left < one {
                bail!(
                    "one run of --n {} needs about {:.2} GiB beyond its backbone ({:.2} GiB) and a \
                     reserve of {:.1} GiB, more than the {:.2} GiB available ({}); lower --n or \
                     --test-n",
                    first.config.n,
                    one / GIB,
                    backbone / GIB,
                    RESERVE_BYTES / GIB,
                    available.bytes / GIB,
                    available.source
                );
            }
            left
        }
    };
    let per_stack = match (first.out.is_some(), crate::limits::open_files_room()) {
        (true, Some(room)) => {
            let runs = room.saturating_sub(RESERVE_FILES) / FILES_PER_RUN;
            if runs == 0 {
                bail!(
                    "only {room} more files may be opened (ulimit -n), and a run with --out \
                     holds {FILES_PER_RUN} beside the {RESERVE_FILES} kept aside; raise ulimit -n"
                );
            }
            runs
        }
        _ => usize::MAX,
    };
    let pending: Vec<(String, FinetuneJob)> = jobs
        .iter()
        .enumerate()
        .map(|(k, job)| (k.to_string(), job.clone()))
        .collect();
    // Each run goes in by its index's name; the stacks hand the names back.
    let planned = stacks(pending, budget, 1, &|_| dims, &test_len);
    Ok(planned
        .iter()
        .flat_map(|stack| {
            let indices: Vec<usize> = stack.iter().filter_map(|(id, _)| id.parse().ok()).collect();
            indices
                .chunks(per_stack)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect())
}

const GIB: f64 = (1u64 << 30) as f64;

/// Test samples a run scores, as far as its config says; where it takes the whole split, as
/// many as the resident test set may hold (the estimate's cap).
fn test_len(config: &RunConfig) -> usize {
    config.test_n.unwrap_or(usize::MAX / 2)
}

/// The backbone's weights in memory: twice its weights file (as read, and as the model's
/// tensors) where the file is on this machine, else 1 GiB.
fn backbone_bytes(config: &RunConfig, models_dir: Option<&Path>) -> f64 {
    config
        .backbones
        .iter()
        .find_map(|id| crate::encoder::hub::local_files(id, models_dir))
        .and_then(|files| std::fs::metadata(files.weights).ok())
        .map_or(GIB, |meta| 2.0 * meta.len() as f64)
}

/// Tokens per sample and width of the backbone a run would load, from its config.json when the
/// backbone is on this machine; else the paper's sizes (ViT-B/16: 197 × 768; BERT-base: 128 ×
/// 768), which errs on the large side for the offline backbones.
pub fn backbone_dims(config: &RunConfig, models_dir: Option<&Path>) -> (usize, usize) {
    let text = config.dataset.modality() == Modality::Text;
    let paper = if text { (128, 768) } else { (197, 768) };
    let Some(files) = config
        .backbones
        .iter()
        .find_map(|id| crate::encoder::hub::local_files(id, models_dir))
    else {
        return paper;
    };
    let Ok(json) = crate::io::read_input_text(&files.config, crate::io::limits::SMALL_TEXT) else {
        return paper;
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&json) else {
        return paper;
    };
    let field = |name: &str| {
        value
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .map(|v| v as usize)
    };
    let hidden = field("hidden_size").unwrap_or(paper.1);
    let tokens = match (text, field("image_size"), field("patch_size")) {
        (false, Some(image), Some(patch)) if patch > 0 => (image / patch).pow(2) + 1,
        _ => paper.0,
    };
    (tokens, hidden)
}

/// What one run adds to a stack's memory, in bytes: its own parameters and optimizer state, and
/// its sets' tokens unless a run already in the stack reads the same ones.
fn run_bytes(
    config: &RunConfig,
    (tokens, hidden): (usize, usize),
    test_len: usize,
    (new_finetune, new_test): (bool, bool),
) -> f64 {
    let f = size_of::<f32>() as f64;
    let (t, d) = (tokens as f64, hidden as f64);
    let mut bytes = 5.0 * 2.0 * d * d * f;
    if new_finetune {
        bytes += 2.0 * config.n as f64 * t * d * f;
    }
    if new_test {
        bytes += (test_len as f64 * t * d * f).min(RESIDENT_TEST_BYTES as f64);
    }
    bytes
}

/// Whether two runs read the same fine-tune and test samples: the same seed (the split's), the
/// rest of their keys being equal.
fn same_samples(a: &RunConfig, b: &RunConfig) -> (bool, bool) {
    let same = a.seed == b.seed;
    // Without a test subsample every run scores the whole test split.
    (same, same || (a.test_n.is_none() && b.test_n.is_none()))
}

/// The runs `pending` (each with its id) in stacks: runs of equal stack keys together, at most
/// `budget` bytes of estimated memory each, and split further into as many stacks as there are
/// `workers` when fewer would leave a worker idle. Within a stack the runs keep the grid's order
/// by seed, so that η-siblings stay together. `dims` and `test_len` give each run's backbone size
/// and test set length.
pub fn stacks(
    pending: Vec<(String, FinetuneJob)>,
    budget: f64,
    workers: usize,
    dims: &dyn Fn(&RunConfig) -> (usize, usize),
    test_len: &dyn Fn(&RunConfig) -> usize,
) -> Vec<Vec<(String, FinetuneJob)>> {
    let mut groups: Vec<Vec<(String, FinetuneJob)>> = Vec::new();
    for run in pending {
        let key = (run.1.config.stack_key(), run.1.checkpoint_every);
        match groups
            .iter_mut()
            .find(|g| (g[0].1.config.stack_key(), g[0].1.checkpoint_every) == key)
        {
            Some(group) => group.push(run),
            None => groups.push(vec![run]),
        }
    }
    let mut by_budget = Vec::new();
    for mut group in groups {
        group.sort_by_key(|(_, job)| job.config.seed);
        let mut stack: Vec<(String, FinetuneJob)> = Vec::new();
        let mut bytes = 0.0;
        for run in group {
            let config = &run.1.config;
            let shared = stack.iter().fold((false, false), |seen, (_, other)| {
                let same = same_samples(config, &other.config);
                (seen.0 || same.0, seen.1 || same.1)
            });
            let adds = run_bytes(
                config,
                dims(config),
                test_len(config),
                (!shared.0, !shared.1),
            );
            if !stack.is_empty() && bytes + adds > budget {
                by_budget.push(std::mem::take(&mut stack));
                bytes = run_bytes(config, dims(config), test_len(config), (true, true));
            } else {
                bytes += adds;
            }
            stack.push(run);
        }
        if !stack.is_empty() {
            by_budget.push(stack);
        }
    }
    spread_over(by_budget, workers)
}

/// The largest stacks split in halves until there are `workers` stacks (or every stack is one
/// run), so that no worker waits while another trains a stack that two could share.
fn spread_over(
    mut stacks: Vec<Vec<(String, FinetuneJob)>>,
    workers: usize,
) -> Vec<Vec<(String, FinetuneJob)>> {
    while stacks.len() < workers {
        let Some((largest, _)) = stacks
            .iter()
            .enumerate()
            .filter(|(_, s)| s.len() > 1)
            .max_by_key(|(_, s)| s.len())
        else {
            break;
        };
        let mut first = stacks.remove(largest);
        let second = first.split_off(first.len().div_ceil(2));
        stacks.insert(largest, second);
        stacks.insert(largest, first);
    }
    stacks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DatasetName;
    use crate::train::run::Places;

    fn job(eta: f64, seed: u64, n: usize) -> (String, FinetuneJob) {
        let config = RunConfig {
            eta,
            seed,
            n,
            ..RunConfig::paper(&DatasetName::Trec).unwrap()
        };
        let id = config.run_name().unwrap();
        let job = FinetuneJob {
            sample_threads: 1,
            ..FinetuneJob::new(config, Places::default())
        };
        (id, job)
    }

    fn shape(stacks: &[Vec<(String, FinetuneJob)>]) -> Vec<Vec<(u64, f64, usize)>> {
        stacks
            .iter()
            .map(|s| {
                s.iter()
                    .map(|(_, j)| (j.config.seed, j.config.eta, j.config.n))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn runs_that_differ_in_eta_and_seed_stack_apart_from_other_sizes() {
        let mut pending = Vec::new();
        for n in [20, 200] {
            for seed in [42, 7] {
                for eta in [0.0, 0.2] {
                    pending.push(job(eta, seed, n));
                }
            }
        }
        let dims = |_: &RunConfig| (128, 384);
        let stacks = stacks(pending, 1e12, 1, &dims, &|_| 500);
        assert_eq!(
            shape(&stacks),
            vec![
                vec![(7, 0.0, 20), (7, 0.2, 20), (42, 0.0, 20), (42, 0.2, 20)],
                vec![(7, 0.0, 200), (7, 0.2, 200), (42, 0.0, 200), (42, 0.2, 200)],
            ]
        );
    }

    #[test]
    fn the_budget_caps_a_stack_and_idle_workers_split_one() {
        let pending: Vec<_> = (0..4).map(|k| job(0.1 * k as f64, 42, 200)).collect();
        let dims = |_: &RunConfig| (128, 384);
        let one = run_bytes(&pending[0].1.config, (128, 384), 500, (true, true));
        let sibling = run_bytes(&pending[0].1.config, (128, 384), 500, (false, false));
        // Room for the first run and one sibling only.
        let capped = stacks(pending.clone(), one + sibling * 1.5, 1, &dims, &|_| 500);
        assert_eq!(capped.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2]);
        let spread = stacks(pending, 1e12, 3, &dims, &|_| 500);
        assert_eq!(spread.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 1]);
    }
}
