//! How the host pass shares its rows out over the threads: the one choice that differs between
//! a layer whose frozen weights fit the caches and one whose weights do not.

/// How the host pass shares a step's or an evaluation's rows out over the threads. Both give
/// every row the same numbers, bit for bit (tests/last_layer_equivalence.rs), on any number of
/// threads; they differ in what each thread reads from memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostSpread {
    /// Parts of rows ([`super::forward::CHUNK`] of each run for a step, [`super::forward::EVAL_CHUNK`] for an evaluation), each
    /// on one thread from its forward to its backward: a part's tokens stay in that core's
    /// caches in between, and each thread reads every frozen weight for its rows. Best while the
    /// weights fit the caches (ViT-Ti: 3 MB with their transposes).
    Chunks,
    /// All rows through each operation together, its work shared out: the frozen products by
    /// their columns (each thread reads its part of the weights once for all the rows,
    /// [`crate::kernels::products_parallel`]), the attention by samples, the per-head rₕ by
    /// groups of [`super::forward::QUERY_ROWS`]. At ViT-B's width the frozen weights (47 MB with their
    /// transposes) fit no cache, and in parts each thread would stream them all from memory for
    /// its few rows.
    Operations,
}

impl HostSpread {
    /// The spread for a layer whose frozen products hold `weight_bytes` (forward and transposed
    /// packs): parts while they are well inside a last-level cache.
    pub(super) fn for_weights(weight_bytes: usize) -> Self {
        const CACHED: usize = 16 << 20;
        if weight_bytes <= CACHED {
            Self::Chunks
        } else {
            Self::Operations
        }
    }

    /// Rows of each run a part holds when each run has at most `rows` and parts of `chunk` rows
    /// are the chunked spread's size.
    pub(super) fn part_rows(self, chunk: usize, rows: usize) -> usize {
        match self {
            Self::Chunks => chunk,
            Self::Operations => rows.max(1),
        }
    }

    /// The fewest items a parallel loop inside an operation hands one thread: all of them in
    /// parts (the parts are what run in parallel), one otherwise.
    pub(super) fn min_len(self) -> usize {
        match self {
            Self::Chunks => usize::MAX,
            Self::Operations => 1,
        }
    }
}
