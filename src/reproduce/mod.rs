//! `reproduce`: the paper's real-data grids (Table 2, Fig. 8, Fig. 9) as independent `finetune`
//! runs, then one report. Each run is a folder `<out>/runs/<id>`; a run whose summary.json exists
//! is skipped, a killed one resumes from its checkpoint, and a failed one is reported at the end
//! without stopping the others. The feature cache is filled once for the whole grid first, so each
//! sample passes through its backbone once whatever the grid. `--shard K/N` keeps every N-th run
//! for a cluster's job array (`slurm` writes the script); `report` merges shard folders.

pub mod dose_check;
pub mod grid_file;
pub mod grid_record;
pub mod reference_map;
pub mod slurm;
pub mod snr_backfill;

mod driver;

pub use driver::*;
